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

use super::act::ActFormat;
use super::dot::hsum8;
use super::fp16_to_f32;
use super::matmul::{simd_active, Converted, RowsFn};

/// Weight rows per micro-tile and activation rows per micro-tile.
const MR: usize = 4;
const NR: usize = 3;
/// Bytes of widened weight rows kept at once (half of a 512 KiB L2).
const PANEL_BYTES: usize = 192 * 1024;
/// Bytes of activation rows walked per panel (the rest of L2).
const XBLOCK_BYTES: usize = 256 * 1024;

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
        simd_active() && super::matmul::avx512_vnni_active()
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// [`widen_activations`] of the conversion of float32 rows `x`, without the converted
/// intermediate: each row converted and widened in turn, the rows split over up to `threads`.
pub fn widen_rows(fmt: ActFormat, x: &[f32], k: usize, threads: usize) -> Converted {
    let kp = k.next_multiple_of(8);
    let width = act_width(fmt);
    let (data, rows) = super::matmul::convert_rows(x, k, kp * width, threads, |xs, out| {
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

#[inline(always)]
fn element(fmt: ActFormat, b: &[u8], i: usize) -> f32 {
    match fmt {
        ActFormat::F16 => fp16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])),
        ActFormat::BF16 => {
            f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
        }
        _ => f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]),
    }
}

fn weight_format(type_id: u32) -> ActFormat {
    match type_id {
        1 => ActFormat::F16,
        30 => ActFormat::BF16,
        _ => ActFormat::F32,
    }
}

/// The per-thread rows function for [`super::matmul`]'s thread split: `act` must come from
/// [`widen_activations`].
pub fn rows_fn(type_id: u32) -> RowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if simd_active() {
            if type_id == 1 && super::matmul::avx512_vnni_active() {
                return |w, s, f, k, a, o, _| avx512::rows_f16_entry(w, s, f, k, a, o);
            }
            return match type_id {
                1 => |w, s, f, k, a, o, _| unsafe_rows_avx2(ActFormat::F16, w, s, f, k, a, o),
                30 => |w, s, f, k, a, o, _| unsafe_rows_avx2(ActFormat::BF16, w, s, f, k, a, o),
                _ => |w, s, f, k, a, o, _| unsafe_rows_avx2(ActFormat::F32, w, s, f, k, a, o),
            };
        }
    }
    match weight_format(type_id) {
        ActFormat::F16 => |w, s, f, k, a, o, _| rows::<false>(ActFormat::F16, w, s, f, k, a, o),
        ActFormat::BF16 => |w, s, f, k, a, o, _| rows::<false>(ActFormat::BF16, w, s, f, k, a, o),
        _ => |w, s, f, k, a, o, _| rows::<false>(ActFormat::F32, w, s, f, k, a, o),
    }
}

/// The rows function that writes straight into the `[n][m]` output, where this type and row
/// count have one ([`super::matmul::DirectFn`]).
pub(crate) fn direct_fn(type_id: u32, n: usize) -> Option<super::matmul::DirectFn> {
    #[cfg(target_arch = "x86_64")]
    {
        if type_id == 1 && n >= avx512::MIN_ROWS && super::matmul::avx512_vnni_active() {
            return Some(avx512::rows_f16_direct);
        }
    }
    let _ = (type_id, n);
    None
}

#[cfg(target_arch = "x86_64")]
fn unsafe_rows_avx2(
    fmt: ActFormat,
    w: &[u8],
    stride: usize,
    first: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
) {
    // SAFETY: only chosen by `rows_fn` after simd_active() checked AVX2, FMA and F16C.
    unsafe { rows_avx2(fmt, w, stride, first, k, act, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2(
    fmt: ActFormat,
    w: &[u8],
    stride: usize,
    first: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
) {
    rows::<true>(fmt, w, stride, first, k, act, out)
}

/// Weight rows `first..first + out.len() / n` (type `fmt`, `stride` bytes apart) against every
/// widened activation row; `out[(i - first) * n + r]`.
#[inline(always)]
fn rows<const SIMD: bool>(
    fmt: ActFormat,
    w: &[u8],
    stride: usize,
    first: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
) {
    let n = act.rows;
    if n == 0 {
        return;
    }
    let kp = k.next_multiple_of(8);
    // f16 activations arrive as f16 (see `act_width`), the others widened
    let half = act.row_bytes == kp * 2;
    assert!(half == (fmt == ActFormat::F16) || act.row_bytes == kp * 4);
    assert!(kp >= 8 && act.data.len() >= n * act.row_bytes);
    let x: Vec<f32> = if SIMD {
        Vec::new() // read in place below
    } else if half {
        act.data
            .chunks_exact(2)
            .map(|b| fp16_to_f32(u16::from_le_bytes([b[0], b[1]])))
            .collect()
    } else {
        act.data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    #[cfg(target_arch = "x86_64")]
    if SIMD && half {
        // SAFETY: SIMD is only true inside `rows_avx2` (AVX2, FMA, F16C present).
        return unsafe { rows_f16_simd(w, stride, first, k, kp, act, out) };
    }
    let rows_total = out.len() / n;
    let panel_rows = (PANEL_BYTES / (kp * 4)).clamp(MR, 16) / MR * MR;
    let xblock = ((XBLOCK_BYTES / (kp * 4)).max(NR) / NR * NR).min(n.next_multiple_of(NR));
    let mut panel = vec![0.0f32; panel_rows * kp];
    let elem = fmt.block_bytes();
    for t0 in (0..rows_total).step_by(panel_rows) {
        let t1 = rows_total.min(t0 + panel_rows);
        for (j, dst) in panel.chunks_exact_mut(kp).enumerate() {
            dst.fill(0.0);
            if t0 + j < t1 {
                let at = (first + t0 + j) * stride;
                widen_row::<SIMD>(fmt, &w[at..at + k * elem], &mut dst[..k]);
            }
        }
        for r0 in (0..n).step_by(xblock) {
            let r1 = n.min(r0 + xblock);
            for q in (0..t1 - t0).step_by(MR) {
                let p = &panel[q * kp..(q + MR) * kp];
                for r in (r0..r1).step_by(NR) {
                    // rows past the block repeat its last row; their results are dropped
                    let xr: [usize; NR] = std::array::from_fn(|j| (r + j).min(r1 - 1));
                    let res = if SIMD {
                        // SAFETY: SIMD is only true inside `rows_avx2`.
                        unsafe { tile_simd(p, &act.data, xr, kp) }
                    } else {
                        tile_portable(p, &x, xr, kp)
                    };
                    store_tile(out, &res, t0 + q, t1, n, r, r1);
                }
            }
        }
    }
}

/// Weight rows and activation rows per register tile of the f16 kernel (its conversions take
/// registers the f32 tile's memory operands do not).
const MR16: usize = 3;
const NR16: usize = 3;
/// Cache lines of the next tile's weight rows prefetched per tile step.
const PREFETCH_LINES: usize = 4;

/// [`rows`] for f16 weights and f16 activation rows (`kp` values each, zero-padded): the
/// panel keeps the weights' f16 bits, the tile converts both operands in registers. The same
/// FMAs in the same order as the widened path (f16 values are exact in f32).
///
/// # Safety
/// AVX2, FMA and F16C present.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows_f16_simd(
    w: &[u8],
    stride: usize,
    first: usize,
    k: usize,
    kp: usize,
    act: &Converted,
    out: &mut [f32],
) {
    let n = act.rows;
    let rows_total = out.len() / n;
    let panel_rows = (PANEL_BYTES / (kp * 2)).clamp(MR16, 32) / MR16 * MR16;
    let xblock = ((XBLOCK_BYTES / (kp * 2)).max(NR16) / NR16 * NR16).min(n.next_multiple_of(NR16));
    // Rows whose K is a multiple of 8 are read where they are; only a ragged K needs the
    // zero-padded copy (copying every row cost ~4 % of an f16 prompt, mostly DRAM stalls).
    let in_place = k == kp;
    let mut panel = vec![0u16; if in_place { 0 } else { panel_rows * kp }];
    assert!(rows_total == 0 || w.len() >= (first + rows_total - 1) * stride + 2 * k);
    let x = act.data.as_ptr() as *const u16;
    for t0 in (0..rows_total).step_by(panel_rows) {
        let t1 = rows_total.min(t0 + panel_rows);
        if !in_place {
            for (j, dst) in panel.chunks_exact_mut(kp).enumerate() {
                dst.fill(0);
                if t0 + j < t1 {
                    let at = (first + t0 + j) * stride;
                    for (d, b) in dst[..k].iter_mut().zip(w[at..at + 2 * k].chunks_exact(2)) {
                        *d = u16::from_le_bytes([b[0], b[1]]);
                    }
                }
            }
        }
        for r0 in (0..n).step_by(xblock) {
            let r1 = n.min(r0 + xblock);
            for q in (0..t1 - t0).step_by(MR16) {
                // rows past the panel repeat its last row; their results are dropped
                let ws: [*const u16; MR16] = std::array::from_fn(|i| {
                    let row = (t0 + q + i).min(t1 - 1);
                    if in_place {
                        w[(first + row) * stride..].as_ptr() as *const u16
                    } else {
                        panel[(row - t0) * kp..].as_ptr()
                    }
                });
                // the next tile's weight rows, a few lines per step, so that its first pass
                // does not wait for DRAM (in place only: a panel is already in cache)
                let next = t0 + q + MR16;
                let ahead = if in_place && r0 == 0 && next < rows_total {
                    w[(first + next) * stride..].as_ptr()
                } else {
                    std::ptr::null()
                };
                let ahead_len = (rows_total - next.min(rows_total)).min(MR16) * stride;
                for (step, r) in (r0..r1).step_by(NR16).enumerate() {
                    if !ahead.is_null() {
                        for line in 0..PREFETCH_LINES {
                            let off = (step * PREFETCH_LINES + line) * 64;
                            if off < ahead_len {
                                // SAFETY: a hint inside the weight rows; never faults.
                                unsafe { avx2::prefetch(ahead.add(off)) };
                            }
                        }
                    }
                    let xr: [usize; NR16] = std::array::from_fn(|j| (r + j).min(r1 - 1));
                    // SAFETY: rows of kp values inside the weights (or panel) and activations.
                    let res = unsafe { avx2::tile_f16(ws, xr.map(|j| x.add(j * kp)), kp) };
                    store_tile(out, &res, t0 + q, t1, n, r, r1);
                }
            }
        }
    }
}

/// The AVX2 MR × NR tile on activation rows `xr` of the widened bytes `x`.
///
/// # Safety
/// AVX2, FMA and F16C present.
#[inline(always)]
unsafe fn tile_simd(p: &[f32], x: &[u8], xr: [usize; NR], kp: usize) -> [[f32; NR]; MR] {
    assert!(p.len() >= MR * kp && xr.iter().all(|&r| x.len() >= (r + 1) * kp * 4));
    #[cfg(target_arch = "x86_64")]
    {
        let xs = xr.map(|r| x[r * kp * 4..].as_ptr() as *const f32);
        // SAFETY: forwarded from the caller; bounds asserted above.
        unsafe { avx2::tile(p.as_ptr(), xs, kp) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("no SIMD build off x86-64")
}

/// One weight row widened to f32 (exact for every format).
#[inline(always)]
fn widen_row<const SIMD: bool>(fmt: ActFormat, src: &[u8], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if SIMD && fmt == ActFormat::F16 {
        // SAFETY: SIMD is only true inside `rows_avx2` (AVX2, FMA, F16C present).
        return unsafe { avx2::widen_f16(src, dst) };
    }
    for (i, d) in dst.iter_mut().enumerate() {
        *d = element(fmt, src, i);
    }
}

/// A register tile's results (`res[i][j]`: weight row `row0 + i`, activation row `r + j`) into
/// `out[row][col]`, leaving out the rows from `row_end` and the columns from `col_end` that the
/// tile only computed to stay whole.
#[inline(always)]
pub(crate) fn store_tile<const M: usize, const N: usize>(
    out: &mut [f32],
    res: &[[f32; N]; M],
    row0: usize,
    row_end: usize,
    n: usize,
    r: usize,
    col_end: usize,
) {
    let cols = (col_end - r).min(N);
    for (i, vals) in res.iter().enumerate().take(row_end.saturating_sub(row0)) {
        let dst = &mut out[(row0 + i) * n + r..];
        if cols == N {
            // a fixed-size copy: inline stores (a variable one became a memcpy call per row,
            // a sixth of a short-K call)
            dst[..N].copy_from_slice(vals);
        } else {
            for (o, v) in dst.iter_mut().zip(vals).take(cols) {
                *o = *v;
            }
        }
    }
}

/// `[row][col]` results of an MR × NR tile: each output one 8-lane FMA chain over K, then hsum.
fn tile_portable(p: &[f32], x: &[f32], xr: [usize; NR], kp: usize) -> [[f32; NR]; MR] {
    std::array::from_fn(|i| {
        let wr = &p[i * kp..(i + 1) * kp];
        xr.map(|r| {
            let mut acc = [0.0f32; 8];
            for (wc, xc) in wr
                .chunks_exact(8)
                .zip(x[r * kp..(r + 1) * kp].chunks_exact(8))
            {
                for l in 0..8 {
                    acc[l] = wc[l].mul_add(xc[l], acc[l]);
                }
            }
            hsum8(&acc)
        })
    })
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{MR, NR};

    /// [`super::tile_portable`] with eight ymm accumulators.
    #[inline(always)]
    pub unsafe fn tile(p: *const f32, x: [*const f32; NR], kp: usize) -> [[f32; NR]; MR] {
        let mut a = [_mm256_setzero_ps(); MR * NR];
        let mut l = 0;
        while l < kp {
            let xs: [__m256; NR] = std::array::from_fn(|j| _mm256_loadu_ps(x[j].add(l)));
            for i in 0..MR {
                let w = _mm256_loadu_ps(p.add(i * kp + l));
                for j in 0..NR {
                    a[i * NR + j] = _mm256_fmadd_ps(w, xs[j], a[i * NR + j]);
                }
            }
            l += 8;
        }
        // the MR·NR sums four at a time (a short K makes them a large share of the tile)
        let mut sums = [0.0f32; MR * NR];
        for (dst, v) in sums.chunks_exact_mut(4).zip(a.chunks_exact(4)) {
            dst.copy_from_slice(&hsum4([v[0], v[1], v[2], v[3]]));
        }
        std::array::from_fn(|i| std::array::from_fn(|j| sums[i * NR + j]))
    }

    /// f16 bytes `src` widened into `dst` (`dst.len()` values), eight per conversion.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen_f16(src: &[u8], dst: &mut [f32]) {
        assert!(src.len() >= dst.len() * 2);
        let whole = dst.len() / 8 * 8;
        for i in (0..whole).step_by(8) {
            let h = _mm_loadu_si128(src.as_ptr().add(2 * i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        for (i, d) in dst.iter_mut().enumerate().skip(whole) {
            *d = super::fp16_to_f32(u16::from_le_bytes([src[2 * i], src[2 * i + 1]]));
        }
    }

    #[inline(always)]
    pub unsafe fn prefetch(p: *const u8) {
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
    }

    /// [`tile`] on f16 panel rows and f16 activation rows, converted in registers.
    #[inline(always)]
    pub unsafe fn tile_f16(
        p: [*const u16; super::MR16],
        x: [*const u16; super::NR16],
        kp: usize,
    ) -> [[f32; super::NR16]; super::MR16] {
        const M: usize = super::MR16;
        const N: usize = super::NR16;
        let mut a = [_mm256_setzero_ps(); M * N];
        let mut l = 0;
        while l < kp {
            let xs: [__m256; N] = std::array::from_fn(|j| {
                _mm256_cvtph_ps(_mm_loadu_si128(x[j].add(l) as *const __m128i))
            });
            for i in 0..M {
                let w = _mm256_cvtph_ps(_mm_loadu_si128(p[i].add(l) as *const __m128i));
                for j in 0..N {
                    a[i * N + j] = _mm256_fmadd_ps(w, xs[j], a[i * N + j]);
                }
            }
            l += 8;
        }
        let mut sums = [0.0f32; M * N];
        let whole = M * N / 4 * 4;
        for (dst, v) in sums[..whole].chunks_exact_mut(4).zip(a.chunks_exact(4)) {
            dst.copy_from_slice(&hsum4([v[0], v[1], v[2], v[3]]));
        }
        for (dst, v) in sums[whole..].iter_mut().zip(&a[whole..]) {
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), *v);
            *dst = super::hsum8(&lanes);
        }
        std::array::from_fn(|i| std::array::from_fn(|j| sums[i * N + j]))
    }

    /// [`super::hsum8`] of four registers at once, the same additions in the same order:
    /// q = lo + hi (a0+a4, a1+a5, a2+a6, a3+a7), t = (q0 + q2, q1 + q3), t0 + t1.
    #[inline(always)]
    pub(super) unsafe fn hsum4(v: [__m256; 4]) -> [f32; 4] {
        // [q_a | q_b] and [q_c | q_d]: each 128-bit half is one register's lo + hi
        let ab = _mm256_add_ps(
            _mm256_permute2f128_ps(v[0], v[1], 0x20),
            _mm256_permute2f128_ps(v[0], v[1], 0x31),
        );
        let cd = _mm256_add_ps(
            _mm256_permute2f128_ps(v[2], v[3], 0x20),
            _mm256_permute2f128_ps(v[2], v[3], 0x31),
        );
        // per 128-bit half: (q0 + q2, q1 + q3) of a and c, then of b and d
        let t = _mm256_add_ps(
            _mm256_shuffle_ps(ab, cd, 0b01_00_01_00),
            _mm256_shuffle_ps(ab, cd, 0b11_10_11_10),
        );
        // t0 + t1 per register: lanes [a, c, a, c | b, d, b, d]
        let h = _mm256_hadd_ps(t, t);
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), h);
        [out[0], out[4], out[1], out[5]]
    }
}

/// AVX-512 f16 tiles. Each 512-bit accumulator holds the 8-lane accumulators of two weight
/// rows (lanes 0-7 and 8-15) for one activation row, whose eight values fill both halves: each
/// output gets its AVX2 tile's FMAs in the same order. Both operands are widened to f32 first
/// (exact): eight weight rows into a panel laid out by k-step and row pair, a block of
/// activation rows into a scratch, so the tile is FMAs with memory operands only (converting
/// in registers, as the AVX2 tile does, left the wider FMAs waiting on the conversions).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::Converted;

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

    pub fn rows_f16_entry(
        w: &[u8],
        stride: usize,
        first: usize,
        k: usize,
        act: &Converted,
        out: &mut [f32],
    ) {
        assert!(
            crate::kernels::matmul::avx512_vnni_active(),
            "the AVX-512 f16 tiles need AVX-512"
        );
        let n = act.rows;
        let kp = k.next_multiple_of(8);
        if n == 0 || k == 0 {
            return;
        }
        if n < MIN_ROWS {
            return super::unsafe_rows_avx2(super::ActFormat::F16, w, stride, first, k, act, out);
        }
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
        assert!(crate::kernels::matmul::avx512_vnni_active() && act.rows >= MIN_ROWS);
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

    /// Where a tile's results go: (weight row i, activation row c) at `ptr + i * row_step +
    /// c * col_step` (rows relative to the call's first).
    #[derive(Clone, Copy)]
    struct Dest {
        ptr: *mut f32,
        row_step: usize,
        col_step: usize,
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
            *dst.add(l) = crate::kernels::fp16_to_f32(v);
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
            sums[2 * q] = super::avx2::hsum4(lo);
            sums[2 * q + 1] = super::avx2::hsum4(hi);
        }
        sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::{RowDot, BF16, F16, F32};
    use crate::kernels::matmul::matmul_quant;

    use crate::kernels::test_util::noise;

    fn encode(type_id: u32, v: &[f32]) -> Vec<u8> {
        match type_id {
            1 => v
                .iter()
                .flat_map(|x| crate::kernels::f32_to_fp16(*x).to_le_bytes())
                .collect(),
            30 => v
                .iter()
                .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
                .collect(),
            _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    /// Every output equals the one-pair tinyBLAS-order dot, on both builds, for ragged shapes.
    #[test]
    fn tiles_equal_the_pairwise_tinyblas_order() {
        for &t in &[0u32, 1, 30] {
            for &(m, k, n) in &[
                (4usize, 8usize, 2usize),
                (12, 37, 5),
                (40, 300, 33),
                (8, 1, 3),
                (6, 20, 3),
                // K a multiple of 8: f16 rows read in place, the next tile prefetched
                (40, 256, 33),
                (50, 64, 7),
                // the AVX-512 tiles: K in three slices; activation rows in one chunk of
                // more than XF_BYTES, then in two chunks
                (36, 1100, 40),
                (16, 4100, 70),
                (16, 4100, 100),
            ] {
                let wv = noise(3 + t as u64, m * k);
                let w = encode(t, &wv);
                let x = noise(9, n * k);
                let fmt = weight_format(t);
                let act = Converted::new(fmt, &x, k);
                let want: Vec<f32> = (0..n * m)
                    .map(|o| {
                        let (r, i) = (o / m, o % m);
                        let wr = &w[i * k * fmt.block_bytes()..(i + 1) * k * fmt.block_bytes()];
                        let xr = &act.data[r * act.row_bytes..(r + 1) * act.row_bytes];
                        match t {
                            1 => F16::dot_gemm(wr, xr, k),
                            30 => BF16::dot_gemm(wr, xr, k),
                            _ => F32::dot_gemm(wr, xr, k),
                        }
                    })
                    .collect();
                let wide = widen_activations(&act, fmt, k);
                let mut builds: Vec<RowsFn> = vec![match t {
                    1 => |w, s, f, k, a, o, _| rows::<false>(ActFormat::F16, w, s, f, k, a, o),
                    30 => |w, s, f, k, a, o, _| rows::<false>(ActFormat::BF16, w, s, f, k, a, o),
                    _ => |w, s, f, k, a, o, _| rows::<false>(ActFormat::F32, w, s, f, k, a, o),
                }];
                if simd_active() {
                    builds.push(match t {
                        1 => {
                            |w, s, f, k, a, o, _| unsafe_rows_avx2(ActFormat::F16, w, s, f, k, a, o)
                        }
                        30 => |w, s, f, k, a, o, _| {
                            unsafe_rows_avx2(ActFormat::BF16, w, s, f, k, a, o)
                        },
                        _ => {
                            |w, s, f, k, a, o, _| unsafe_rows_avx2(ActFormat::F32, w, s, f, k, a, o)
                        }
                    });
                    builds.push(rows_fn(t)); // the best build on this CPU (AVX-512 for f16)
                }
                let row = k * fmt.block_bytes();
                for (b, f) in builds.into_iter().enumerate() {
                    let mut got = vec![0.0f32; m * n]; // [row][col]
                    f(&w, row, 0, k, &wide, &mut got, true);
                    for (o, want) in want.iter().enumerate() {
                        let (r, i) = (o / m, o % m);
                        let same = got[i * n + r].to_bits() == want.to_bits();
                        assert!(same, "type {t} m {m} k {k} n {n} build {b} at {r},{i}");
                    }
                }
                if m % 4 != 0 {
                    continue; // ggml takes tinyBLAS only for M % 4 == 0
                }
                let mut got = vec![0.0f32; n * m];
                matmul_quant(t, &w, row, m, k, &x, &mut got, 3, true).unwrap();
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "type {t} m {m} k {k} n {n} through matmul_quant"
                );
            }
        }
    }
}
