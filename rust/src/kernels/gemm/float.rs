//! Float-weight (F32, F16, BF16) matmul for many activation rows, in llamafile tinyBLAS's order.
//!
//! ggml hands MUL_MAT with float weights and N >= 2 to tinyBLAS, where every output keeps one
//! 8-lane FMA accumulator over K (the last step zero-padded) and ends with `hsum`. Products of
//! f16/bf16 values are exact in f32, so where the conversion to f32 happens does not change a
//! bit: weight tiles are widened once into an f32 panel (zero-padded to a multiple of 8), the
//! activations once per call, and a 4 × 3 tile of FMAs runs over them. Only under the AVX-512
//! f16 tiles do f16 activations stay f16 (those tiles widen into their own scratch, and below
//! their row minimum a 3 × 3 AVX2 tile converts both operands in registers, as tinyBLAS does).
//! The portable build does the same FMAs in the same order, one output at a time.

#[cfg(target_arch = "x86_64")]
use super::float_avx512 as avx512;
#[cfg(target_arch = "x86_64")]
use super::float_tiles::unsafe_rows_avx2;
use super::float_tiles::{element, rows};
use crate::kernels::cpu::{avx512_vnni_active, simd_active};
use crate::kernels::formats::ActFormat;
use crate::kernels::operand::{convert_rows, Converted, DirectFn, RowsFn};

/// The float weight types this kernel serves (ggml type ids F32, F16, BF16).
pub fn serves(type_id: u32) -> bool {
    matches!(type_id, 0 | 1 | 30)
}

/// The activations of `act` (converted to the weight type's vec_dot type: f32, f16 or bf16)
/// widened to f32 rows of `k` rounded up to 8, zero-padded: a [`Converted`] of format F32.
pub fn widen_activations(act: &Converted, fmt: ActFormat, k: usize) -> Converted {
    let kp = k.next_multiple_of(8);
    let width = act_width(fmt);
    let mut data = vec![0u8; act.rows * kp * width];
    for r in 0..act.rows {
        let src = &act.data[r * act.row_bytes..(r + 1) * act.row_bytes];
        let dst = &mut data[r * kp * width..(r * kp + k) * width];
        if width == 2 {
            dst.copy_from_slice(&src[..k * 2]);
        } else {
            widen_act_row(fmt, src, dst);
        }
    }
    Converted {
        data,
        row_bytes: kp * width,
        rows: act.rows,
    }
}

/// Bytes per activation value in the rows this kernel reads: f16 activations stay f16 only
/// for the AVX-512 f16 tiles; everywhere else every format is widened to f32 once per call.
/// Converting in the tile (`vcvtph2ps` on both operands at every step) cost half the FMA rate
/// on an AVX2-only Zen 3 VM, where one 8-lane conversion takes ~6 cycles: one thread,
/// 2816 × 1024 × 256, 15.2 GFLOP/s converting in registers, 29.6 from widened rows.
fn act_width(fmt: ActFormat) -> usize {
    if fmt == ActFormat::F16 && f16_stays_half() {
        2
    } else {
        4
    }
}

/// Whether f16 activations reach the rows function as f16: only the AVX-512 f16 tiles take
/// them so (see [`rows_fn`]).
fn f16_stays_half() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd_active() && avx512_vnni_active()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`widen_activations`] of the conversion of float32 rows `x`, without the converted
/// intermediate: each row converted and widened in turn, the rows split over up to `threads`.
pub fn widen_rows(fmt: ActFormat, x: &[f32], k: usize, threads: usize) -> Converted {
    let kp = k.next_multiple_of(8);
    let width = act_width(fmt);
    let (data, rows) = convert_rows(x, k, kp * width, threads, |xs, out| {
        let mut tmp = vec![0u8; fmt.row_bytes(k)];
        for (xr, dst) in xs.chunks_exact(k).zip(out.chunks_exact_mut(kp * width)) {
            if width == 2 {
                fmt.convert_row(xr, &mut dst[..k * 2]);
            } else {
                fmt.convert_row(xr, &mut tmp);
                widen_act_row(fmt, &tmp, &mut dst[..k * 4]);
            }
        }
    });
    Converted {
        data,
        row_bytes: kp * width,
        rows,
    }
}

/// One converted row (bf16 or f32 bytes) widened to float32 bytes `dst` (exact); f16 rows
/// are never widened (see `act_width`).
fn widen_act_row(fmt: ActFormat, src: &[u8], dst: &mut [u8]) {
    for (i, d) in dst.chunks_exact_mut(4).enumerate() {
        d.copy_from_slice(&element(fmt, src, i).to_le_bytes());
    }
}

fn weight_format(type_id: u32) -> ActFormat {
    match type_id {
        1 => ActFormat::F16,
        30 => ActFormat::BF16,
        _ => ActFormat::F32,
    }
}

/// The per-thread rows function for [`crate::kernels::matmul`]'s thread split: `act` must come from
/// [`widen_activations`].
pub fn rows_fn(type_id: u32) -> RowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if simd_active() {
            if type_id == 1 && avx512_vnni_active() {
                return avx512::rows_f16_entry;
            }
            return match type_id {
                1 => |job| unsafe_rows_avx2(ActFormat::F16, job),
                30 => |job| unsafe_rows_avx2(ActFormat::BF16, job),
                _ => |job| unsafe_rows_avx2(ActFormat::F32, job),
            };
        }
    }
    portable_rows_fn(type_id)
}

/// The portable build's rows function of a float type.
fn portable_rows_fn(type_id: u32) -> RowsFn {
    match weight_format(type_id) {
        ActFormat::F16 => |job| rows::<false>(ActFormat::F16, job),
        ActFormat::BF16 => |job| rows::<false>(ActFormat::BF16, job),
        _ => |job| rows::<false>(ActFormat::F32, job),
    }
}

/// The rows function that writes straight into the `[n][m]` output, where this type and row
/// count have one ([`DirectFn`]).
pub(crate) fn direct_fn(type_id: u32, n: usize) -> Option<DirectFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if type_id == 1 && n >= avx512::MIN_ROWS && avx512_vnni_active() {
            return Some(avx512::rows_f16_direct);
        }
    }
    let _ = (type_id, n);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::operand::RowsJob;
    use crate::kernels::test_util::float_cases;

    /// Every output equals the one-pair tinyBLAS-order dot, on both builds, for ragged shapes.
    #[test]
    fn tiles_equal_the_pairwise_tinyblas_order() {
        for (t, (m, k, n), w, _, act, want) in float_cases() {
            let fmt = weight_format(t);
            let wide = widen_activations(&act, fmt, k);
            let mut builds: Vec<RowsFn> = vec![portable_rows_fn(t)];
            if simd_active() {
                builds.push(match t {
                    1 => |job| unsafe_rows_avx2(ActFormat::F16, job),
                    30 => |job| unsafe_rows_avx2(ActFormat::BF16, job),
                    _ => |job| unsafe_rows_avx2(ActFormat::F32, job),
                });
                builds.push(rows_fn(t)); // the best build on this CPU (AVX-512 for f16)
            }
            let row = k * fmt.block_bytes();
            for (b, f) in builds.into_iter().enumerate() {
                let mut got = vec![0.0f32; m * n]; // [row][col]
                f(RowsJob::new(&w, row, 0, k, &wide, &mut got, true));
                for (o, want) in want.iter().enumerate() {
                    let (r, i) = (o / m, o % m);
                    let same = got[i * n + r].to_bits() == want.to_bits();
                    assert!(same, "type {t} m {m} k {k} n {n} build {b} at {r},{i}");
                }
            }
        }
    }
}
