//! The thread split of one matmul: chunks of weight rows claimed in turn by the pool's threads,
//! each computed into the thread's scratch and scattered into the `[n][m]` output.

use crate::kernels::cpu::simd_active;
use crate::kernels::dot::rows::TILE_ROWS;
use crate::kernels::operand::{Converted, DirectFn, RowsFn, RowsJob};
use crate::kernels::pool;

/// Work chunks per thread in a multi-threaded call (each row's result is the same whichever
/// chunk and thread computes it).
const CHUNKS_PER_THREAD: usize = 4;
/// Below this many weight bytes per thread, extra threads cost more than they save.
pub(crate) const MIN_BYTES_PER_THREAD: usize = 128 * 1024;
/// Weight rows per chunk when a call streams the weights once (decode): many small chunks
/// claimed in turn, so threads finish together instead of one waiting for the other's last
/// big chunk (ggml's decode chunks are 64 rows too).
pub(crate) const STREAM_CHUNK_ROWS: usize = 64;

/// `out` (`[n][m]`) shared by the chunk tasks of [`run_rows`], each writing only the columns of
/// its own weight rows.
struct SharedOut {
    ptr: *mut f32,
    m: usize,
    n: usize,
}

// SAFETY: the tasks write disjoint columns (see `scatter`), and `run_rows` holds the `&mut`
// borrow of the output for as long as any task runs.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// `out[r][first + i] = rows[i][r]` in cache-sized squares (one float per line otherwise).
    ///
    /// # Safety
    /// No other thread may write columns `first..first + rows.len() / n` meanwhile.
    unsafe fn scatter(&self, rows: &[f32], first: usize) {
        const SIDE: usize = 32;
        let (m, n) = (self.m, self.n);
        let count = rows.len() / n;
        assert!(first + count <= m);
        #[cfg(target_arch = "x86_64")]
        if simd_active() && count >= 8 && n >= 8 {
            // SAFETY: AVX2 detected; bounds as asserted above (the caller's contract).
            return unsafe { self.scatter_avx(rows, first, count) };
        }
        for i0 in (0..count).step_by(SIDE) {
            for r0 in (0..n).step_by(SIDE) {
                for i in i0..count.min(i0 + SIDE) {
                    for r in r0..n.min(r0 + SIDE) {
                        *self.ptr.add(r * m + first + i) = rows[i * n + r];
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl SharedOut {
    /// [`Self::scatter`] in 8 × 8 squares transposed in registers (whole vectors stored along
    /// each output row), the ragged edges one float at a time.
    ///
    /// # Safety
    /// AVX present; as [`Self::scatter`].
    #[target_feature(enable = "avx2")]
    unsafe fn scatter_avx(&self, rows: &[f32], first: usize, count: usize) {
        use std::arch::x86_64::*;
        let (m, n) = (self.m, self.n);
        let (c8, n8) = (count & !7, n & !7);
        unsafe {
            for i in (0..c8).step_by(8) {
                for r in (0..n8).step_by(8) {
                    let src = rows.as_ptr().add(i * n + r);
                    let v: [__m256; 8] = std::array::from_fn(|a| _mm256_loadu_ps(src.add(a * n)));
                    // 8 × 8 transpose: pairs, quads, then 128-bit halves
                    let t0 = _mm256_unpacklo_ps(v[0], v[1]);
                    let t1 = _mm256_unpackhi_ps(v[0], v[1]);
                    let t2 = _mm256_unpacklo_ps(v[2], v[3]);
                    let t3 = _mm256_unpackhi_ps(v[2], v[3]);
                    let t4 = _mm256_unpacklo_ps(v[4], v[5]);
                    let t5 = _mm256_unpackhi_ps(v[4], v[5]);
                    let t6 = _mm256_unpacklo_ps(v[6], v[7]);
                    let t7 = _mm256_unpackhi_ps(v[6], v[7]);
                    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                    let u1 = _mm256_shuffle_ps::<0xee>(t0, t2);
                    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                    let u3 = _mm256_shuffle_ps::<0xee>(t1, t3);
                    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                    let u5 = _mm256_shuffle_ps::<0xee>(t4, t6);
                    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                    let u7 = _mm256_shuffle_ps::<0xee>(t5, t7);
                    let cols = [
                        _mm256_permute2f128_ps::<0x20>(u0, u4),
                        _mm256_permute2f128_ps::<0x20>(u1, u5),
                        _mm256_permute2f128_ps::<0x20>(u2, u6),
                        _mm256_permute2f128_ps::<0x20>(u3, u7),
                        _mm256_permute2f128_ps::<0x31>(u0, u4),
                        _mm256_permute2f128_ps::<0x31>(u1, u5),
                        _mm256_permute2f128_ps::<0x31>(u2, u6),
                        _mm256_permute2f128_ps::<0x31>(u3, u7),
                    ];
                    for (b, c) in cols.iter().enumerate() {
                        _mm256_storeu_ps(self.ptr.add((r + b) * m + first + i), *c);
                    }
                }
                for r in n8..n {
                    for a in 0..8 {
                        *self.ptr.add(r * m + first + i + a) = rows[(i + a) * n + r];
                    }
                }
            }
            for i in c8..count {
                for r in 0..n {
                    *self.ptr.add(r * m + first + i) = rows[i * n + r];
                }
            }
        }
    }
}

/// Scratch kept per thread between calls up to this many floats (a prompt chunk's results),
/// so that a call does not fault fresh pages in; larger ones are freed after the call.
pub(crate) const SCRATCH_KEEP: usize = 256 * 1024;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[allow(clippy::too_many_arguments)]
/// Runs the plan's rows over up to `threads` threads, each chunk of weight rows computed into
/// the thread's scratch (`[rows][n]`) and scattered into `out` (`[n][m]`) by the same thread,
/// or, with a direct function, written straight into `out`.
pub(crate) fn run_rows(
    plan: &RowsPlan,
    w: &[u8],
    stride: usize,
    m: usize,
    k: usize,
    row_bytes: usize,
    act: &Converted,
    threads: usize,
    out: &mut [f32],
) {
    let RowsPlan {
        f, gemm, direct, ..
    } = *plan;
    let n = act.rows;
    assert_eq!(out.len(), m * n);
    let by_size = (m * row_bytes * n.min(8) / MIN_BYTES_PER_THREAD).max(1);
    let threads = threads.clamp(1, by_size.min(m.div_ceil(TILE_ROWS)));
    // a few chunks per thread, claimed in turn: a thread the OS preempts (a shared host)
    // leaves its remaining chunks to the others instead of stalling the call
    let per = if threads == 1 {
        m
    } else if n <= 2 {
        STREAM_CHUNK_ROWS.min(
            m.div_ceil(threads * CHUNKS_PER_THREAD)
                .next_multiple_of(TILE_ROWS),
        )
    } else if direct.is_some() {
        // one run of columns per thread: tasks writing neighbouring columns of every output
        // row share its cache lines at each boundary
        m.div_ceil(threads).next_multiple_of(TILE_ROWS)
    } else {
        m.div_ceil(threads * CHUNKS_PER_THREAD)
            .next_multiple_of(TILE_ROWS)
    };
    // chunks whose results fit the kept scratch (a direct function uses none)
    let per = if direct.is_some() {
        per
    } else {
        per.min((SCRATCH_KEEP / n.max(1)).next_multiple_of(TILE_ROWS))
    };
    let shared = SharedOut {
        ptr: out.as_mut_ptr(),
        m,
        n,
    };
    let task = |i: usize| {
        let first = i * per;
        let rows = per.min(m - first);
        if let Some(direct) = direct {
            // SAFETY: task i alone owns columns first..first + rows of the n × m output
            unsafe { direct(w, stride, first, rows, k, act, shared.ptr, m) };
            return;
        }
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            // grown, never cleared: the rows function writes every result
            if scratch.len() < rows * n {
                scratch.resize(rows * n, 0.0);
            }
            let results = &mut scratch[..rows * n];
            f(RowsJob::new(w, stride, first, k, act, results, gemm));
            // SAFETY: task i alone owns columns first..first + rows
            unsafe { shared.scatter(results, first) };
            if scratch.capacity() > SCRATCH_KEEP {
                *scratch = Vec::new();
            }
        });
    };
    pool::run(threads, m.div_ceil(per), &task);
}

/// The activation layout a rows function reads, chosen with it by [`super::plan::rows_for`] and prepared
/// once per matmul by [`super::plan::matmul_converted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// The converted rows as they are.
    Rows,
    /// Widened for the float tiles (`gemm::float::widen_activations`).
    Widened,
    /// Packed by eights for the tiled K-quant rows (`dot::kquant_gemm::pack`).
    KquantLanes,
    /// `gemm::q4k_paired`'s layout (one-row Q4_K with AVX-512).
    Q4kPaired,
    /// Laid out for the q8_0-family tiles (`gemm::q8::pack`); true: their AVX-512 VNNI ones.
    Q8Tiles(bool),
    /// f16 rows widened to f32 for `gemm::f16_rows` (`gemm::f16_rows::widen`).
    F16Wide,
}

/// How one matmul runs, chosen once by [`super::plan::rows_for`].
#[derive(Clone, Copy)]
pub(crate) struct RowsPlan {
    /// The per-thread rows function.
    pub(crate) f: RowsFn,
    /// It follows llamafile's order (tinyBLAS), not vec_dot's.
    pub(crate) gemm: bool,
    /// The activation layout `f` reads.
    pub(crate) layout: Layout,
    /// Widened float tiles: the function that writes straight into the output instead.
    pub(crate) direct: Option<DirectFn>,
}
