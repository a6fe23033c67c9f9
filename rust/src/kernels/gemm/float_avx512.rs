//! AVX-512 float-weight tiles. Each 512-bit accumulator holds the 8-lane accumulators of two
//! weight rows (lanes 0-7 and 8-15) for one activation row, whose eight values fill both
//! halves: each output gets the AVX2 tile's FMAs in the same order. Both operands come widened
//! to f32 ([`super::float_blocked`]), so the tile is FMAs with memory operands only
//! (converting in registers left the wider FMAs waiting on the conversions).

use std::arch::x86_64::*;

use super::float_avx2 as avx2;
use super::float_blocked::{self as blocked, Share, Tile, BF16, F16, F32};
use super::float_few::MIN_ROWS;
use super::float_tiles::avx2::hsum4;
use super::Dest;
use crate::kernels::cpu::avx512_vnni_active;
use crate::kernels::operand::{Converted, DirectFn, RowsFn, RowsJob};

/// Weight rows per tile (four register pairs) and activation rows per tile.
const ROWS: usize = 8;
const PAIRS: usize = ROWS / 2;
const NR: usize = 4;

struct Zmm;

impl Tile for Zmm {
    const ROWS: usize = ROWS;
    const COLS: usize = NR;
    const ACC: usize = PAIRS * NR * 16;

    #[inline(always)]
    unsafe fn part(w: *const f32, x: &[*const f32; 8], steps: usize, fresh: bool, acc: *mut f32) {
        let mut a = [[_mm512_setzero_ps(); NR]; PAIRS];
        if !fresh {
            for (q, aq) in a.iter_mut().enumerate() {
                for (j, v) in aq.iter_mut().enumerate() {
                    *v = _mm512_load_ps(acc.add((q * NR + j) * 16));
                }
            }
        }
        for s in 0..steps {
            let xs: [__m512; NR] = std::array::from_fn(|j| {
                let v = _mm256_loadu_pd(x[j].add(s * 8) as *const f64);
                _mm512_castpd_ps(_mm512_broadcast_f64x4(v))
            });
            for (q, aq) in a.iter_mut().enumerate() {
                let wq = _mm512_load_ps(w.add((s * PAIRS + q) * 16));
                for (acc_j, x_j) in aq.iter_mut().zip(&xs) {
                    *acc_j = _mm512_fmadd_ps(wq, *x_j, *acc_j);
                }
            }
        }
        for (q, aq) in a.iter().enumerate() {
            for (j, v) in aq.iter().enumerate() {
                _mm512_store_ps(acc.add((q * NR + j) * 16), *v);
            }
        }
    }

    #[inline(always)]
    unsafe fn finish(
        acc: *const f32,
        dest: Dest,
        row0: usize,
        row_end: usize,
        col0: usize,
        col_end: usize,
    ) {
        let a: [[__m512; NR]; PAIRS] = std::array::from_fn(|q| {
            std::array::from_fn(|j| _mm512_load_ps(acc.add((q * NR + j) * 16)))
        });
        // row 2q's accumulators are the low halves, row 2q + 1's the high ones
        let mut sums = [0.0f32; ROWS * NR];
        for (q, acc) in a.iter().enumerate() {
            let lo: [__m256; NR] = std::array::from_fn(|j| _mm512_castps512_ps256(acc[j]));
            let hi: [__m256; NR] = std::array::from_fn(|j| {
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[j])))
            });
            sums[2 * q * NR..(2 * q + 1) * NR].copy_from_slice(&hsum4(lo));
            sums[(2 * q + 1) * NR..(2 * q + 2) * NR].copy_from_slice(&hsum4(hi));
        }
        blocked::put(&sums, NR, dest, row0, row_end, col0, col_end);
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn run<const F: u8>(share: Share<'_>) {
    blocked::run::<Zmm, F>(share)
}

/// The rows function of weight format F (a [`RowsFn`]); under [`MIN_ROWS`] activation rows
/// the few-row tile's (AVX2).
fn rows<const F: u8>(job: RowsJob<'_>) {
    assert!(avx512_vnni_active(), "the AVX-512 float tiles need AVX-512");
    if job.act.rows < MIN_ROWS {
        return avx2::rows::<F>(job);
    }
    let share = avx2::job_share(job);
    // SAFETY: AVX-512 F and BW (and so AVX2, FMA, F16C) checked above; `share` checked its
    // sizes and spans `out`.
    unsafe { run::<F>(share) }
}

/// [`rows`] for weight rows `first..first + rows` written straight into the `[n][m]` output
/// at `out` (column `first + i` of every activation row), no scratch or scatter.
///
/// # Safety
/// `out` is valid for `act.rows × m` floats and no one else writes columns
/// `first..first + rows` meanwhile; `act.rows >= MIN_ROWS`.
#[allow(clippy::too_many_arguments)] // the shape of `DirectFn`
unsafe fn direct<const F: u8>(
    w: &[u8],
    stride: usize,
    first: usize,
    rows: usize,
    k: usize,
    act: &Converted,
    out: *mut f32,
    m: usize,
) {
    assert!(avx512_vnni_active() && act.rows >= MIN_ROWS);
    // SAFETY: as asserted; the caller owns those columns of `out`.
    unsafe { run::<F>(avx2::direct_share(w, stride, first, rows, k, act, out, m)) }
}

/// The rows function of a float weight type (ggml type 0, 1 or 30).
pub(super) fn rows_fn(type_id: u32) -> RowsFn {
    avx2::by_format::<RowsFn>(type_id, rows::<F16>, rows::<BF16>, rows::<F32>)
}

/// The direct function of a float weight type, from [`MIN_ROWS`] activation rows.
pub(super) fn direct_fn(type_id: u32, n: usize) -> Option<DirectFn> {
    (n >= MIN_ROWS)
        .then(|| avx2::by_format::<DirectFn>(type_id, direct::<F16>, direct::<BF16>, direct::<F32>))
}
