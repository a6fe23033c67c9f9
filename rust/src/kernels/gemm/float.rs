//! Float-weight (F32, F16, BF16) matmul for many activation rows, in llamafile tinyBLAS's order.
//!
//! ggml hands MUL_MAT with float weights and N >= 2 to tinyBLAS, where every output keeps one
//! 8-lane FMA accumulator over K (the last step zero-padded) and ends with `hsum`. Products of
//! f16/bf16 values are exact in f32, so where the conversion to f32 happens does not change a
//! bit: the activations are widened once per call (zero-padded to a multiple of 8) and shared
//! by the threads, each weight panel once per call ([`super::float_blocked`]), and AVX2 or
//! AVX-512 tiles of FMAs run over them. The portable build does the same FMAs in the same
//! order, one output at a time.

use super::float_tiles::{element, rows};
#[cfg(target_arch = "x86_64")]
use super::{float_avx2 as avx2, float_avx512 as avx512};
#[cfg(target_arch = "x86_64")]
use crate::kernels::cpu::avx512_vnni_active;
use crate::kernels::cpu::simd_active;
use crate::kernels::formats::ActFormat;
use crate::kernels::operand::{convert_rows_into, Converted, DirectFn, RowsFn};

/// The float weight types this kernel serves (ggml type ids F32, F16, BF16).
pub fn serves(type_id: u32) -> bool {
    matches!(type_id, 0 | 1 | 30)
}

/// Where the widened rows start in their buffer: on a cache line, so that no 32-byte load of
/// the tiles straddles two (the allocator's 16-byte alignment split half of them).
const ROWS_ALIGN: usize = 64;

/// The activations of `act` (converted to the weight type's vec_dot type: f32, f16 or bf16)
/// widened to f32 rows of `k` rounded up to 8, zero-padded, [`widened_row_bytes`] apart: a
/// [`Converted`] of format F32 whose rows start at [`widened`]. Converting in the tile instead (`vcvtph2ps` on both
/// operands at every step) cost half the FMA rate on an AVX2-only Zen 3 VM: one thread,
/// 2816 × 1024 × 256, 15.2 GFLOP/s converting in registers, 29.6 from widened rows.
pub fn widen_activations(act: &Converted, fmt: ActFormat, k: usize) -> Converted {
    let mut wide = aligned_rows(act.rows, k);
    let start = line_offset(&wide.data);
    for r in 0..act.rows {
        let src = &act.data[r * act.row_bytes..(r + 1) * act.row_bytes];
        let at = start + r * wide.row_bytes;
        widen_act_row(fmt, src, &mut wide.data[at..at + k * 4]);
    }
    wide
}

/// [`widen_activations`] of the conversion of float32 rows `x`, without the converted
/// intermediate: each row converted and widened in turn, the rows split over up to `threads`.
pub fn widen_rows(fmt: ActFormat, x: &[f32], k: usize, threads: usize) -> Converted {
    let mut wide = aligned_rows(x.len() / k, k);
    let (start, row_bytes) = (line_offset(&wide.data), wide.row_bytes);
    convert_rows_into(
        x,
        k,
        row_bytes,
        threads,
        &mut wide.data[start..],
        |xs, out| {
            let mut tmp = vec![0u8; fmt.row_bytes(k)];
            for (xr, dst) in xs.chunks_exact(k).zip(out.chunks_exact_mut(row_bytes)) {
                fmt.convert_row(xr, &mut tmp);
                widen_act_row(fmt, &tmp, &mut dst[..k * 4]);
            }
        },
    );
    wide
}

/// Zeroed room for `rows` widened rows of `k` values, with the slack to start them on a line.
fn aligned_rows(rows: usize, k: usize) -> Converted {
    let row_bytes = widened_row_bytes(k);
    Converted {
        data: vec![0u8; rows * row_bytes + ROWS_ALIGN],
        row_bytes,
        rows,
    }
}

/// Bytes from one widened row to the next: at least `k` rounded up to 8 f32s, whole lines,
/// an odd count of them. The tiles keep a slice of every row in L2; rows a power of two
/// apart (K = 1024: 4 KiB) fell into a sixteenth of L2's sets and evicted one another.
pub(crate) fn widened_row_bytes(k: usize) -> usize {
    let lines = (k.next_multiple_of(8) * 4).div_ceil(64);
    (lines | 1) * 64
}

/// Bytes from the start of `data` to its first line boundary.
fn line_offset(data: &[u8]) -> usize {
    (data.as_ptr() as usize).wrapping_neg() % ROWS_ALIGN
}

/// The rows of a [`widen_activations`] result (`rows × row_bytes` bytes, line-aligned).
pub(crate) fn widened(act: &Converted) -> &[u8] {
    let start = line_offset(&act.data);
    &act.data[start..start + act.rows * act.row_bytes]
}

/// One converted row (f16, bf16 or f32 bytes) widened to float32 bytes `dst` (exact).
fn widen_act_row(fmt: ActFormat, src: &[u8], dst: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if simd_active() {
        // SAFETY: AVX2 and F16C checked.
        return unsafe { widen_act_row_simd(fmt, src, dst) };
    }
    for (i, d) in dst.chunks_exact_mut(4).enumerate() {
        d.copy_from_slice(&element(fmt, src, i).to_le_bytes());
    }
}

/// [`widen_act_row`] eight values at a time (a scalar f16 conversion per value cost a fifth of
/// a 256 × 1024 × 256 call).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_act_row_simd(fmt: ActFormat, src: &[u8], dst: &mut [u8]) {
    use std::arch::x86_64::*;
    let n = dst.len() / 4;
    let width = fmt.block_bytes();
    assert!(src.len() >= n * width);
    let whole = n / 8 * 8;
    for i in (0..whole).step_by(8) {
        let p = src.as_ptr().add(i * width);
        let v = match fmt {
            ActFormat::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            ActFormat::BF16 => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            }
            _ => _mm256_loadu_ps(p as *const f32),
        };
        _mm256_storeu_ps(dst.as_mut_ptr().add(i * 4) as *mut f32, v);
    }
    for (i, d) in dst.chunks_exact_mut(4).enumerate().skip(whole) {
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
