//! The float-weight tiles for few activation rows (under [`MIN_ROWS`]): the weights are read
//! once, so the call streams them from memory, and widening them into a panel first (the
//! many-row kernel, [`super::float_blocked`]) halved its rate: here each tile converts its
//! weight rows in registers, straight from where they are, and prefetches them ahead. The
//! same FMAs in the same order as every other float tile (AVX2 instructions on both paths).

use std::arch::x86_64::*;

use super::float_blocked::{elem_bytes, put, Share, BF16, F16};
use super::float_tiles::avx2::hsum4;
use super::widened::element;
use crate::kernels::dot::lanes::hsum8;
use crate::kernels::formats::ActFormat;

/// From this many activation rows the many-row kernel runs (below it, one thread against
/// the AVX-512 tiles: 8 rows 0.7x, 16 rows 1.0x).
pub(crate) const MIN_ROWS: usize = 16;
/// Weight rows and activation rows per tile: its accumulators, activations and one weight
/// register fit the 16 (4 × 3 spilled an accumulator, the conversions' registers on top).
const MR: usize = 3;
const NR: usize = 3;
/// Bytes ahead of the tile's step that its weight rows are prefetched (about DRAM's latency
/// at the tile's rate).
const AHEAD: usize = 1024;

/// Runs `share` (fewer than [`MIN_ROWS`] activation rows) on weights of format F.
///
/// # Safety
/// AVX2, FMA and F16C present; as [`super::float_blocked::run`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn run<const F: u8>(share: Share<'_>) {
    if !share.has_work::<F>() {
        return;
    }
    let Share {
        w,
        stride,
        first,
        rows,
        k,
        x,
        x_stride,
        n,
        dest,
    } = share;
    let elem = elem_bytes::<F>();
    let whole = k / 8;
    let row_bytes = k * elem;
    let fmt = match F {
        F16 => ActFormat::F16,
        BF16 => ActFormat::BF16,
        _ => ActFormat::F32,
    };
    for t0 in (0..rows).step_by(MR) {
        let t1 = rows.min(t0 + MR);
        // rows past the end repeat the last one; their results are dropped
        let at: [usize; MR] = std::array::from_fn(|i| (first + (t0 + i).min(t1 - 1)) * stride);
        let ws = at.map(|a| w.as_ptr().add(a));
        // the ragged last step of each row, zero-padded
        let tail: [[f32; 8]; MR] = std::array::from_fn(|i| {
            std::array::from_fn(|l| {
                let v = whole * 8 + l;
                if v < k {
                    element(fmt, &w[at[i]..at[i] + k * elem], v)
                } else {
                    0.0
                }
            })
        });
        for c0 in (0..n).step_by(NR) {
            let xs: [*const f32; NR] =
                std::array::from_fn(|j| x.add((c0 + j).min(n - 1) * x_stride));
            let mut a = [_mm256_setzero_ps(); MR * NR];
            for s in 0..whole {
                if c0 == 0 {
                    // every row once a line (f16: four steps of 16 bytes); past a row's end,
                    // the next tile's same row, so that its start does not wait on DRAM
                    if s % 4 == 0 {
                        let ahead = s * 8 * elem + AHEAD;
                        for wi in ws {
                            let p = if ahead < row_bytes {
                                wi.wrapping_add(ahead)
                            } else {
                                wi.wrapping_add(MR * stride + ahead - row_bytes)
                            };
                            // a hint: never faults, even past the weights
                            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
                        }
                    }
                }
                let xv: [__m256; NR] = std::array::from_fn(|j| _mm256_loadu_ps(xs[j].add(s * 8)));
                for i in 0..MR {
                    let wv = load8::<F>(ws[i].add(s * 8 * elem));
                    for j in 0..NR {
                        a[i * NR + j] = _mm256_fmadd_ps(wv, xv[j], a[i * NR + j]);
                    }
                }
            }
            if whole * 8 < k {
                let xv: [__m256; NR] =
                    std::array::from_fn(|j| _mm256_loadu_ps(xs[j].add(whole * 8)));
                for (i, t) in tail.iter().enumerate() {
                    let wv = _mm256_loadu_ps(t.as_ptr());
                    for j in 0..NR {
                        a[i * NR + j] = _mm256_fmadd_ps(wv, xv[j], a[i * NR + j]);
                    }
                }
            }
            // eight sums four at a time, the ninth alone (the same additions: hsum4 is hsum8)
            let mut sums = [0.0f32; MR * NR];
            for (dst, v) in sums.chunks_exact_mut(4).zip(a.chunks_exact(4)) {
                dst.copy_from_slice(&hsum4([v[0], v[1], v[2], v[3]]));
            }
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), a[MR * NR - 1]);
            sums[MR * NR - 1] = hsum8(&lanes);
            put(&sums, NR, dest, t0, t1, c0, n);
        }
    }
}

/// Eight weights of format F at `p`, widened (exact).
#[inline(always)]
unsafe fn load8<const F: u8>(p: *const u8) -> __m256 {
    match F {
        F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        BF16 => {
            let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
        }
        _ => _mm256_loadu_ps(p as *const f32),
    }
}
