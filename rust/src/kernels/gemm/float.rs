//! Float-weight (F32, F16, BF16) matmul for many activation rows, in llamafile tinyBLAS's order.
//!
//! ggml hands MUL_MAT with float weights and N >= 2 to tinyBLAS, where every output keeps one
//! 8-lane FMA accumulator over K (the last step zero-padded) and ends with `hsum`. Products of
//! f16/bf16 values are exact in f32, so where the conversion to f32 happens does not change a
//! bit: the activations are widened once per call (zero-padded to a multiple of 8) and shared
//! by the threads, each weight panel once per call ([`super::float_blocked`]), and AVX2 or
//! AVX-512 tiles of FMAs run over them. The portable build does the same FMAs in the same
//! order, one output at a time.

use super::float_tiles::rows;
pub use super::widened::{widen_activations, widen_rows};
#[cfg(target_arch = "x86_64")]
use super::{float_avx2 as avx2, float_avx512 as avx512};
#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::avx512_vnni_active;
use crate::kernels::cpu::simd_active;
use crate::kernels::formats::ActFormat;
#[cfg(test)]
use crate::kernels::operand::Converted;
use crate::kernels::operand::{DirectFn, RowsFn};

/// The float weight types this kernel serves (ggml type ids F32, F16, BF16).
pub fn serves(type_id: u32) -> bool {
    matches!(type_id, 0 | 1 | 30)
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
    if simd_active() {
        return if avx512_vnni_active() {
            avx512::rows_fn(type_id)
        } else {
            avx2::rows_fn(type_id)
        };
    }
    portable_rows_fn(type_id)
}

/// The portable build's rows function of a float type.
fn portable_rows_fn(type_id: u32) -> RowsFn {
    match weight_format(type_id) {
        ActFormat::F16 => |job| rows(ActFormat::F16, job),
        ActFormat::BF16 => |job| rows(ActFormat::BF16, job),
        _ => |job| rows(ActFormat::F32, job),
    }
}

/// The rows function that writes straight into the `[n][m]` output, where this type and row
/// count have one ([`DirectFn`]): every SIMD build.
pub(crate) fn direct_fn(type_id: u32, n: usize) -> Option<DirectFn> {
    #[cfg(target_arch = "x86_64")]
    if simd_active() {
        if avx512_vnni_active() {
            if let Some(f) = avx512::direct_fn(type_id, n) {
                return Some(f);
            }
        }
        return Some(avx2::direct_fn(type_id));
    }
    let _ = (type_id, n);
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::operand::RowsJob;
    use crate::kernels::test_util::{float_case, float_cases};

    /// Every build on this CPU: portable, then AVX2 and AVX-512 where present.
    fn builds(t: u32) -> Vec<RowsFn> {
        let mut builds: Vec<RowsFn> = vec![portable_rows_fn(t)];
        #[cfg(target_arch = "x86_64")]
        if simd_active() {
            builds.push(avx2::rows_fn(t));
            if avx512_vnni_active() {
                builds.push(avx512::rows_fn(t));
            }
        }
        builds
    }

    fn check(t: u32, (m, k, n): (usize, usize, usize), w: &[u8], act: &Converted, want: &[f32]) {
        let fmt = weight_format(t);
        let wide = widen_activations(act, fmt, k);
        let row = k * fmt.block_bytes();
        for (b, f) in builds(t).into_iter().enumerate() {
            let mut got = vec![0.0f32; m * n]; // [row][col]
            f(RowsJob::new(w, row, 0, k, &wide, &mut got, true));
            for (o, want) in want.iter().enumerate() {
                let (r, i) = (o / m, o % m);
                let same = got[i * n + r].to_bits() == want.to_bits();
                assert!(same, "type {t} m {m} k {k} n {n} build {b} at {r},{i}");
            }
        }
        if let Some(direct) = direct_fn(t, n) {
            let mut got = vec![0.0f32; m * n]; // [col][row], in two shares
            let half = m / 2;
            for (first, rows) in [(0, half), (half, m - half)] {
                // SAFETY: each share writes its own columns of the n × m output.
                unsafe { direct(w, row, first, rows, k, &wide, got.as_mut_ptr(), m) };
            }
            for (o, want) in want.iter().enumerate() {
                let same = got[o].to_bits() == want.to_bits();
                assert!(same, "type {t} m {m} k {k} n {n} direct at {o}");
            }
        }
    }

    /// Every output equals the one-pair tinyBLAS-order dot, on every build, for ragged shapes.
    #[test]
    fn tiles_equal_the_pairwise_tinyblas_order() {
        for (t, shape, w, _, act, want) in float_cases() {
            check(t, shape, &w, &act, &want);
        }
    }

    /// The same where K takes several slices and the rows several panels (accumulators
    /// continued across slices; the last tile of a panel ragged).
    #[test]
    fn sliced_tiles_equal_the_pairwise_tinyblas_order() {
        for t in [0u32, 1, 30] {
            for shape in [(70, 2056, 300), (200, 1100, 33), (20, 603, 17)] {
                let (m, k, n) = shape;
                let (w, _, act, want) = float_case(t, m, k, n);
                check(t, shape, &w, &act, &want);
            }
        }
    }
}
