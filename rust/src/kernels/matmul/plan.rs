//! `out[n][m] = Σ_k w[m][k] · x[n][k]` for weights of any supported ggml type in block form and
//! float32 activations, computed like ggml's CPU backend: the activations are converted once
//! per call to the weight type's vec_dot type ([`crate::kernels::act`]), then every (weight row,
//! activation row) pair gives one [`crate::kernels::dot`] result.
//!
//! Weight rows are split over threads. Within a thread, weight rows are taken in tiles of
//! [`rows::TILE_ROWS`] and each tile meets every activation row while it is in cache, so decode
//! (few activation rows) reads each weight byte once and prefill reuses each tile N times.
//!
//! Two builds of the same arithmetic: portable, and one compiled for AVX2+FMA+F16C chosen at
//! run time. Both perform the same float operations in the same order (bit-identical).

use super::run::{run_rows, Layout, RowsPlan};
use crate::kernels::cpu::avx512_vnni_active;
use crate::kernels::dot::{kquant_gemm, kquant_tiles, rows, table};
use crate::kernels::error::KernelError;
use crate::kernels::formats::{type_info, TypeInfo};
use crate::kernels::gemm::{f16_rows, float as gemm_float, q4k_paired, q8 as gemm_q8};
use crate::kernels::operand::{Converted, RowsFn};

/// Checks sizes; returns the weight row bytes.
pub(crate) fn check(
    info: TypeInfo,
    w_len: usize,
    row_stride: usize,
    m: usize,
    k: usize,
    x_len: usize,
    out_len: usize,
) -> Result<usize, KernelError> {
    if k == 0 || !k.is_multiple_of(info.block) || !k.is_multiple_of(info.act.block()) {
        return Err(KernelError::new(format!(
            "K = {k} is not a positive multiple of the block ({})",
            info.block.max(info.act.block())
        )));
    }
    if !x_len.is_multiple_of(k) {
        return Err(KernelError::new(format!(
            "{x_len} activation values are not rows of K = {k}"
        )));
    }
    let row_bytes = k / info.block * info.block_bytes;
    if m > 1 && row_stride < row_bytes {
        return Err(KernelError::new(format!(
            "row stride {row_stride} is shorter than a row ({row_bytes} bytes)"
        )));
    }
    let need = match m {
        0 => 0,
        _ => (m - 1)
            .checked_mul(row_stride)
            .and_then(|v| v.checked_add(row_bytes))
            .ok_or_else(|| KernelError::new("weight extent overflows"))?,
    };
    if w_len < need {
        return Err(KernelError::new(format!(
            "weights hold {w_len} bytes, {m} rows need {need}"
        )));
    }
    let n = x_len / k;
    if out_len != n * m {
        return Err(KernelError::new(format!(
            "output holds {out_len} values, expected {n} × {m}"
        )));
    }
    Ok(row_bytes)
}

/// The plan for `n` activation rows against `m` weight rows of a supported type: float
/// weights in llamafile's order take [`gemm_float`], whose activations must be widened with
/// [`gemm_float::widen_activations`] and which may store straight into the output.
pub(crate) fn rows_for(type_id: u32, m: usize, k: usize, n: usize, llamafile: bool) -> RowsPlan {
    let (f, gemm, layout) = rows_and_layout(type_id, m, k, n, llamafile);
    let direct = match layout {
        Layout::Widened => gemm_float::direct_fn(type_id, n),
        Layout::F16Wide => f16_rows::direct_fn(n),
        _ => None,
    };
    RowsPlan {
        f,
        gemm,
        layout,
        direct,
    }
}

/// [`rows_for`]'s choice of rows function, order and layout.
fn rows_and_layout(
    type_id: u32,
    m: usize,
    k: usize,
    n: usize,
    llamafile: bool,
) -> (RowsFn, bool, Layout) {
    // ggml's MUL_MAT hands N >= 2 to llamafile's tinyBLAS: f32/f16/bf16 when M % 4 == 0, the
    // q8_0-family at any M (only IQ4_NL sums differently there from vec_dot)
    let gemm = match type_id {
        0 | 1 | 30 => llamafile && n >= 2 && m.is_multiple_of(4),
        20 => llamafile && n >= 2,
        // ggml's tiled K-quant kernel ([`kquant_tiles`]) from 8 activation rows on, in
        // MUL_MAT (rows of one batch) and MUL_MAT_ID (rows routed to one expert) alike
        10..=14 | 23 => n >= kquant_tiles::TILED_MIN_ROWS,
        _ => false,
    };
    if gemm && gemm_float::serves(type_id) {
        return (gemm_float::rows_fn(type_id), true, Layout::Widened);
    }
    if gemm_q8::serves(type_id, n) {
        // decided once here: the packing and the tiles must agree; under 4 rows the VNNI
        // tile (4 activation rows) mostly computes padding
        let vnni = n >= 4 && avx512_vnni_active();
        return (gemm_q8::rows_fn(type_id, vnni), gemm, Layout::Q8Tiles(vnni));
    }
    if !gemm && q4k_paired::serves(type_id, n) {
        let f = rows::rows_fn::<q4k_paired::Q4KPaired>();
        return (f, false, Layout::Q4kPaired);
    }
    if !gemm && type_id == 1 && f16_rows::serves_shape(k, n) {
        return (f16_rows::rows, false, Layout::F16Wide);
    }
    let layout = if gemm && kquant_gemm::serves(type_id) {
        Layout::KquantLanes
    } else {
        Layout::Rows
    };
    (
        table::table().rows(type_id).expect("a supported type"),
        gemm,
        layout,
    )
}

#[allow(clippy::too_many_arguments)]
/// Weight rows (ggml type `type_id`, `m` rows `row_stride` bytes apart, `k` values each) times
/// converted activations `act`; `out` is `act.rows × m` row-major. `llamafile`: follow ggml's
/// MUL_MAT dispatch, which sends N >= 2 to llamafile's tinyBLAS (another summation order for
/// f32/f16/bf16 when M % 4 == 0, and for IQ4_NL); false for MUL_MAT_ID (vec_dot). K-quant and
/// IQ4_XS weights take ggml's tiled order from 8 rows on either way (`act.rows` must then be
/// the rows of ONE ggml batch or expert: ggml decides per src1 batch / per expert).
pub fn matmul_converted(
    type_id: u32,
    w: &[u8],
    row_stride: usize,
    m: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
    threads: usize,
    llamafile: bool,
) -> Result<(), KernelError> {
    let (info, row_bytes) = checked(type_id, w, row_stride, m, k, act.rows * k, out.len())?;
    if act.row_bytes != info.act.row_bytes(k) {
        return Err(KernelError::new("activations converted to another format"));
    }
    if m == 0 || act.rows == 0 {
        return Ok(());
    }
    let plan = rows_for(type_id, m, k, act.rows, llamafile);
    let prepared = prepare(plan.layout, act, type_id, info, k);
    let act = prepared.as_ref().unwrap_or(act);
    run_rows(&plan, w, row_stride, m, k, row_bytes, act, threads, out);
    Ok(())
}

/// `act` laid out as `layout`'s rows function reads it; `None` where that is `act` itself.
pub(crate) fn prepare(
    layout: Layout,
    act: &Converted,
    type_id: u32,
    info: TypeInfo,
    k: usize,
) -> Option<Converted> {
    match layout {
        Layout::Rows => None,
        Layout::Widened => Some(gemm_float::widen_activations(act, info.act, k)),
        Layout::KquantLanes => Some(kquant_gemm::pack(act, k)),
        Layout::Q8Tiles(vnni) => Some(gemm_q8::pack(act, type_id, vnni)),
        Layout::Q4kPaired => Some(q4k_paired::pack(act, k)),
        Layout::F16Wide => Some(f16_rows::widen(act, k)),
    }
}

/// The type's info and its row bytes, once the sizes are checked ([`check`]).
fn checked(
    type_id: u32,
    w: &[u8],
    row_stride: usize,
    m: usize,
    k: usize,
    x_len: usize,
    out_len: usize,
) -> Result<(TypeInfo, usize), KernelError> {
    let info = type_info(type_id)
        .ok_or_else(|| KernelError::new(format!("weight type {type_id} is not supported")))?;
    Ok((
        info,
        check(info, w.len(), row_stride, m, k, x_len, out_len)?,
    ))
}

/// The order a matmul sums in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// ggml's MUL_MAT: vec_dot rows, or for N >= 2 its many-row kernels (`llamafile`: with
    /// llamafile's tinyBLAS for the float types and IQ4_NL).
    Ggml { llamafile: bool },
    /// Few activation rows, each computed by the single-row kernels (`dot_simd`, and its two-
    /// and four-row forms that keep each row's bits) over tiles of weight rows that stay in
    /// cache while every row meets them: the weights are read from memory once, and each row's
    /// result has the bits one row alone gets (vec_dot order; never the prefill tiles).
    EachRow,
}

/// [`matmul_converted`] from float32 activations `x` (`n × k` row-major), converted here, in
/// the given order.
#[allow(clippy::too_many_arguments)]
pub fn matmul_quant(
    type_id: u32,
    w: &[u8],
    row_stride: usize,
    m: usize,
    k: usize,
    x: &[f32],
    out: &mut [f32],
    threads: usize,
    order: Order,
) -> Result<(), KernelError> {
    let (info, row_bytes) = checked(type_id, w, row_stride, m, k, x.len(), out.len())?;
    let llamafile = match order {
        Order::Ggml { llamafile } => llamafile,
        Order::EachRow => {
            if m > 0 && !x.is_empty() {
                let (plan, act) = each_row_plan(type_id, info, x, k, threads);
                run_rows(&plan, w, row_stride, m, k, row_bytes, &act, threads, out);
            }
            return Ok(());
        }
    };
    let n = x.len() / k.max(1);
    let plan = rows_for(type_id, m, k, n, llamafile);
    if plan.layout == Layout::Widened && m > 0 && n > 0 {
        // straight to the widened rows tinyBLAS's order runs on
        let wide = gemm_float::widen_rows(info.act, x, k, threads);
        run_rows(&plan, w, row_stride, m, k, row_bytes, &wide, threads, out);
        return Ok(());
    }
    let act = Converted::new_par(info.act, x, k, threads);
    matmul_converted(type_id, w, row_stride, m, k, &act, out, threads, llamafile)
}

/// The rows plan of [`Order::EachRow`] and the activations `x` converted for it.
fn each_row_plan(
    type_id: u32,
    info: TypeInfo,
    x: &[f32],
    k: usize,
    threads: usize,
) -> (RowsPlan, Converted) {
    let act = Converted::new_par(info.act, x, k, threads);
    if type_id == 1 && f16_rows::serves() {
        // f16 rows against widened activations: the single-row product's bits (f16_rows)
        let plan = RowsPlan {
            f: f16_rows::rows,
            gemm: false,
            layout: Layout::F16Wide,
            direct: f16_rows::direct_fn(act.rows),
        };
        return (plan, f16_rows::widen(&act, k));
    }
    let plan = RowsPlan {
        f: table::table().rows(type_id).expect("a supported type"),
        gemm: false,
        layout: Layout::Rows,
        direct: None,
    };
    (plan, act)
}
