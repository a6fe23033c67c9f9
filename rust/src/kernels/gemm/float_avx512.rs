//! AVX-512 f16 tiles. Each 512-bit accumulator holds the 8-lane accumulators of two weight
//! rows (lanes 0-7 and 8-15) for one activation row, whose eight values fill both halves: each
//! output gets its AVX2 tile's FMAs in the same order. Both operands are widened to f32 first
//! (exact): eight weight rows into a panel laid out by k-step and row pair, a block of
//! activation rows into a scratch, so the tile is FMAs with memory operands only (converting
//! in registers, as the AVX2 tile does, left the wider FMAs waiting on the conversions).

use std::arch::x86_64::*;

use super::float_tiles::{avx2::hsum4, unsafe_rows_avx2};
use super::Dest;
use crate::kernels::blocks::half::fp16_to_f32;
use crate::kernels::cpu::avx512_vnni_active;
use crate::kernels::formats::ActFormat;
use crate::kernels::operand::{Converted, RowsJob};

/// Weight rows per register tile (four register pairs), tiles per panel, activation rows
/// per tile, and the most bytes of widened activations at once.
const ROWS: usize = 8;
const PANEL_TILES: usize = 4;
/// Half of a 2 MiB L2. All the activation rows at once (4 MiB) left the 1 B model's
/// K = 2048 / 5632 prompts reading them from L3 for every tile: two threads, 256 rows,
/// four shapes, 92.5 -> 123-128 GFLOP/s with the slices below (docs/benchmarks.md).
const XF_BYTES: usize = 1 << 20;
/// k-steps (of 8 values) per slice of K: a tile's part is ROWS × 8 × 4 bytes per step
/// (16 KiB at 64 steps), reused by every activation group from L1 (32 steps: 5-10 %
/// slower, the accumulators' loads and stores between slices).
const KB_STEPS: usize = 64;
/// Below this many activation rows widening the weights costs more than the wide FMAs
/// save (one thread against the AVX2 tile: 8 rows 0.75x, 16 rows 1.1x, 32 rows 1.3x); the
/// AVX2 tile runs instead.
pub(super) const MIN_ROWS: usize = 16;
const PAIRS: usize = ROWS / 2;
const NR: usize = 4;

pub fn rows_f16_entry(job: RowsJob<'_>) {
    assert!(avx512_vnni_active(), "the AVX-512 f16 tiles need AVX-512");
    let (n, k) = (job.act.rows, job.k);
    if n == 0 || k == 0 {
        return;
    }
    if n < MIN_ROWS {
        return unsafe_rows_avx2(ActFormat::F16, job);
    }
    let (w, stride, first, k, act, out, _) = job.into_parts();
    let kp = k.next_multiple_of(8);
    let rows_total = out.len() / n;
    assert!(kp >= 8 && act.row_bytes == kp * 2 && act.data.len() >= n * act.row_bytes);
    assert!(rows_total == 0 || w.len() >= (first + rows_total - 1) * stride + 2 * k);
    let dest = Dest {
        ptr: out.as_mut_ptr(),
        row_step: n,
        col_step: 1,
    };
    // SAFETY: AVX-512 F and BW (and so AVX2, FMA, F16C) checked above; sizes asserted;
    // `dest` spans `out`.
    unsafe { rows_f16(w, stride, first, k, kp, act, rows_total, dest) }
}

/// [`rows_f16_entry`] for weight rows `first..first + rows` written straight into the
/// `[n][m]` output at `out` (column `first + i` of every activation row), no scratch or
/// scatter: a short-K call (attention's K·Q) spent a quarter of its time transposing.
///
/// # Safety
/// `out` is valid for `act.rows × m` floats and no one else writes columns
/// `first..first + rows` meanwhile; `act.rows >= MIN_ROWS`.
#[allow(clippy::too_many_arguments)] // the shape of `DirectFn`
pub(crate) unsafe fn rows_f16_direct(
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
    assert!(first + rows <= m);
    let kp = k.next_multiple_of(8);
    assert!(kp >= 8 && act.row_bytes == kp * 2 && act.data.len() >= act.rows * act.row_bytes);
    assert!(rows == 0 || w.len() >= (first + rows - 1) * stride + 2 * k);
    let dest = Dest {
        ptr: out.add(first),
        row_step: 1,
        col_step: m,
    };
    // SAFETY: as asserted; the caller owns those columns of `out`.
    unsafe { rows_f16(w, stride, first, k, kp, act, rows, dest) }
}

impl Dest {
    /// Rows `row0..row_end` (at most ROWS) × columns `col0..col_end` (at most NR) of `res`.
    #[inline(always)]
    unsafe fn store(
        &self,
        res: &[[f32; NR]; ROWS],
        row0: usize,
        row_end: usize,
        col0: usize,
        col_end: usize,
    ) {
        let rows = row_end.saturating_sub(row0).min(ROWS);
        let cols = (col_end - col0).min(NR);
        for j in 0..cols {
            let col = self
                .ptr
                .add((col0 + j) * self.col_step + row0 * self.row_step);
            for (i, r) in res.iter().enumerate().take(rows) {
                *col.add(i * self.row_step) = r[j];
            }
        }
    }
}

/// Weight rows `r0..r1` (f16, `k` values each) as a run of cache lines to prefetch.
struct NextRows {
    base: *const u8,
    stride: usize,
    row_lines: usize,
    rows: usize,
}

impl NextRows {
    fn new(w: &[u8], stride: usize, first: usize, k: usize, r0: usize, r1: usize) -> Self {
        let rows = r1.saturating_sub(r0);
        let base = if rows > 0 {
            w[(first + r0) * stride..].as_ptr()
        } else {
            w.as_ptr()
        };
        Self {
            base,
            stride,
            row_lines: (2 * k).div_ceil(64),
            rows,
        }
    }

    fn lines(&self) -> usize {
        self.rows * self.row_lines
    }

    /// Prefetches lines `from..from + count` (those past the end are skipped).
    #[inline(always)]
    unsafe fn prefetch(&self, from: usize, count: usize) {
        for l in from..self.lines().min(from + count) {
            let (row, line) = (l / self.row_lines, l % self.row_lines);
            let p = self.base.wrapping_add(row * self.stride + 64 * line);
            _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
        }
    }
}

/// One cache line of f32s: buffers of these keep every 64-byte load of a panel within a
/// line (an unaligned one touches two and halves what the loads deliver).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// Line-aligned room for `len` f32s, not initialized: every value the tiles read is
/// written first (activation rows, panel slots, accumulators), and zeroing the buffers of
/// each call cost more than a short-K call's FMAs.
fn lines(len: usize) -> Vec<std::mem::MaybeUninit<Line>> {
    let n = len.div_ceil(16);
    let mut v = Vec::with_capacity(n);
    // SAFETY: MaybeUninit elements need no initialization.
    unsafe { v.set_len(n) };
    v
}

/// `k` f16 values at `src` to f32 at `dst` (`kp` written, zero-padded).
#[inline(always)]
unsafe fn widen(src: *const u16, k: usize, kp: usize, dst: *mut f32) {
    let mut l = 0;
    while l + 8 <= k {
        let h = _mm_loadu_si128(src.add(l) as *const __m128i);
        _mm256_storeu_ps(dst.add(l), _mm256_cvtph_ps(h));
        l += 8;
    }
    while l < kp {
        let v = if l < k { *src.add(l) } else { 0 };
        *dst.add(l) = fp16_to_f32(v);
        l += 1;
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw")]
unsafe fn rows_f16(
    w: &[u8],
    stride: usize,
    first: usize,
    k: usize,
    kp: usize,
    act: &Converted,
    rows_total: usize,
    dest: Dest,
) {
    let n = act.rows;
    let steps = kp / 8;
    // activation rows widened at once: as many as XF_BYTES holds, so that they stay in L2
    // while every panel of weight rows passes over them; all of them up to half as much
    // again (a 64-row prompt at K = 5632 then widens the weights once: 83 -> 95 GFLOP/s)
    let every = n.next_multiple_of(NR);
    let chunk = if every * kp * 4 <= XF_BYTES + XF_BYTES / 2 {
        every
    } else {
        (XF_BYTES / (kp * 4)).max(NR) / NR * NR // fewer than `every`: 1 MiB < 1.5 MiB
    };
    let mut xf_lines = lines(chunk * kp);
    let xf = xf_lines.as_mut_ptr() as *mut f32;
    // [tile][step][pair][16]: the 8 values of a k-step for both rows of a pair
    let tile_len = steps * PAIRS * 16;
    let mut panel_lines = lines(PANEL_TILES * tile_len);
    let panel = panel_lines.as_mut_ptr() as *mut f32;
    // accumulators wait between slices for every tile of the panel; with one slice (K up
    // to 512: attention's K·Q) each tile finishes at once and one tile's worth serves all
    let one_slice = steps <= KB_STEPS;
    let acc_tiles = if one_slice { 1 } else { PANEL_TILES };
    let mut acc_lines = lines(acc_tiles * chunk.div_ceil(NR) * ACC_LEN);
    let accs = acc_lines.as_mut_ptr() as *mut f32;
    let mut tail = [0.0f32; 8];
    let x = act.data.as_ptr() as *const u16;
    for c0 in (0..n).step_by(chunk) {
        let c1 = n.min(c0 + chunk);
        for r in c0..c1 {
            widen(x.add(r * kp), kp, kp, xf.add((r - c0) * kp));
        }
        for t0 in (0..rows_total).step_by(ROWS * PANEL_TILES) {
            let t1 = rows_total.min(t0 + ROWS * PANEL_TILES);
            let tiles = (t1 - t0).div_ceil(ROWS);
            for i in 0..tiles * ROWS {
                // rows past the end repeat the last one; their results are dropped
                let at = (first + (t0 + i).min(t1 - 1)) * stride;
                let src = w[at..].as_ptr() as *const u16;
                let base = panel.add(i / ROWS * tile_len);
                let (q, half) = ((i % ROWS) / 2, (i % 2) * 8);
                // whole steps straight into the panel, a ragged last one through `tail`
                let whole = k / 8;
                for s in 0..whole {
                    let h = _mm_loadu_si128(src.add(s * 8) as *const __m128i);
                    let dst = base.add((s * PAIRS + q) * 16 + half);
                    _mm256_store_ps(dst, _mm256_cvtph_ps(h));
                }
                if whole < steps {
                    widen(src.add(whole * 8), k - whole * 8, 8, tail.as_mut_ptr());
                    let dst = base.add((whole * PAIRS + q) * 16 + half);
                    std::ptr::copy_nonoverlapping(tail.as_ptr(), dst, 8);
                }
            }
            // the next panel's weight rows, fetched into L2 a slice per tile call:
            // widening them then runs from cache instead of waiting on DRAM (a quarter
            // of the time, one thread, 64 rows)
            let end = rows_total.min(t1 + ROWS * PANEL_TILES);
            let next = NextRows::new(w, stride, first, k, t1, end);
            let groups = (c1 - c0).div_ceil(NR);
            let calls = groups * tiles * steps.div_ceil(KB_STEPS);
            let per_call = next.lines().div_ceil(calls.max(1));
            let mut fetched = 0;
            // K in slices whose part of a tile stays in L1 while every activation group
            // passes, each slice over all the panel's tiles (its activation part read once
            // per panel from L2, not once per tile); the accumulators of every tile and
            // group wait in `accs` between slices (same FMA order per output)
            let acc_of = |tl: usize, g: usize| {
                let tile = if one_slice { 0 } else { tl };
                accs.add((tile * groups + g) * ACC_LEN)
            };
            let finish_tile = |tl: usize| {
                for g in 0..groups {
                    let res = tile_sums(acc_of(tl, g));
                    dest.store(&res, t0 + tl * ROWS, t1, c0 + g * NR, c1);
                }
            };
            for s0 in (0..steps).step_by(KB_STEPS) {
                let s1 = steps.min(s0 + KB_STEPS);
                for tl in 0..tiles {
                    let tp = panel.add(tl * tile_len);
                    for g in 0..groups {
                        next.prefetch(fetched, per_call);
                        fetched += per_call;
                        let r = c0 + g * NR;
                        let xr: [usize; NR] = std::array::from_fn(|j| (r + j).min(c1 - 1) - c0);
                        let xs = xr.map(|j| xf.add(j * kp) as *const f32);
                        tile_part(tp, xs, s0, s1, acc_of(tl, g));
                    }
                    if one_slice {
                        finish_tile(tl);
                    }
                }
            }
            if !one_slice {
                (0..tiles).for_each(finish_tile);
            }
        }
    }
}

/// f32s of one tile's accumulators (PAIRS × NR registers of 16 lanes).
const ACC_LEN: usize = PAIRS * NR * 16;

/// k-steps `s0..s1` of ROWS panel rows × NR widened activation rows, on the accumulators
/// at `acc` (started from zero at step 0, stored back after `s1`).
#[inline(always)]
unsafe fn tile_part(p: *const f32, x: [*const f32; NR], s0: usize, s1: usize, acc: *mut f32) {
    let mut a = [[_mm512_setzero_ps(); NR]; PAIRS];
    if s0 > 0 {
        for (q, aq) in a.iter_mut().enumerate() {
            for (j, v) in aq.iter_mut().enumerate() {
                *v = _mm512_load_ps(acc.add((q * NR + j) * 16));
            }
        }
    }
    for s in s0..s1 {
        let xs: [__m512; NR] = std::array::from_fn(|j| {
            let v = _mm256_load_pd(x[j].add(s * 8) as *const f64);
            _mm512_castpd_ps(_mm512_broadcast_f64x4(v))
        });
        for (q, aq) in a.iter_mut().enumerate() {
            let wq = _mm512_load_ps(p.add((s * PAIRS + q) * 16));
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

/// The `[row][col]` sums of a finished tile's accumulators at `acc`.
#[inline(always)]
unsafe fn tile_sums(acc: *const f32) -> [[f32; NR]; ROWS] {
    let a: [[__m512; NR]; PAIRS] = std::array::from_fn(|q| {
        std::array::from_fn(|j| _mm512_load_ps(acc.add((q * NR + j) * 16)))
    });
    // row 2q's accumulators are the low halves, row 2q + 1's the high ones (summed in
    // place: a gathered array of the halves cost a memcpy per tile, most of a short-K call)
    let mut sums = [[0.0f32; NR]; ROWS];
    for (q, acc) in a.iter().enumerate() {
        let lo: [__m256; NR] = std::array::from_fn(|j| _mm512_castps512_ps256(acc[j]));
        let hi: [__m256; NR] = std::array::from_fn(|j| {
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[j])))
        });
        sums[2 * q] = hsum4(lo);
        sums[2 * q + 1] = hsum4(hi);
    }
    sums
}
