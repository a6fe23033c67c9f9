//! The loop nest of the SIMD float-weight tiles for many activation rows (AVX2 and AVX-512
//! alike): a thread's weight rows in panels, each panel widened to f32 once per call, one
//! slice of K at a time as it is first needed; every block of activation rows then meets the
//! panel slice by slice, a few activation groups at a time from L1 against every tile.
//!
//! tinyBLAS gives every output one 8-lane accumulator over all of K, so a K slice cannot be
//! summed apart: each (tile, activation group) keeps its accumulators in a scratch between
//! slices and continues them, the same FMAs in the same order. Sizes per thread, against a
//! 1 MiB L2: the accumulators of a panel and a block (32 bytes an output) and the block's K
//! slice stay in L2. Widening the weights once per block of activation rows instead (the
//! former loop) converted and re-read every weight several times per call: at K = 11008,
//! 256 rows, a quarter of the time.

use std::arch::x86_64::*;

use super::widened::element;
use super::Dest;
use crate::kernels::formats::ActFormat;

/// Weight formats as const parameters (`ActFormat` is not one): the widening is chosen at
/// compile time inside the tile loops.
pub(crate) const F32: u8 = 0;
pub(crate) const F16: u8 = 1;
pub(crate) const BF16: u8 = 2;

/// The bytes of the accumulators one panel keeps between K slices (32 per output).
const ACC_BYTES: usize = 256 * 1024;
/// The bytes of one K slice of every activation row, read once per tile from L2.
const X_SLICE_BYTES: usize = 512 * 1024;
/// The bytes of activation slices kept in L1 while the panel's tiles pass over them.
const X_L1_BYTES: usize = 12 * 1024;
/// The most weight rows per panel, the fewest where the activation rows allow, and the most
/// and fewest k-steps (of 8 values) per slice.
const MAX_PANEL_ROWS: usize = 64;
const MIN_PANEL_ROWS: usize = 32;
const MAX_SLICE_STEPS: usize = 64;
const MIN_SLICE_STEPS: usize = 16;

/// A register tile: ROWS weight rows × COLS activation rows, each output one 8-lane FMA
/// chain over K.
pub(crate) trait Tile {
    const ROWS: usize;
    const COLS: usize;
    /// f32s of one tile's accumulators in the scratch.
    const ACC: usize;

    /// k-steps `0..steps` of the widened weights `w` (`[step][ROWS][8]`) against activation
    /// rows `x` (the first COLS used, each at the slice's first value), continuing the
    /// accumulators at `acc` unless `fresh`, and stored back there.
    ///
    /// # Safety
    /// The CPU features of the tile; `w`, `x` and `acc` hold what is read and written.
    unsafe fn part(w: *const f32, x: &[*const f32; 8], steps: usize, fresh: bool, acc: *mut f32);

    /// The finished sums of the accumulators at `acc` into rows `row0..row_end` × columns
    /// `col0..col_end` of `dest` (the parts past either end only padded the tile).
    ///
    /// # Safety
    /// As [`Tile::part`]; `dest` holds those results.
    unsafe fn finish(
        acc: *const f32,
        dest: Dest,
        row0: usize,
        row_end: usize,
        col0: usize,
        col_end: usize,
    );
}

/// One matmul's share: weight rows `first..first + rows` (`stride` bytes apart, `k` values of
/// format F each) against `n` widened activation rows at `x` (`k` rounded up to 8 f32s each,
/// zero-padded, `x_stride` f32s apart).
pub(crate) struct Share<'a> {
    pub(crate) w: &'a [u8],
    pub(crate) stride: usize,
    pub(crate) first: usize,
    pub(crate) rows: usize,
    pub(crate) k: usize,
    pub(crate) x: *const f32,
    pub(crate) x_stride: usize,
    pub(crate) n: usize,
    pub(crate) dest: Dest,
}

impl Share<'_> {
    /// Whether the share has any result to compute; asserts that `w` holds its rows of
    /// format F.
    pub(crate) fn has_work<const F: u8>(&self) -> bool {
        if self.rows == 0 || self.n == 0 {
            return false;
        }
        let row_end = (self.first + self.rows - 1) * self.stride + self.k * elem_bytes::<F>();
        assert!(self.k > 0 && self.w.len() >= row_end);
        true
    }
}

/// One cache line of f32s: the tiles' aligned loads never straddle two.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// Line-aligned room for `len` f32s, not initialized: the tiles write every value before
/// reading it, and zeroing each call's scratch cost more than a short-K call's FMAs.
fn lines(len: usize) -> Vec<std::mem::MaybeUninit<Line>> {
    let n = len.div_ceil(16);
    let mut v = Vec::with_capacity(n);
    // SAFETY: MaybeUninit elements need no initialization.
    unsafe { v.set_len(n) };
    v
}

/// Runs `share` with tile T on weights of format F.
///
/// # Safety
/// The CPU features of T (and AVX2, F16C); `share.x` holds its `n` rows; `dest`
/// holds every result of the share; `w` holds its rows (checked).
#[inline(always)]
pub(crate) unsafe fn run<T: Tile, const F: u8>(share: Share<'_>) {
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
    let kp = k.next_multiple_of(8);
    let steps = kp / 8;
    // activation rows per block: a block's accumulators for at least MIN_PANEL_ROWS weight
    // rows fit ACC_BYTES (fewer weight rows per panel read the activations from L3 more often)
    let block = (ACC_BYTES / (MIN_PANEL_ROWS * 32))
        .next_multiple_of(T::COLS)
        .min(n);
    let groups_max = block.div_ceil(T::COLS);
    let panel = (ACC_BYTES / (groups_max * T::COLS * 32))
        .clamp(T::ROWS, MAX_PANEL_ROWS)
        .min(rows.next_multiple_of(T::ROWS))
        / T::ROWS
        * T::ROWS;
    let slice = (X_SLICE_BYTES / (block * 32))
        .clamp(MIN_SLICE_STEPS, MAX_SLICE_STEPS)
        .min(steps);
    let slices = steps.div_ceil(slice);
    let group_block = (X_L1_BYTES / (T::COLS * slice * 32)).max(1);
    let tiles_max = panel / T::ROWS;
    // the panel widened once, [slice][tile][step][ROWS][8], a slice as the first block needs it
    let tile_len = slice * T::ROWS * 8;
    let slice_len = tiles_max * tile_len;
    let mut wbuf = lines(slices * slice_len);
    let wb = wbuf.as_mut_ptr() as *mut f32;
    // with one slice each tile finishes at once and one set of accumulators serves all
    let one_slice = slices == 1;
    let mut acc_buf = lines(if one_slice {
        T::ACC
    } else {
        tiles_max * groups_max * T::ACC
    });
    let accs = acc_buf.as_mut_ptr() as *mut f32;
    let acc_of = |tl: usize, g: usize| {
        if one_slice {
            accs
        } else {
            accs.add((tl * groups_max + g) * T::ACC)
        }
    };
    let src = |row: usize| w.as_ptr().add((first + row) * stride);
    for p0 in (0..rows).step_by(panel) {
        let p1 = rows.min(p0 + panel);
        let tiles = (p1 - p0).div_ceil(T::ROWS);
        // the next panel's weights, fetched into L2 a few lines per tile call so that
        // widening them does not wait on DRAM
        let q1 = rows.min(p1 + panel);
        let mut ahead = Ahead::new(src(p1.min(rows - 1)), stride, q1 - p1, k * elem);
        let calls = n.div_ceil(T::COLS) * slices * tiles;
        let per_call = ahead.total().div_ceil(calls);
        for b0 in (0..n).step_by(block) {
            let b1 = n.min(b0 + block);
            let groups = (b1 - b0).div_ceil(T::COLS);
            for sl in 0..slices {
                let (s0, s1) = (sl * slice, steps.min(sl * slice + slice));
                let ws = wb.add(sl * slice_len);
                if b0 == 0 {
                    for i in 0..tiles * T::ROWS {
                        // rows past the panel repeat its last row; their results are dropped
                        let row = (p0 + i).min(p1 - 1);
                        let dst = ws.add(i / T::ROWS * tile_len + (i % T::ROWS) * 8);
                        widen_slice::<F>(w, src(row), k, s0, s1, T::ROWS * 8, dst);
                    }
                }
                let last = s1 == steps;
                // a few activation groups at a time stay in L1 while every tile of the panel
                // meets them, each tile's weights read from L2 once per few groups
                for g0 in (0..groups).step_by(group_block) {
                    for tl in 0..tiles {
                        let wt = ws.add(tl * tile_len);
                        for g in g0..groups.min(g0 + group_block) {
                            ahead.fetch(per_call);
                            let c0 = b0 + g * T::COLS;
                            let xs: [*const f32; 8] = std::array::from_fn(|j| {
                                x.add(((c0 + j).min(b1 - 1)) * x_stride + s0 * 8)
                            });
                            let acc = acc_of(tl, g);
                            T::part(wt, &xs, s1 - s0, s0 == 0, acc);
                            if last {
                                T::finish(acc, dest, p0 + tl * T::ROWS, p1, c0, b1);
                            }
                        }
                    }
                }
            }
        }
    }
}

pub(crate) const fn elem_bytes<const F: u8>() -> usize {
    if F == F32 {
        4
    } else {
        2
    }
}

fn act_format<const F: u8>() -> ActFormat {
    match F {
        F16 => ActFormat::F16,
        BF16 => ActFormat::BF16,
        _ => ActFormat::F32,
    }
}

/// k-steps `s0..s1` of the weight row at `src` (`k` values) widened to f32, step `s` at
/// `dst + (s - s0) * step_len` (8 values, zero-padded past `k`).
#[inline(always)]
unsafe fn widen_slice<const F: u8>(
    w: &[u8],
    src: *const u8,
    k: usize,
    s0: usize,
    s1: usize,
    step_len: usize,
    dst: *mut f32,
) {
    let elem = elem_bytes::<F>();
    let whole = s1.min(k / 8);
    for s in s0..whole {
        let p = src.add(s * 8 * elem);
        let v = match F {
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            BF16 => {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            }
            _ => _mm256_loadu_ps(p as *const f32),
        };
        _mm256_store_ps(dst.add((s - s0) * step_len), v);
    }
    if whole.max(s0) < s1 {
        // the ragged last step, zero-padded
        let s = whole.max(s0);
        let at = src.offset_from(w.as_ptr()) as usize;
        let row = &w[at..at + k * elem];
        for l in 0..8 {
            let i = s * 8 + l;
            let v = if i < k {
                element(act_format::<F>(), row, i)
            } else {
                0.0
            };
            *dst.add((s - s0) * step_len + l) = v;
        }
    }
}

/// The cache lines of some weight rows, prefetched a few at a time.
struct Ahead {
    base: *const u8,
    stride: usize,
    rows: usize,
    row_lines: usize,
    row: usize,
    line: usize,
}

impl Ahead {
    /// `rows` weight rows of `bytes` each from `base`, `stride` apart.
    fn new(base: *const u8, stride: usize, rows: usize, bytes: usize) -> Self {
        Self {
            base,
            stride,
            rows,
            // one line more: a row need not start on a line
            row_lines: bytes.div_ceil(64) + 1,
            row: 0,
            line: 0,
        }
    }

    fn total(&self) -> usize {
        self.rows * self.row_lines
    }

    /// The next `count` lines (none past the last).
    #[inline(always)]
    unsafe fn fetch(&mut self, count: usize) {
        for _ in 0..count {
            if self.row >= self.rows {
                return;
            }
            let p = self
                .base
                .wrapping_add(self.row * self.stride + self.line * 64);
            // a hint: never faults, even past the weights
            _mm_prefetch::<_MM_HINT_T1>(p as *const i8);
            self.line += 1;
            if self.line == self.row_lines {
                self.line = 0;
                self.row += 1;
            }
        }
    }
}

/// Stores a finished tile's `[row][col]` sums (`cols` a row) into `dest`.
#[inline(always)]
pub(crate) unsafe fn put(
    sums: &[f32],
    cols: usize,
    dest: Dest,
    row0: usize,
    row_end: usize,
    col0: usize,
    col_end: usize,
) {
    let rows = row_end.saturating_sub(row0).min(sums.len() / cols);
    let used = (col_end - col0).min(cols);
    for j in 0..used {
        for i in 0..rows {
            dest.put(row0 + i, col0 + j, sums[i * cols + j]);
        }
    }
}
