//! The register tiles of the float-weight matmul ([`super::float`]) in tinyBLAS's order: a
//! portable build and an AVX2 one (same FMAs in the same order), and the tile store the other
//! many-row kernels share.

use crate::kernels::blocks::half::fp16_to_f32;
use crate::kernels::dot::lanes::hsum8;
use crate::kernels::formats::ActFormat;
use crate::kernels::operand::RowsJob;

/// Weight rows per micro-tile and activation rows per micro-tile.
pub(crate) const MR: usize = 4;
pub(crate) const NR: usize = 3;
/// Bytes of widened weight rows kept at once (half of a 512 KiB L2).
pub(crate) const PANEL_BYTES: usize = 192 * 1024;
/// Bytes of activation rows walked per panel (the rest of L2).
pub(crate) const XBLOCK_BYTES: usize = 256 * 1024;

#[inline(always)]
pub(crate) fn element(fmt: ActFormat, b: &[u8], i: usize) -> f32 {
    match fmt {
        ActFormat::F16 => fp16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])),
        ActFormat::BF16 => {
            f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
        }
        _ => f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]),
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) fn unsafe_rows_avx2(fmt: ActFormat, job: RowsJob<'_>) {
    // SAFETY: only chosen by `rows_fn` after simd_active() checked AVX2, FMA and F16C.
    unsafe { rows_avx2(fmt, job) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn rows_avx2(fmt: ActFormat, job: RowsJob<'_>) {
    rows::<true>(fmt, job)
}

/// Weight rows `first..first + out.len() / n` (type `fmt`, `stride` bytes apart) against every
/// widened activation row; `out[(i - first) * n + r]`.
#[inline(always)]
pub(crate) fn rows<const SIMD: bool>(fmt: ActFormat, job: RowsJob<'_>) {
    let (w, stride, first, k, act, out, gemm) = job.into_parts();
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
        return unsafe { rows_f16_simd(RowsJob::new(w, stride, first, k, act, out, gemm), kp) };
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
pub(crate) const MR16: usize = 3;
pub(crate) const NR16: usize = 3;
/// Cache lines of the next tile's weight rows prefetched per tile step.
pub(crate) const PREFETCH_LINES: usize = 4;

/// [`rows`] for f16 weights and f16 activation rows (`kp` values each, zero-padded): the
/// panel keeps the weights' f16 bits, the tile converts both operands in registers. The same
/// FMAs in the same order as the widened path (f16 values are exact in f32).
///
/// # Safety
/// AVX2, FMA and F16C present.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn rows_f16_simd(job: RowsJob<'_>, kp: usize) {
    let (w, stride, first, k, act, out, _) = job.into_parts();
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
pub(crate) unsafe fn tile_simd(p: &[f32], x: &[u8], xr: [usize; NR], kp: usize) -> [[f32; NR]; MR] {
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
pub(crate) fn widen_row<const SIMD: bool>(fmt: ActFormat, src: &[u8], dst: &mut [f32]) {
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
pub(crate) fn tile_portable(p: &[f32], x: &[f32], xr: [usize; NR], kp: usize) -> [[f32; NR]; MR] {
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
pub(crate) mod avx2 {
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
        pub(crate) const M: usize = super::MR16;
        pub(crate) const N: usize = super::NR16;
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
    pub(crate) unsafe fn hsum4(v: [__m256; 4]) -> [f32; 4] {
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
