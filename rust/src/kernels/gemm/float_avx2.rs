//! AVX2 float-weight tiles: MR weight rows × NR activation rows of ymm accumulators, one per
//! output, over weights and activations widened to f32 ([`super::float_blocked`]).

use std::arch::x86_64::*;

use super::float_blocked::{self as blocked, Share, Tile, BF16, F16, F32};
use super::float_few as few;
use super::float_tiles::{avx2::hsum4, MR, NR};
use super::widened::{widened, widened_row_bytes};
use super::Dest;
use crate::kernels::cpu::simd_active;
use crate::kernels::operand::{Converted, DirectFn, RowsFn, RowsJob};

struct Ymm;

impl Tile for Ymm {
    const ROWS: usize = MR;
    const COLS: usize = NR;
    const ACC: usize = MR * NR * 8;

    #[inline(always)]
    unsafe fn part(w: *const f32, x: &[*const f32; 8], steps: usize, fresh: bool, acc: *mut f32) {
        let mut a = [_mm256_setzero_ps(); MR * NR];
        if !fresh {
            for (o, v) in a.iter_mut().enumerate() {
                *v = _mm256_load_ps(acc.add(o * 8));
            }
        }
        for s in 0..steps {
            let xs: [__m256; NR] = std::array::from_fn(|j| _mm256_loadu_ps(x[j].add(s * 8)));
            for i in 0..MR {
                let wi = _mm256_load_ps(w.add((s * MR + i) * 8));
                for j in 0..NR {
                    a[i * NR + j] = _mm256_fmadd_ps(wi, xs[j], a[i * NR + j]);
                }
            }
        }
        for (o, v) in a.iter().enumerate() {
            _mm256_store_ps(acc.add(o * 8), *v);
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
        // the MR·NR sums four at a time (hsum4: hsum8's additions in its order)
        let mut sums = [0.0f32; MR * NR];
        for (c, dst) in sums.chunks_exact_mut(4).enumerate() {
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_load_ps(acc.add((c * 4 + i) * 8)));
            dst.copy_from_slice(&hsum4(v));
        }
        blocked::put(&sums, NR, dest, row0, row_end, col0, col_end);
    }
}

/// `share` by the AVX2 tiles, or under [`few::MIN_ROWS`] activation rows the few-row ones.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const F: u8>(share: Share<'_>) {
    if share.n < few::MIN_ROWS {
        return few::run::<F>(share);
    }
    blocked::run::<Ymm, F>(share)
}

/// A share of weight rows against the widened activations `act` (f32 rows of K rounded up
/// to 8), its sizes checked.
pub(super) fn share<'a>(
    w: &'a [u8],
    stride: usize,
    first: usize,
    rows: usize,
    k: usize,
    act: &'a Converted,
    dest: Dest,
) -> Share<'a> {
    assert!(k > 0 && act.row_bytes == widened_row_bytes(k));
    Share {
        w,
        stride,
        first,
        rows,
        k,
        x: widened(act).as_ptr() as *const f32,
        x_stride: act.row_bytes / 4,
        n: act.rows,
        dest,
    }
}

/// The share of a [`RowsJob`]: its weight rows against every activation row, into its
/// `[rows][n]` output.
pub(super) fn job_share(job: RowsJob<'_>) -> Share<'_> {
    let (w, stride, first, k, act, out, _) = job.into_parts();
    let rows = out.len() / act.rows.max(1);
    let dest = Dest::scratch(out, act.rows);
    share(w, stride, first, rows, k, act, dest)
}

/// The share of a [`DirectFn`] call: weight rows `first..first + rows` written straight into
/// the `[n][m]` output at `out` (column `first + i` of every activation row).
///
/// # Safety
/// `out` is valid for `act.rows × m` floats.
#[allow(clippy::too_many_arguments)] // the shape of `DirectFn`
pub(super) unsafe fn direct_share<'a>(
    w: &'a [u8],
    stride: usize,
    first: usize,
    rows: usize,
    k: usize,
    act: &'a Converted,
    out: *mut f32,
    m: usize,
) -> Share<'a> {
    assert!(first + rows <= m);
    // SAFETY: as asserted, within the caller's floats
    let dest = unsafe { Dest::columns(out, first, m) };
    share(w, stride, first, rows, k, act, dest)
}

/// The rows function of weight format F (a [`RowsFn`]).
pub(super) fn rows<const F: u8>(job: RowsJob<'_>) {
    assert!(
        simd_active(),
        "the AVX2 float tiles need AVX2, FMA and F16C"
    );
    let share = job_share(job);
    // SAFETY: AVX2, FMA and F16C checked above; `share` checked its sizes and spans `out`.
    unsafe { run::<F>(share) }
}

/// [`rows`] written straight into the `[n][m]` output (a [`DirectFn`]).
///
/// # Safety
/// `out` is valid for `act.rows × m` floats and no one else writes columns
/// `first..first + rows` meanwhile.
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
    assert!(simd_active());
    // SAFETY: the caller owns those columns of `out`; AVX2, FMA and F16C checked above.
    unsafe { run::<F>(direct_share(w, stride, first, rows, k, act, out, m)) }
}

/// `f16`, `bf16` or `f32` by ggml float type (1, 30, else 0).
pub(super) fn by_format<T>(type_id: u32, f16: T, bf16: T, f32: T) -> T {
    match type_id {
        1 => f16,
        30 => bf16,
        _ => f32,
    }
}

/// The rows function of a float weight type (ggml type 0, 1 or 30).
pub(super) fn rows_fn(type_id: u32) -> RowsFn {
    by_format::<RowsFn>(type_id, rows::<F16>, rows::<BF16>, rows::<F32>)
}

/// The direct function of a float weight type.
pub(super) fn direct_fn(type_id: u32) -> DirectFn {
    by_format::<DirectFn>(type_id, direct::<F16>, direct::<BF16>, direct::<F32>)
}
