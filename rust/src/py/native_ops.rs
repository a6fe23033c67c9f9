//! Prepared native graph steps for Python: a builder checks one node's operands against their
//! buffers once (at plan time) and returns a [`NativeStep`]; calling it, or handing a run of
//! them to [`run_steps`], does only the arithmetic, detached from the interpreter.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::kernels::cpu;
use crate::kernels::elementwise::ElementMap;
use crate::kernels::flash_attn::params::FlashAttn;
use crate::kernels::formats::type_info;
use crate::kernels::matmul::experts::MulMatId;
use crate::kernels::matmul::step::MulMat;
use crate::kernels::operand::Operand;
use crate::kernels::routing::Routing;
use crate::kernels::rowops::{BinOp, Elem, Rope, RowOp};

/// A tensor as Python passes it: (uint8 buffer, byte offset of element 0, ne, nb).
pub(super) type TensorArg<'py> = (Bound<'py, PyAny>, usize, [usize; 4], [usize; 4]);

pub(super) enum Kernel {
    FlashAttn(Box<FlashAttn>),
    Map(Box<ElementMap>),
    MulMat(Box<MulMat>),
    MulMatId(Box<MulMatId>),
    Routing(Box<Routing>),
    Row(Box<RowOp>),
}

/// One compiled node. Holds the buffer exports, so its memory outlives the step.
#[pyclass(frozen, module = "rpcnet._native")]
pub struct NativeStep {
    pub(super) kernel: Kernel,
    pub(super) threads: usize,
    pub(super) _keep: Vec<PyBuffer<u8>>,
}

// SAFETY: the raw pointers in `kernel` point into the held exports; a step is only run by one
// thread at a time (the device worker), and its threads write disjoint output rows.
unsafe impl Send for NativeStep {}
unsafe impl Sync for NativeStep {}

impl NativeStep {
    /// A step running `kernel` on `threads` threads (at least one), holding `ops`' exports.
    pub(super) fn new(kernel: Kernel, threads: usize, ops: Operands) -> Self {
        Self {
            kernel,
            threads: threads.max(1),
            _keep: ops.keep,
        }
    }

    /// False when a row index in the data was out of range.
    fn run(&self) -> bool {
        // SAFETY: operands were checked against their buffers when the step was built, and
        // the exports in `_keep` keep that memory alive.
        unsafe {
            match &self.kernel {
                Kernel::FlashAttn(fa) => {
                    fa.run(self.threads);
                    true
                }
                Kernel::Map(map) => {
                    map.run(self.threads);
                    true
                }
                Kernel::MulMat(mm) => {
                    mm.run(self.threads);
                    true
                }
                Kernel::MulMatId(mm) => mm.run(self.threads),
                Kernel::Routing(op) => {
                    op.run(self.threads);
                    true
                }
                Kernel::Row(op) => op.run(self.threads),
            }
        }
    }
}

fn bad_index() -> PyErr {
    PyValueError::new_err("row or expert index out of range")
}

#[pymethods]
impl NativeStep {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        if py.detach(|| self.run()) {
            Ok(())
        } else {
            Err(bad_index())
        }
    }
}

/// Run consecutive native steps in one detached call (stops at a step whose row indices are
/// out of range).
#[pyfunction]
pub fn run_steps(py: Python<'_>, steps: Vec<Py<NativeStep>>) -> PyResult<()> {
    let steps: Vec<&NativeStep> = steps.iter().map(|s| s.get()).collect();
    if py.detach(|| steps.iter().all(|s| s.run())) {
        Ok(())
    } else {
        Err(bad_index())
    }
}

impl NativeStep {
    /// The product when this step is a decode-shaped MUL_MAT (see [`MulMat::single_row`]).
    fn single_row_mul_mat(&self) -> Option<&MulMat> {
        match &self.kernel {
            Kernel::MulMat(mm) if mm.single_row() => Some(mm),
            _ => None,
        }
    }
}

/// Whether steps `a` and `b` are decode-shaped MUL_MATs of the same layout whose weight
/// matrices hold the same bytes now (compared with the interpreter detached).
#[pyfunction]
pub fn same_weights(py: Python<'_>, a: Py<NativeStep>, b: Py<NativeStep>) -> bool {
    let (Some(x), Some(y)) = (a.get().single_row_mul_mat(), b.get().single_row_mul_mat()) else {
        return false;
    };
    if !x.same_layout(y) {
        return false;
    }
    // SAFETY: both steps hold exports of their buffers, checked at build
    py.detach(|| unsafe { x.weight_bytes() == y.weight_bytes() })
}

/// Run several plans' native steps (lists of equal length, from different clients) together:
/// step `i` of each plan after step `i - 1` of it, and at each index in `joint` the plans'
/// MUL_MATs as one product (`matmul::step::run_joint`). The caller vouches, via
/// [`same_weights`] on data no step writes, that the weights at those indices are equal.
/// Returns per plan whether it ran to the end (a plan stops at a step with an out-of-range row
/// index, the others go on).
#[pyfunction]
pub fn run_joint(
    py: Python<'_>,
    plans: Vec<Vec<Py<NativeStep>>>,
    joint: Vec<usize>,
) -> PyResult<Vec<bool>> {
    let len = plans.first().map_or(0, Vec::len);
    if plans.iter().any(|p| p.len() != len) {
        return Err(PyValueError::new_err("run_joint: plans differ in length"));
    }
    let plans: Vec<Vec<&NativeStep>> = plans
        .iter()
        .map(|p| p.iter().map(|s| s.get()).collect())
        .collect();
    let mut at_joint = vec![false; len];
    for i in joint {
        if i >= len {
            return Err(PyValueError::new_err("run_joint: joint index out of range"));
        }
        at_joint[i] = true;
    }
    Ok(py.detach(|| {
        let mut ok = vec![true; plans.len()];
        for i in 0..len {
            if at_joint[i] && joint_step(&plans, &ok, i) {
                continue;
            }
            for (c, plan) in plans.iter().enumerate() {
                if ok[c] && !plan[i].run() {
                    ok[c] = false;
                }
            }
        }
        ok
    }))
}

/// Step `i` of the live plans as one product; false (nothing run) unless every one is a
/// single-row MUL_MAT of the first one's layout.
fn joint_step(plans: &[Vec<&NativeStep>], ok: &[bool], i: usize) -> bool {
    let live: Vec<&NativeStep> = plans
        .iter()
        .zip(ok)
        .filter(|(_, ok)| **ok)
        .map(|(p, _)| p[i])
        .collect();
    let mms: Option<Vec<&MulMat>> = live.iter().map(|s| s.single_row_mul_mat()).collect();
    let Some(mms) = mms else { return false };
    let Some(first) = mms.first() else {
        return true;
    };
    if !mms.iter().all(|mm| mm.same_layout(first)) {
        return false;
    }
    // SAFETY: each step's operands were checked at build and are held by it; the caller of
    // run_joint vouched for the weights being equal
    unsafe { crate::kernels::matmul::step::run_joint(&mms, live[0].threads) };
    true
}

/// Park the kernel pool's spinning workers now (a plan is done; see `pool::rest`).
#[pyfunction]
pub fn pool_rest() {
    crate::kernels::pool::rest();
}

fn elem_of(type_id: u32, what: &str) -> PyResult<Elem> {
    match type_id {
        0 => Ok(Elem::F32),
        1 => Ok(Elem::F16),
        _ => Err(PyValueError::new_err(format!(
            "{what}: type {type_id} is not f32/f16"
        ))),
    }
}

fn same_ne(a: &Operand, b: &Operand, what: &str) -> PyResult<()> {
    if a.ne != b.ne {
        return Err(PyValueError::new_err(format!(
            "{what}: shapes differ ({:?} vs {:?})",
            a.ne, b.ne
        )));
    }
    Ok(())
}

fn row_step(op: RowOp, threads: usize, ops: Operands) -> NativeStep {
    NativeStep::new(Kernel::Row(Box::new(op)), threads, ops)
}

/// RMS_NORM of f32 rows into f32 rows of the same shape.
#[pyfunction]
#[pyo3(signature = (x, out, eps, threads = 1))]
pub fn rms_norm_step(
    x: TensorArg<'_>,
    out: TensorArg<'_>,
    eps: f32,
    threads: usize,
) -> PyResult<NativeStep> {
    let (ops, x, out) = Operands::f32_in_out(&x, &out)?;
    same_ne(&x, &out, "rms_norm")?;
    Ok(row_step(RowOp::RmsNorm { x, out, eps }, threads, ops))
}

/// ROPE (normal / neox) of f32 rows; `params` = (n_dims, mode, n_ctx_orig, n_offs, freq_base,
/// freq_scale, ext_factor, attn_factor, beta_fast, beta_slow).
#[pyfunction]
#[pyo3(signature = (x, pos, freq_factors, out, params, threads = 1))]
pub fn rope_step(
    x: TensorArg<'_>,
    pos: TensorArg<'_>,
    freq_factors: Option<TensorArg<'_>>,
    out: TensorArg<'_>,
    params: (usize, i32, i32, usize, f32, f32, f32, f32, f32, f32),
    threads: usize,
) -> PyResult<NativeStep> {
    let (n_dims, mode, n_ctx_orig, n_offs, base, fscale, ext, attn, bfast, bslow) = params;
    let mut ops = Operands::new();
    let x = ops.take(&x, 4, false, "x")?;
    let pos = ops.take(&pos, 4, false, "pos")?;
    let ff = freq_factors
        .map(|f| ops.take(&f, 4, false, "freq_factors"))
        .transpose()?;
    let out = ops.take(&out, 4, true, "out")?;
    same_ne(&x, &out, "rope")?;
    if n_offs + n_dims > x.ne[0] {
        return Err(PyValueError::new_err(
            "rope: n_offs + n_dims exceeds the row",
        ));
    }
    if pos.ne[0] < x.ne[2] {
        return Err(PyValueError::new_err("rope: fewer positions than rows"));
    }
    if let Some(f) = &ff {
        if f.ne[0] < n_dims / 2 {
            return Err(PyValueError::new_err("rope: too few freq factors"));
        }
    }
    let rope = Rope::new(
        n_dims, mode, n_ctx_orig, n_offs, base, fscale, ext, attn, bfast, bslow,
    )
    .map_err(|e| PyValueError::new_err(e.reason))?;
    let op = RowOp::Rope {
        x,
        out,
        pos: pos.ptr as *const i32,
        freq_factors: ff.map(|f| f.ptr as *const f32),
        rope: Box::new(rope),
    };
    Ok(row_step(op, threads, ops))
}

/// SWIGLU: `out = silu(x) · g`, all f32 with the same shape (views of split rows allowed).
#[pyfunction]
#[pyo3(signature = (x, g, out, threads = 1))]
pub fn swiglu_step(
    x: TensorArg<'_>,
    g: TensorArg<'_>,
    out: TensorArg<'_>,
    threads: usize,
) -> PyResult<NativeStep> {
    let mut ops = Operands::new();
    let x = ops.take(&x, 4, false, "x")?;
    let g = ops.take(&g, 4, false, "g")?;
    let out = ops.take(&out, 4, true, "out")?;
    same_ne(&x, &out, "swiglu")?;
    same_ne(&g, &out, "swiglu")?;
    Ok(row_step(RowOp::Swiglu { x, g, out }, threads, ops))
}

/// SET_ROWS: f32 rows into an f32/f16 destination at i32/i64 row indices.
#[pyfunction]
#[pyo3(signature = (src, idx, idx_type, dst, dst_type, threads = 1))]
pub fn set_rows_step(
    src: TensorArg<'_>,
    idx: TensorArg<'_>,
    idx_type: u32,
    dst: TensorArg<'_>,
    dst_type: u32,
    threads: usize,
) -> PyResult<NativeStep> {
    let idx_i64 = match idx_type {
        26 => false,
        27 => true,
        _ => {
            return Err(PyValueError::new_err(
                "set_rows: index type must be i32/i64",
            ))
        }
    };
    let dst_elem = elem_of(dst_type, "set_rows dst")?;
    let mut ops = Operands::new();
    let src = ops.take(&src, 4, false, "src")?;
    let idx = ops.take(&idx, if idx_i64 { 8 } else { 4 }, false, "idx")?;
    let dst = ops.take(&dst, dst_elem.size(), true, "dst")?;
    if src.ne[0] != dst.ne[0] || src.ne[2] != dst.ne[2] || src.ne[3] != dst.ne[3] {
        return Err(PyValueError::new_err("set_rows: src and dst rows differ"));
    }
    if idx.ne[0] != src.ne[1] || src.ne[2] % idx.ne[1] != 0 || src.ne[3] % idx.ne[2] != 0 {
        return Err(PyValueError::new_err(
            "set_rows: index shape does not match src",
        ));
    }
    let op = RowOp::SetRows {
        src,
        idx,
        idx_i64,
        dst,
        dst_elem,
    };
    Ok(row_step(op, threads, ops))
}

/// GET_ROWS: f32/f16 rows at i32 indices into f32 rows.
#[pyfunction]
#[pyo3(signature = (src, src_type, idx, out, threads = 1))]
pub fn get_rows_step(
    src: TensorArg<'_>,
    src_type: u32,
    idx: TensorArg<'_>,
    out: TensorArg<'_>,
    threads: usize,
) -> PyResult<NativeStep> {
    let src_elem = elem_of(src_type, "get_rows src")?;
    let mut ops = Operands::new();
    let src = ops.take(&src, src_elem.size(), false, "src")?;
    let idx = ops.take(&idx, 4, false, "idx")?;
    let out = ops.take(&out, 4, true, "out")?;
    let want = [src.ne[0], idx.ne[0], idx.ne[1], idx.ne[2]];
    if out.ne != want || idx.ne[3] != 1 || src.ne[2] != idx.ne[1] || src.ne[3] != idx.ne[2] {
        return Err(PyValueError::new_err("get_rows: shapes do not match"));
    }
    let op = RowOp::GetRows {
        src,
        src_elem,
        idx,
        out,
    };
    Ok(row_step(op, threads, ops))
}

/// CPY / CONT between f32 and f16 tensors of the same shape (any row strides).
#[pyfunction]
#[pyo3(signature = (src, src_type, dst, dst_type, threads = 1))]
pub fn copy_step(
    src: TensorArg<'_>,
    src_type: u32,
    dst: TensorArg<'_>,
    dst_type: u32,
    threads: usize,
) -> PyResult<NativeStep> {
    let src_elem = elem_of(src_type, "copy src")?;
    let dst_elem = elem_of(dst_type, "copy dst")?;
    let mut ops = Operands::new();
    let src = ops.take(&src, src_elem.size(), false, "src")?;
    let dst = ops.take(&dst, dst_elem.size(), true, "dst")?;
    same_ne(&src, &dst, "copy")?;
    let op = RowOp::Copy {
        src,
        src_elem,
        dst,
        dst_elem,
    };
    Ok(row_step(op, threads, ops))
}

/// Use only the portable (non-SIMD) paths of these kernels from now on (tests).
#[pyfunction]
pub fn native_ops_portable(on: bool) {
    cpu::set_portable_only(on);
}

/// Holds exports and turns tensor arguments into checked operands.
pub(super) struct Operands {
    pub(super) keep: Vec<PyBuffer<u8>>,
}

impl Operands {
    pub(super) fn new() -> Self {
        Self { keep: Vec::new() }
    }

    /// The f32 input `x` and f32 output `out` of a row op, checked in that order.
    pub(super) fn f32_in_out(
        x: &TensorArg<'_>,
        out: &TensorArg<'_>,
    ) -> PyResult<(Self, Operand, Operand)> {
        let mut ops = Self::new();
        let x = ops.take(x, 4, false, "x")?;
        let out = ops.take(out, 4, true, "out")?;
        Ok((ops, x, out))
    }

    /// Check that every element of a tensor of `elem`-byte elements (rows contiguous) lies
    /// inside its buffer; `writable` for outputs.
    pub(super) fn take(
        &mut self,
        arg: &TensorArg<'_>,
        elem: usize,
        writable: bool,
        what: &str,
    ) -> PyResult<Operand> {
        let (obj, offset, ne, nb) = arg;
        let buf = PyBuffer::<u8>::get(obj)?;
        let bad = |why: String| Err(PyValueError::new_err(format!("{what}: {why}")));
        if !buf.is_c_contiguous() {
            return bad("buffer must be C-contiguous".into());
        }
        if writable && buf.readonly() {
            return bad("buffer must be writable".into());
        }
        if nb[0] != elem {
            return bad(format!("rows must be contiguous ({}-byte elements)", elem));
        }
        let mut last = *offset;
        for d in 0..4 {
            if ne[d] == 0 {
                return bad("empty tensor".into());
            }
            last = (ne[d] - 1)
                .checked_mul(nb[d])
                .and_then(|x| x.checked_add(last))
                .ok_or_else(|| PyValueError::new_err(format!("{what}: extent overflows")))?;
        }
        let end = last.saturating_add(elem);
        if end > buf.len_bytes() {
            return bad(format!(
                "extent {end} exceeds the buffer ({} bytes)",
                buf.len_bytes()
            ));
        }
        // SAFETY: offset < end <= len, within the export.
        let ptr = unsafe { (buf.buf_ptr() as *const u8).add(*offset) };
        self.keep.push(buf);
        Ok(Operand {
            ptr,
            ne: *ne,
            nb: *nb,
        })
    }
}

/// FLASH_ATTN_EXT with f32 q, f16 k/v (f32 too from 64 query rows), optional f16 mask and
/// f32 sinks into contiguous f32 out.
#[pyfunction]
#[pyo3(signature = (q, k, v, mask, sinks, out, scale, max_bias, softcap, threads = 1, kv_f32 = false))]
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_ext_step(
    q: TensorArg<'_>,
    k: TensorArg<'_>,
    v: TensorArg<'_>,
    mask: Option<TensorArg<'_>>,
    sinks: Option<TensorArg<'_>>,
    out: TensorArg<'_>,
    scale: f32,
    max_bias: f32,
    softcap: f32,
    threads: usize,
    kv_f32: bool,
) -> PyResult<NativeStep> {
    let mut ops = Operands::new();
    let kv_size = if kv_f32 { 4 } else { 2 };
    let q = ops.take(&q, 4, false, "q")?;
    let k = ops.take(&k, kv_size, false, "k")?;
    let v = ops.take(&v, kv_size, false, "v")?;
    let mask = mask.map(|m| ops.take(&m, 2, false, "mask")).transpose()?;
    let sinks = match sinks {
        Some(s) => {
            let op = ops.take(&s, 4, false, "sinks")?;
            if op.ne.iter().product::<usize>() < q.ne[2] {
                return Err(PyValueError::new_err("sinks: fewer values than heads"));
            }
            if op.ne[1] * op.ne[2] * op.ne[3] != 1 {
                return Err(PyValueError::new_err("sinks must be one row"));
            }
            Some(op.ptr as *const f32)
        }
        None => None,
    };
    let o = ops.take(&out, 4, true, "out")?;
    let [dk, n_q, n_head, n3] = q.ne;
    let dv = v.ne[0];
    let expected = [dv, n_head, n_q, n3];
    if o.ne != expected
        || o.nb[1] != dv * 4
        || o.nb[2] != o.nb[1] * n_head
        || o.nb[3] != o.nb[2] * n_q
    {
        return Err(PyValueError::new_err(format!(
            "out must be contiguous f32 {expected:?}, got ne {:?} nb {:?}",
            o.ne, o.nb
        )));
    }
    let _ = dk;
    let fa = FlashAttn {
        q,
        k,
        v,
        mask,
        sinks,
        out: o.ptr as *mut u8,
        out_row: o.nb[1],
        scale,
        max_bias,
        softcap,
        kv_f32,
    };
    fa.check().map_err(|e| PyValueError::new_err(e.reason))?;
    Ok(NativeStep::new(
        Kernel::FlashAttn(Box::new(fa)),
        threads,
        ops,
    ))
}

/// ADD / SUB / MUL / DIV (`op` 0..3) of f32 tensors, `b` repeated over `a` (every dim of `b`
/// divides `a`'s), into `out` shaped like `a`.
#[pyfunction]
#[pyo3(signature = (a, b, out, op, threads = 1))]
pub fn binary_step(
    a: TensorArg<'_>,
    b: TensorArg<'_>,
    out: TensorArg<'_>,
    op: u32,
    threads: usize,
) -> PyResult<NativeStep> {
    let op = match op {
        0 => BinOp::Add,
        1 => BinOp::Sub,
        2 => BinOp::Mul,
        3 => BinOp::Div,
        _ => return Err(PyValueError::new_err(format!("binary op {op} unknown"))),
    };
    let mut ops = Operands::new();
    let a = ops.take(&a, 4, false, "a")?;
    let b = ops.take(&b, 4, false, "b")?;
    let out = ops.take(&out, 4, true, "out")?;
    same_ne(&a, &out, "binary")?;
    if (0..4).any(|d| a.ne[d] % b.ne[d] != 0) {
        return Err(PyValueError::new_err("binary: b does not repeat into a"));
    }
    Ok(row_step(RowOp::Binary { a, b, out, op }, threads, ops))
}

/// SOFT_MAX of f32 rows with an optional f16/f32 mask (rows broadcast over heads by modulo),
/// f32 sinks (one per head), scale and ALiBi max_bias.
#[pyfunction]
#[pyo3(signature = (x, mask, mask_type, sinks, out, scale, max_bias, threads = 1))]
#[allow(clippy::too_many_arguments)]
pub fn soft_max_step(
    x: TensorArg<'_>,
    mask: Option<TensorArg<'_>>,
    mask_type: u32,
    sinks: Option<TensorArg<'_>>,
    out: TensorArg<'_>,
    scale: f32,
    max_bias: f32,
    threads: usize,
) -> PyResult<NativeStep> {
    let mut ops = Operands::new();
    let x = ops.take(&x, 4, false, "x")?;
    let mask = match mask {
        Some(m) => {
            let elem = elem_of(mask_type, "soft_max mask")?;
            let op = ops.take(&m, elem.size(), false, "mask")?;
            if op.ne[0] != x.ne[0] || op.ne[1] < x.ne[1] {
                return Err(PyValueError::new_err(
                    "soft_max: mask smaller than the rows",
                ));
            }
            if x.ne[2] % op.ne[2] != 0 || x.ne[3] % op.ne[3] != 0 {
                return Err(PyValueError::new_err(
                    "soft_max: mask does not repeat into x",
                ));
            }
            Some((op, elem))
        }
        None => None,
    };
    let sinks = match sinks {
        Some(s) => {
            let op = ops.take(&s, 4, false, "sinks")?;
            if op.ne[0] < x.ne[2] || op.ne[1] * op.ne[2] * op.ne[3] != 1 {
                return Err(PyValueError::new_err(
                    "soft_max: sinks must be one value per head",
                ));
            }
            Some(op.ptr as *const f32)
        }
        None => None,
    };
    let out = ops.take(&out, 4, true, "out")?;
    same_ne(&x, &out, "soft_max")?;
    let op = RowOp::SoftMax {
        x,
        out,
        mask,
        sinks,
        scale,
        max_bias,
    };
    Ok(row_step(op, threads, ops))
}

/// MUL_MAT of weights of ggml type `type_id` (`w.ne[0]` in blocks, rows of whole blocks)
/// with f32 activations into f32 `out`, any row strides, src0 broadcast over batches like
/// ggml; `llamafile` as for `matmul_quant`.
#[pyfunction]
#[pyo3(signature = (type_id, w, x, out, threads = 1, llamafile = false))]
pub fn mul_mat_step(
    type_id: u32,
    w: TensorArg<'_>,
    x: TensorArg<'_>,
    out: TensorArg<'_>,
    threads: usize,
    llamafile: bool,
) -> PyResult<NativeStep> {
    let info = type_info(type_id).ok_or_else(|| {
        PyValueError::new_err(format!("mul_mat: weight type {type_id} is not supported"))
    })?;
    let mut ops = Operands::new();
    let w = ops.take(&w, info.block_bytes, false, "w")?;
    let x = ops.take(&x, 4, false, "x")?;
    let o = ops.take(&out, 4, true, "out")?;
    let mm = MulMat {
        type_id,
        w,
        x,
        out: o.ptr as *mut u8,
        out_nb: o.nb,
        llamafile,
    };
    mm.check(o.ne)
        .map_err(|e| PyValueError::new_err(format!("mul_mat: {}", e.reason)))?;
    Ok(NativeStep::new(Kernel::MulMat(Box::new(mm)), threads, ops))
}
