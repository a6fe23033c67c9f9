//! `out[n][m] = Σ_k w[m][k] · x[n][k]` for weights of any supported ggml type in block form and
//! float32 activations, computed like ggml's CPU backend: the activations are converted once
//! per call to the weight type's vec_dot type ([`super::act`]), then every (weight row,
//! activation row) pair gives one [`super::dot`] result.
//!
//! Weight rows are split over threads. Within a thread, weight rows are taken in tiles of
//! [`TILE_ROWS`] and each tile meets every activation row while it is in cache, so decode
//! (few activation rows) reads each weight byte once and prefill reuses each tile N times.
//!
//! Two builds of the same arithmetic: portable, and one compiled for AVX2+FMA+F16C chosen at
//! run time. Both perform the same float operations in the same order (bit-identical).

use std::sync::atomic::{AtomicBool, Ordering};

use super::act::ActFormat;
use super::dot::{self, RowDot};
use super::KernelError;
use super::{gemm_float, gemm_kquant, gemm_q8};

/// Most weight rows per tile.
pub const TILE_ROWS: usize = 16;
/// Activation rows per block (with a weight tile, a working set of L2 size).
const ACT_BLOCK: usize = 16;
/// Activation rows the multi-row kernels take per weight row (each weight block decoded once
/// for all of them; 64 q8_K rows of K = 4096 are 300 KB, L2-resident).
const GEMM_ACT_BLOCK: usize = 64;
/// Work chunks per thread in a multi-threaded call (each row's result is the same whichever
/// chunk and thread computes it).
const CHUNKS_PER_THREAD: usize = 4;
/// Below this many weight bytes per thread, extra threads cost more than they save.
const MIN_BYTES_PER_THREAD: usize = 128 * 1024;
/// Weight rows per chunk when a call streams the weights once (decode): many small chunks
/// claimed in turn, so threads finish together instead of one waiting for the other's last
/// big chunk (ggml's decode chunks are 64 rows too).
const STREAM_CHUNK_ROWS: usize = 64;

static FORCE_PORTABLE: AtomicBool = AtomicBool::new(false);

/// Forces the portable build (tests run both paths); also `RPCNET_PORTABLE_KERNELS=1`.
pub fn set_force_portable(on: bool) {
    FORCE_PORTABLE.store(on, Ordering::Relaxed);
}

fn portable_forced() -> bool {
    // The environment is read once: `getenv` on every kernel call showed in prefill profiles.
    static FROM_ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    FORCE_PORTABLE.load(Ordering::Relaxed)
        || *FROM_ENV
            .get_or_init(|| std::env::var_os("RPCNET_PORTABLE_KERNELS").is_some_and(|v| v == "1"))
}

static NO_AVX512: AtomicBool = AtomicBool::new(false);

/// Disables (false) or allows (true) the AVX-512 kernels, which otherwise run wherever the CPU
/// has them; also `RPCNET_NO_AVX512=1`. Same bits either way (A/B runs and tests).
pub fn set_avx512(on: bool) {
    NO_AVX512.store(!on, Ordering::Relaxed);
}

/// Whether the AVX-512 VNNI kernels run (on top of the SIMD build) on this CPU right now.
pub fn avx512_vnni_active() -> bool {
    static FROM_ENV: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = NO_AVX512.load(Ordering::Relaxed)
        || *FROM_ENV.get_or_init(|| std::env::var_os("RPCNET_NO_AVX512").is_some_and(|v| v == "1"));
    !off && simd_active() && avx512_vnni_available()
}

fn avx512_vnni_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether calls take the SIMD build on this CPU right now.
pub fn simd_active() -> bool {
    !portable_forced() && simd_available()
}

fn simd_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// What a kernel needs to know about one weight type.
#[derive(Debug, Clone, Copy)]
pub struct TypeInfo {
    pub block: usize,
    pub block_bytes: usize,
    pub act: ActFormat,
}

macro_rules! for_type {
    ($type_id:expr, $d:ident => $body:expr, $none:expr) => {
        match $type_id {
            0 => {
                type $d = dot::F32;
                $body
            }
            1 => {
                type $d = dot::F16;
                $body
            }
            2 => {
                type $d = dot::Q4_0;
                $body
            }
            3 => {
                type $d = dot::Q4_1;
                $body
            }
            6 => {
                type $d = dot::Q5_0;
                $body
            }
            7 => {
                type $d = dot::Q5_1;
                $body
            }
            8 => {
                type $d = dot::Q8_0;
                $body
            }
            10 => {
                type $d = dot::Q2K;
                $body
            }
            11 => {
                type $d = dot::Q3K;
                $body
            }
            12 => {
                type $d = dot::Q4K;
                $body
            }
            13 => {
                type $d = dot::Q5K;
                $body
            }
            14 => {
                type $d = dot::Q6K;
                $body
            }
            20 => {
                type $d = dot::IQ4NL;
                $body
            }
            23 => {
                type $d = dot::IQ4XS;
                $body
            }
            30 => {
                type $d = dot::BF16;
                $body
            }
            39 => {
                type $d = dot::MXFP4;
                $body
            }
            _ => $none,
        }
    };
}

/// Block facts of a supported weight type (ggml type id), `None` when unsupported.
pub fn type_info(type_id: u32) -> Option<TypeInfo> {
    for_type!(type_id, D => Some(TypeInfo {
        block: D::BLOCK,
        block_bytes: D::BLOCK_BYTES,
        act: D::ACT,
    }), None)
}

/// Activation values from which their conversion is split over threads.
const PARALLEL_CONVERT_MIN: usize = 1 << 15;

/// The whole rows of `x` (`k` values each) converted by `work` (a run of rows into as many
/// `row_bytes` rows) into a zeroed buffer, split over up to `threads` threads for large batches;
/// with the row count.
pub fn convert_rows(
    x: &[f32],
    k: usize,
    row_bytes: usize,
    threads: usize,
    work: impl Fn(&[f32], &mut [u8]) + Sync,
) -> (Vec<u8>, usize) {
    let rows = x.len() / k.max(1);
    let mut data = vec![0u8; rows * row_bytes];
    if threads < 2 || rows < 2 || x.len() < PARALLEL_CONVERT_MIN {
        work(&x[..rows * k], &mut data);
    } else {
        let per = rows.div_ceil(threads);
        let parts: Vec<(&[f32], &mut [u8])> = x[..rows * k]
            .chunks(per * k)
            .zip(data.chunks_mut(per * row_bytes))
            .collect();
        super::pool::for_each(threads, parts, |_, (xs, out)| work(xs, out));
    }
    (data, rows)
}

/// Activation rows converted to a vec_dot type, `row_bytes` apart.
pub struct Converted {
    pub data: Vec<u8>,
    pub row_bytes: usize,
    pub rows: usize,
}

impl Converted {
    pub fn new(fmt: ActFormat, x: &[f32], k: usize) -> Self {
        Self::new_par(fmt, x, k, 1)
    }

    /// [`Self::new`] with the rows split over up to `threads` threads (large batches only).
    pub fn new_par(fmt: ActFormat, x: &[f32], k: usize, threads: usize) -> Self {
        let row_bytes = fmt.row_bytes(k);
        let (data, rows) = convert_rows(x, k, row_bytes, threads, |xs, out| {
            for (xr, or) in xs.chunks_exact(k).zip(out.chunks_exact_mut(row_bytes)) {
                fmt.convert_row(xr, or);
            }
        });
        Self {
            data,
            row_bytes,
            rows,
        }
    }

    pub(crate) fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

/// Weight rows `first..first + out.len() / rows` against every activation row;
/// `out[(i - first) * rows + r]`.
#[inline(always)]
fn rows_impl<D: RowDot, const SIMD: bool>(
    w: &[u8],
    stride: usize,
    first: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
    gemm: bool,
) {
    let n = act.rows;
    let wrow_bytes = k / D::BLOCK * D::BLOCK_BYTES;
    let rows_total = out.len() / n.max(1);
    let dot1 = |i: usize, r: usize| -> f32 {
        let at = (first + i) * stride;
        let wr = &w[at..at + wrow_bytes];
        if SIMD {
            // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection.
            unsafe { D::dot_simd(wr, act.row(r), k) }
        } else {
            D::dot(wr, act.row(r), k)
        }
    };
    if gemm {
        // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection; the K-quant
        // activations were packed (`Layout::KquantLanes`, prepared by `matmul_converted`).
        if SIMD && unsafe { D::tiled_rows_simd(w, stride, first, k, act, out) } {
            return;
        }
        // the multi-row kernels decode each weight block once for a block of activation rows
        for r0 in (0..n).step_by(GEMM_ACT_BLOCK) {
            let r1 = n.min(r0 + GEMM_ACT_BLOCK);
            let xs: Vec<&[u8]> = (r0..r1).map(|r| act.row(r)).collect();
            let mut i = 0;
            if SIMD {
                // four weight rows per pass: each activation block is loaded once for four
                while i + 4 <= rows_total {
                    let ws: [&[u8]; 4] = std::array::from_fn(|j| {
                        let at = (first + i + j) * stride;
                        &w[at..at + wrow_bytes]
                    });
                    let dst = &mut out[i * n + r0..(i + 3) * n + r1];
                    // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection.
                    unsafe { D::dot_gemm_rows4_simd(ws, &xs, k, dst, n) };
                    i += 4;
                }
            }
            for i in i..rows_total {
                let at = (first + i) * stride;
                let wr = &w[at..at + wrow_bytes];
                let dst = &mut out[i * n + r0..i * n + r1];
                if SIMD {
                    // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection.
                    unsafe { D::dot_gemm_rows_simd(wr, &xs, k, dst) }
                } else {
                    D::dot_gemm_rows(wr, &xs, k, dst)
                }
            }
        }
        return;
    }
    // Blocks of activation rows × tiles of weight rows, both cache-sized, so each weight tile is
    // reused by a block of activation rows and each block by every tile (read once for decode).
    for r0 in (0..n).step_by(ACT_BLOCK) {
        let r1 = n.min(r0 + ACT_BLOCK);
        for i0 in (0..rows_total).step_by(TILE_ROWS) {
            let i1 = rows_total.min(i0 + TILE_ROWS);
            let mut r = r0;
            if SIMD {
                // four activation rows per pass: each weight block decoded once for all four
                while r + 4 <= r1 {
                    let xs = [act.row(r), act.row(r + 1), act.row(r + 2), act.row(r + 3)];
                    for i in i0..i1 {
                        let at = (first + i) * stride;
                        // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection.
                        let res = unsafe { D::dot_simd4(&w[at..at + wrow_bytes], xs, k) };
                        out[i * n + r..i * n + r + 4].copy_from_slice(&res);
                    }
                    r += 4;
                }
                // and a pair (GQA decode: two query heads per KV head)
                if r + 2 <= r1 {
                    let xs = [act.row(r), act.row(r + 1)];
                    for i in i0..i1 {
                        let at = (first + i) * stride;
                        // SAFETY: as above.
                        let res = unsafe { D::dot_simd2(&w[at..at + wrow_bytes], xs, k) };
                        out[i * n + r..i * n + r + 2].copy_from_slice(&res);
                    }
                    r += 2;
                }
            }
            for r in r..r1 {
                for i in i0..i1 {
                    out[i * n + r] = dot1(i, r);
                }
            }
        }
    }
}

fn rows_portable<D: RowDot>(
    w: &[u8],
    stride: usize,
    first: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
    gemm: bool,
) {
    rows_impl::<D, false>(w, stride, first, k, act, out, gemm)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2<D: RowDot>(
    w: &[u8],
    stride: usize,
    first: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
    gemm: bool,
) {
    rows_impl::<D, true>(w, stride, first, k, act, out, gemm)
}

pub type RowsFn = fn(&[u8], usize, usize, usize, &Converted, &mut [f32], bool);

fn rows_fn<D: RowDot>() -> RowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if simd_active() {
            return |w, s, f, k, a, o, g| {
                // SAFETY: simd_active() checked AVX2, FMA and F16C on this CPU.
                unsafe { rows_avx2::<D>(w, s, f, k, a, o, g) }
            };
        }
    }
    rows_portable::<D>
}

/// Checks sizes; returns the weight row bytes.
pub(crate) fn check(
    info: TypeInfo,
    w_len: usize,
    row_stride: usize,
    m: usize,
    k: usize,
    x_len: usize,
    out_len: usize,
) -> Result<usize, KernelError> {
    if k == 0 || !k.is_multiple_of(info.block) || !k.is_multiple_of(info.act.block()) {
        return Err(KernelError::new(format!(
            "K = {k} is not a positive multiple of the block ({})",
            info.block.max(info.act.block())
        )));
    }
    if !x_len.is_multiple_of(k) {
        return Err(KernelError::new(format!(
            "{x_len} activation values are not rows of K = {k}"
        )));
    }
    let row_bytes = k / info.block * info.block_bytes;
    if m > 1 && row_stride < row_bytes {
        return Err(KernelError::new(format!(
            "row stride {row_stride} is shorter than a row ({row_bytes} bytes)"
        )));
    }
    let need = match m {
        0 => 0,
        _ => (m - 1)
            .checked_mul(row_stride)
            .and_then(|v| v.checked_add(row_bytes))
            .ok_or_else(|| KernelError::new("weight extent overflows"))?,
    };
    if w_len < need {
        return Err(KernelError::new(format!(
            "weights hold {w_len} bytes, {m} rows need {need}"
        )));
    }
    let n = x_len / k;
    if out_len != n * m {
        return Err(KernelError::new(format!(
            "output holds {out_len} values, expected {n} × {m}"
        )));
    }
    Ok(row_bytes)
}

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
const SCRATCH_KEEP: usize = 256 * 1024;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A rows function that writes weight rows `first..first + rows` straight into the `[n][m]`
/// output (w, stride, first, rows, k, act, out, m).
///
/// # Safety
/// `out` is valid for `n × m` floats and the caller alone writes those columns.
pub(crate) type DirectFn =
    unsafe fn(&[u8], usize, usize, usize, usize, &Converted, *mut f32, usize);

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
            f(w, stride, first, k, act, results, gemm);
            // SAFETY: task i alone owns columns first..first + rows
            unsafe { shared.scatter(results, first) };
            if scratch.capacity() > SCRATCH_KEEP {
                *scratch = Vec::new();
            }
        });
    };
    super::pool::run(threads, m.div_ceil(per), &task);
}

/// The activation layout a rows function reads, chosen with it by [`rows_for`] and prepared
/// once per matmul by [`matmul_converted`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// The converted rows as they are.
    Rows,
    /// Widened for [`gemm_float`] ([`gemm_float::widen_activations`]).
    Widened,
    /// Packed by eights for [`gemm_kquant`] ([`gemm_kquant::pack`]).
    KquantLanes,
    /// [`super::q4k_paired`]'s layout (one-row Q4_K with AVX-512).
    Q4kPaired,
    /// Laid out for [`gemm_q8`]'s tiles ([`gemm_q8::pack`]); true: its AVX-512 VNNI ones.
    Q8Tiles(bool),
    /// f16 rows widened to f32 for [`super::f16_rows`] ([`super::f16_rows::widen`]).
    F16Wide,
}

/// How one matmul runs, chosen once by [`rows_for`].
#[derive(Clone, Copy)]
pub(crate) struct RowsPlan {
    /// The per-thread rows function.
    f: RowsFn,
    /// It follows llamafile's order (tinyBLAS), not vec_dot's.
    gemm: bool,
    /// The activation layout `f` reads.
    layout: Layout,
    /// Widened float tiles: the function that writes straight into the output instead.
    direct: Option<DirectFn>,
}

/// The plan for `n` activation rows against `m` weight rows of a supported type: float
/// weights in llamafile's order take [`gemm_float`], whose activations must be widened with
/// [`gemm_float::widen_activations`] and which may store straight into the output.
pub(crate) fn rows_for(type_id: u32, m: usize, n: usize, llamafile: bool) -> RowsPlan {
    let (f, gemm, layout) = rows_and_layout(type_id, m, n, llamafile);
    let direct = match layout {
        Layout::Widened => gemm_float::direct_fn(type_id, n),
        _ => None,
    };
    RowsPlan {
        f,
        gemm,
        layout,
        direct,
    }
}

/// [`rows_for`]'s choice of rows function, order and layout.
fn rows_and_layout(type_id: u32, m: usize, n: usize, llamafile: bool) -> (RowsFn, bool, Layout) {
    // ggml's MUL_MAT hands N >= 2 to llamafile's tinyBLAS: f32/f16/bf16 when M % 4 == 0, the
    // q8_0-family at any M (only IQ4_NL sums differently there from vec_dot)
    let gemm = match type_id {
        0 | 1 | 30 => llamafile && n >= 2 && m.is_multiple_of(4),
        20 => llamafile && n >= 2,
        // ggml's tiled K-quant kernel (super::kquant_tiles) from 8 activation rows on, in
        // MUL_MAT (rows of one batch) and MUL_MAT_ID (rows routed to one expert) alike
        10..=14 | 23 => n >= super::kquant_tiles::TILED_MIN_ROWS,
        _ => false,
    };
    if gemm && gemm_float::serves(type_id) {
        return (gemm_float::rows_fn(type_id), true, Layout::Widened);
    }
    if gemm_q8::serves(type_id, n) {
        // decided once here: the packing and the tiles must agree; under 4 rows the VNNI
        // tile (4 activation rows) mostly computes padding
        let vnni = n >= 4 && avx512_vnni_active();
        return (gemm_q8::rows_fn(type_id, vnni), gemm, Layout::Q8Tiles(vnni));
    }
    if !gemm && super::q4k_paired::serves(type_id, n) {
        let f = rows_fn::<super::q4k_paired::Q4KPaired>();
        return (f, false, Layout::Q4kPaired);
    }
    if !gemm && type_id == 1 && super::f16_rows::serves() {
        return (super::f16_rows::rows, false, Layout::F16Wide);
    }
    let layout = if gemm && gemm_kquant::serves(type_id) {
        Layout::KquantLanes
    } else {
        Layout::Rows
    };
    (
        for_type!(type_id, D => rows_fn::<D>(), unreachable!()),
        gemm,
        layout,
    )
}

#[allow(clippy::too_many_arguments)]
/// Weight rows (ggml type `type_id`, `m` rows `row_stride` bytes apart, `k` values each) times
/// converted activations `act`; `out` is `act.rows × m` row-major. `llamafile`: follow ggml's
/// MUL_MAT dispatch, which sends N >= 2 to llamafile's tinyBLAS (another summation order for
/// f32/f16/bf16 when M % 4 == 0, and for IQ4_NL); false for MUL_MAT_ID (vec_dot). K-quant and
/// IQ4_XS weights take ggml's tiled order from 8 rows on either way (`act.rows` must then be
/// the rows of ONE ggml batch or expert: ggml decides per src1 batch / per expert).
pub fn matmul_converted(
    type_id: u32,
    w: &[u8],
    row_stride: usize,
    m: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
    threads: usize,
    llamafile: bool,
) -> Result<(), KernelError> {
    let info = type_info(type_id)
        .ok_or_else(|| KernelError::new(format!("weight type {type_id} is not supported")))?;
    let row_bytes = check(info, w.len(), row_stride, m, k, act.rows * k, out.len())?;
    if act.row_bytes != info.act.row_bytes(k) {
        return Err(KernelError::new("activations converted to another format"));
    }
    if m == 0 || act.rows == 0 {
        return Ok(());
    }
    let plan = rows_for(type_id, m, act.rows, llamafile);
    let prepared;
    let act = match plan.layout {
        Layout::Rows => act,
        Layout::Widened => {
            prepared = gemm_float::widen_activations(act, info.act, k);
            &prepared
        }
        Layout::KquantLanes => {
            prepared = gemm_kquant::pack(act, k);
            &prepared
        }
        Layout::Q8Tiles(vnni) => {
            prepared = gemm_q8::pack(act, type_id, vnni);
            &prepared
        }
        Layout::Q4kPaired => {
            prepared = super::q4k_paired::pack(act, k);
            &prepared
        }
        Layout::F16Wide => {
            prepared = super::f16_rows::widen(act, k);
            &prepared
        }
    };
    run_rows(&plan, w, row_stride, m, k, row_bytes, act, threads, out);
    Ok(())
}

/// The type's info and its row bytes, once the sizes are checked ([`check`]).
fn checked(
    type_id: u32,
    w: &[u8],
    row_stride: usize,
    m: usize,
    k: usize,
    x_len: usize,
    out_len: usize,
) -> Result<(TypeInfo, usize), KernelError> {
    let info = type_info(type_id)
        .ok_or_else(|| KernelError::new(format!("weight type {type_id} is not supported")))?;
    Ok((
        info,
        check(info, w.len(), row_stride, m, k, x_len, out_len)?,
    ))
}

/// [`matmul_converted`] from float32 activations `x` (`n × k` row-major), converted here.
#[allow(clippy::too_many_arguments)]
pub fn matmul_quant(
    type_id: u32,
    w: &[u8],
    row_stride: usize,
    m: usize,
    k: usize,
    x: &[f32],
    out: &mut [f32],
    threads: usize,
    llamafile: bool,
) -> Result<(), KernelError> {
    let (info, row_bytes) = checked(type_id, w, row_stride, m, k, x.len(), out.len())?;
    let n = x.len() / k.max(1);
    let plan = rows_for(type_id, m, n, llamafile);
    if plan.layout == Layout::Widened && m > 0 && n > 0 {
        // straight to the widened rows tinyBLAS's order runs on
        let wide = gemm_float::widen_rows(info.act, x, k, threads);
        run_rows(&plan, w, row_stride, m, k, row_bytes, &wide, threads, out);
        return Ok(());
    }
    let act = Converted::new_par(info.act, x, k, threads);
    matmul_converted(type_id, w, row_stride, m, k, &act, out, threads, llamafile)
}

/// Few activation rows, each computed by the single-row kernels (`dot_simd`, and its two- and
/// four-row forms that keep each row's bits) over tiles of weight rows that stay in cache while
/// every row meets them: the weights are read from memory once, and each row's result has the
/// bits one row alone gets (vec_dot order; never the prefill tiles).
#[allow(clippy::too_many_arguments)]
pub fn matmul_each_row(
    type_id: u32,
    w: &[u8],
    row_stride: usize,
    m: usize,
    k: usize,
    x: &[f32],
    out: &mut [f32],
    threads: usize,
) -> Result<(), KernelError> {
    let (info, row_bytes) = checked(type_id, w, row_stride, m, k, x.len(), out.len())?;
    if m == 0 || x.is_empty() {
        return Ok(());
    }
    if type_id == 1 && super::f16_rows::serves() {
        // f16 rows against widened activations: the single-row product's bits (f16_rows)
        let plan = RowsPlan {
            f: super::f16_rows::rows,
            gemm: false,
            layout: Layout::F16Wide,
            direct: None,
        };
        let act = super::f16_rows::widen(&Converted::new_par(info.act, x, k, threads), k);
        run_rows(&plan, w, row_stride, m, k, row_bytes, &act, threads, out);
        return Ok(());
    }
    let plan = RowsPlan {
        f: for_type!(type_id, D => rows_fn::<D>(), unreachable!()),
        gemm: false,
        layout: Layout::Rows,
        direct: None,
    };
    let act = Converted::new_par(info.act, x, k, threads);
    run_rows(&plan, w, row_stride, m, k, row_bytes, &act, threads, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::fp16_to_f32;
    use crate::kernels::test_util::{noise, weights};

    const TYPES: [u32; 16] = [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30, 39];

    #[test]
    fn portable_and_simd_agree_bitwise() {
        for &t in &TYPES {
            let (m, k, n) = (37, 512, 3);
            let w = weights(t, m, k, 5 + t as u64);
            let x = noise(7, n * k);
            let info = type_info(t).unwrap();
            let row = k / info.block * info.block_bytes;
            let mut a = vec![0.0f32; n * m];
            let mut b = vec![0.0f32; n * m];
            let act = Converted::new(info.act, &x, k);
            for_type!(t, D => {
                rows_portable::<D>(&w, row, 0, k, &act, &mut a, false);
                rows_fn::<D>()(&w, row, 0, k, &act, &mut b, false);
            }, unreachable!());
            assert_eq!(a, b, "type {t}");
            assert!(a.iter().all(|v| v.is_finite()), "type {t}");
        }
    }

    /// The f16 kernels that share each weight vector among two or four activation rows keep
    /// each row's sum (leftover elements past a multiple of 32 included).
    #[test]
    fn f16_multi_row_dots_keep_each_rows_bits() {
        for n in [2usize, 3, 5, 6] {
            let (m, k) = (9, 200);
            let w = weights(1, m, k, 21);
            let x = noise(23, n * k);
            let act = Converted::new(ActFormat::F16, &x, k);
            let (mut a, mut b) = (vec![0.0f32; n * m], vec![0.0f32; n * m]);
            rows_portable::<super::super::dot::F16>(&w, 2 * k, 0, k, &act, &mut a, false);
            rows_fn::<super::super::dot::F16>()(&w, 2 * k, 0, k, &act, &mut b, false);
            assert_eq!(a, b, "n {n}");
        }
    }

    #[test]
    fn tiled_kquant_rows_agree_across_builds_and_row_counts() {
        for t in [10u32, 11, 12, 13, 14, 23] {
            let (m, k, n) = (21, 768, 70);
            let w = weights(t, m, k, 3 + t as u64);
            let x = noise(9, n * k);
            let info = type_info(t).unwrap();
            let row = k / info.block * info.block_bytes;
            let act = Converted::new(info.act, &x, k);
            let mut a = vec![0.0f32; n * m];
            let mut b = vec![0.0f32; n * m];
            for_type!(t, D => {
                rows_portable::<D>(&w, row, 0, k, &act, &mut a, true);
                // the AVX2 rows take the packed activations (as `matmul_converted` gives them)
                let packed = gemm_kquant::serves(t).then(|| gemm_kquant::pack(&act, k));
                rows_fn::<D>()(&w, row, 0, k, packed.as_ref().unwrap_or(&act), &mut b, true);
                // one row at a time (`dot_gemm`) gives the same bits as the row blocks
                for i in [0, m - 1] {
                    for r in [0, 63, 64, n - 1] {
                        let single = D::dot_gemm(&w[i * row..(i + 1) * row], act.row(r), k);
                        assert_eq!(single.to_bits(), a[i * n + r].to_bits(), "type {t}");
                    }
                }
            }, unreachable!());
            assert_eq!(a, b, "type {t}");
            assert!(a.iter().all(|v| v.is_finite()), "type {t}");
        }
    }

    #[test]
    fn threads_and_strides_do_not_change_results() {
        for &t in &TYPES {
            let (m, k, n) = (70, 256, 2);
            let info = type_info(t).unwrap();
            let row = k / info.block * info.block_bytes;
            let dense = weights(t, m, k, 11);
            let stride = row + 6;
            let mut w = vec![0x55u8; (m - 1) * stride + row];
            for i in 0..m {
                w[i * stride..i * stride + row].copy_from_slice(&dense[i * row..(i + 1) * row]);
            }
            let x = noise(13, n * k);
            let mut one = vec![0.0f32; n * m];
            let mut many = vec![0.0f32; n * m];
            matmul_quant(t, &dense, row, m, k, &x, &mut one, 1, true).unwrap();
            matmul_quant(t, &w, stride, m, k, &x, &mut many, 3, true).unwrap();
            assert_eq!(one, many, "type {t}");
        }
    }

    #[test]
    fn q8_0_close_to_f64() {
        let (m, k) = (5, 96);
        let w = weights(8, m, k, 3);
        let x = noise(4, k);
        let mut out = vec![0.0f32; m];
        matmul_quant(8, &w, 34 * 3, m, k, &x, &mut out, 1, true).unwrap();
        let act = Converted::new(ActFormat::Q8_0, &x, k);
        for i in 0..m {
            let mut s = 0.0f64;
            for b in 0..3 {
                let wb = &w[i * 102 + 34 * b..];
                let yb = &act.data[34 * b..];
                let dw = fp16_to_f32(u16::from_le_bytes([wb[0], wb[1]])) as f64;
                let dy = fp16_to_f32(u16::from_le_bytes([yb[0], yb[1]])) as f64;
                for j in 0..32 {
                    s += dw * dy * (wb[2 + j] as i8 as f64) * (yb[2 + j] as i8 as f64);
                }
            }
            assert!(
                (out[i] as f64 - s).abs() <= 1e-5 * s.abs().max(1.0),
                "{} {s}",
                out[i]
            );
        }
    }

    #[test]
    fn rejects_bad_sizes() {
        let w = vec![0u8; 34 * 4];
        let x = vec![0.0f32; 64];
        let mut out = vec![0.0f32; 2];
        assert!(matmul_quant(8, &w, 68, 2, 64, &x, &mut out, 1, true).is_ok());
        assert!(matmul_quant(8, &w, 68, 3, 64, &x, &mut out, 1, true).is_err());
        assert!(matmul_quant(8, &w, 60, 2, 64, &x, &mut out, 1, true).is_err());
        assert!(matmul_quant(8, &w, 68, 2, 48, &x, &mut out, 1, true).is_err());
        assert!(matmul_quant(12, &w, 68, 2, 64, &x, &mut out, 1, true).is_err());
        assert!(matmul_quant(99, &w, 68, 2, 64, &x, &mut out, 1, true).is_err());
        assert!(matmul_quant(8, &w, 68, 2, 64, &x, &mut out[..1], 1, true).is_err());
    }
}
