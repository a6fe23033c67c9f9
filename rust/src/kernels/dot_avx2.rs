//! AVX2+FMA+F16C builds of the row dots of every weight type: the intrinsics
//! of ggml's x86 vec_dot, giving the same lanes, FMAs and final sums as the portable code in
//! [`super::dot`] (the tests compare both bit for bit).
//!
//! Every function here is `unsafe`: the caller guarantees the CPU has AVX2, FMA and F16C, and
//! the slices hold `k` values' worth of blocks (checked with asserts, so bad sizes panic rather
//! than read out of bounds).

use std::arch::x86_64::*;

use super::dot::{e8m0_half, hsum8, q3k_scales, scale_min_k4, KVALUES_IQ4NL, KVALUES_MXFP4};

#[inline(always)]
unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]) as u32;
    // A `vmovd` that zeroes the register: left to itself, LLVM inserts the half into whatever
    // register is at hand (often the loop's accumulator), chaining every block's scale to the
    // previous block's FMA and serializing the loop.
    let v: __m128i;
    std::arch::asm!("vmovd {v}, {h:e}", v = out(xmm_reg) v, h = in(reg) h,
        options(pure, nomem, nostack, preserves_flags));
    _mm_cvtss_f32(_mm_cvtph_ps(v))
}

/// Bytes ahead of the current weight block that decode loops prefetch: more cache-line misses
/// in flight than the hardware prefetcher keeps for one stream (a hint only, never faults).
const PREFETCH_AHEAD: usize = 3072;

#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD) as *const i8);
}

/// `hsum_float_8` of one register (via [`hsum8`]).
#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let mut a = [0.0f32; 8];
    _mm256_storeu_ps(a.as_mut_ptr(), v);
    hsum8(&a)
}

/// Lanes of Σ x·y over 32 signed bytes (`mul_sum_i8_pairs_float` before the conversion).
#[inline(always)]
unsafe fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// 16 bytes of nibbles to 32 bytes: low nibbles, then high nibbles (`bytes_from_nibbles_32`).
#[inline(always)]
pub(crate) unsafe fn nibbles32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(both, _mm256_set1_epi8(0xF))
}

/// q8_0 weights · q8_0 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 32;
    assert!(w.len() >= nb * 34 && x.len() >= nb * 34);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wb, yb) = (wp.add(34 * i), xp.add(34 * i));
        prefetch_ahead(wb);
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(yb));
        let q = dot_i8(load32(wb.add(2)), load32(yb.add(2)));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc);
    }
    hsum(acc)
}

/// q4_0 weights · q8_0 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 32;
    assert!(w.len() >= nb * 18 && x.len() >= nb * 34);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wb, yb) = (wp.add(18 * i), xp.add(34 * i));
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(yb));
        let qx = _mm256_sub_epi8(nibbles32(wb.add(2)), _mm256_set1_epi8(8));
        let q = dot_i8(qx, load32(yb.add(2)));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc);
    }
    hsum(acc)
}

#[inline(always)]
unsafe fn q8k_d(y: *const u8) -> f32 {
    f32::from_le_bytes([*y, *y.add(1), *y.add(2), *y.add(3)])
}

#[inline(always)]
unsafe fn bsum(y: *const u8, j: usize) -> i32 {
    i16::from_le_bytes([*y.add(260 + 2 * j), *y.add(261 + 2 * j)]) as i32
}

/// Q4_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 256;
    assert!(w.len() >= nb * 144 && x.len() >= nb * 292);
    if crate::kernels::matmul::avx512_vnni_active() {
        return q4_k_wide(w, x, nb);
    }
    let m4 = _mm256_set1_epi8(0xF);
    // i16 lane j of scale_at[j] picks scale j of a `scales` vector (get_scale_shuffle_k4)
    let scale_at: [__m256i; 8] =
        std::array::from_fn(|j| _mm256_set1_epi16((((2 * j + 1) << 8) | (2 * j)) as i16));
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(144 * i);
        let yb = x.as_ptr().add(292 * i);
        let (d, sc) = q4k_start(wb, yb, &mut acc_m);
        let scales = _mm256_set_m128i(sc, sc);
        let (qs, q8) = (wb.add(16), yb.add(4));
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let bits = load32(qs.add(32 * j));
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            let pl = _mm256_maddubs_epi16(lo, load32(q8.add(64 * j)));
            let ph = _mm256_maddubs_epi16(hi, load32(q8.add(64 * j + 32)));
            let pl = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, scale_at[2 * j]), pl);
            let ph = _mm256_madd_epi16(_mm256_shuffle_epi8(scales, scale_at[2 * j + 1]), ph);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    q4k_finish(acc, acc_m)
}

/// [`q4_k`] with AVX-512 VNNI: the 64 codes of sub-blocks 2j and 2j + 1 in one register
/// (low nibbles, then high), `vpdpwssd` scales and adds the pairs. Each half's int32 lanes hold
/// the same products as ggml's eight lanes, so their sum is its `sumi`, exactly.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
unsafe fn q4_k_wide(w: &[u8], x: &[u8], nb: usize) -> f32 {
    let m4 = _mm512_set1_epi8(0xF);
    // i16 lanes 0-15 pick scale 2j, lanes 16-31 scale 2j + 1, from the 8 scales (i16)
    let pick: [__m512i; 4] = std::array::from_fn(|j| {
        let lo = _mm256_set1_epi16(2 * j as i16);
        let hi = _mm256_set1_epi16(2 * j as i16 + 1);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    });
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(144 * i);
        let yb = x.as_ptr().add(292 * i);
        let (d, sc) = q4k_start(wb, yb, &mut acc_m);
        let scales = _mm512_castsi128_si512(sc);
        let (qs, q8) = (wb.add(16), yb.add(4));
        let mut sumi = _mm512_setzero_si512();
        for (j, pick_j) in pick.iter().enumerate() {
            let bits = load32(qs.add(32 * j));
            let both =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4));
            let codes = _mm512_and_si512(both, m4);
            let p = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(q8.add(64 * j) as *const _));
            let s = _mm512_permutexvar_epi16(*pick_j, scales);
            sumi = _mm512_dpwssd_epi32(sumi, p, s);
        }
        acc = fold_wide_block(sumi, d, acc);
    }
    q4k_finish(acc, acc_m)
}

/// The end of a Q4_K block summed in 512-bit lanes: its two halves added (ggml's eight lanes),
/// then `acc + d · sumi`.
#[inline(always)]
pub(crate) unsafe fn fold_wide_block(sumi: __m512i, d: f32, acc: __m256) -> __m256 {
    let sumi = _mm256_add_epi32(
        _mm512_castsi512_si256(sumi),
        _mm512_extracti64x4_epi64::<1>(sumi),
    );
    _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc)
}

/// A Q4_K super-block's start, shared by both builds of [`q4_k`]: prefetch, `d`, and the
/// mins · (pairs of bsums) term into `acc_m` as ggml does (i16 pair sums, then i32 lanes of two
/// products); returns `d` and the eight scales as i16 lanes.
#[inline(always)]
unsafe fn q4k_start(wb: *const u8, yb: *const u8, acc_m: &mut __m128) -> (f32, __m128i) {
    for line in 0..3 {
        prefetch_ahead(wb.add(64 * line));
    }
    let yd = q8k_d(yb);
    let d = yd * f16_at(wb);
    let dmin = -yd * f16_at(wb.add(2));
    let (sc, mn) = k4_scales_mins(wb.add(4));
    let q8sums = load32(yb.add(260));
    let q8s = _mm_hadd_epi16(
        _mm256_castsi256_si128(q8sums),
        _mm256_extracti128_si256(q8sums, 1),
    );
    let prod = _mm_madd_epi16(mn, q8s);
    *acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), *acc_m);
    (d, sc)
}

/// [`q4_k`]'s end: the `hsum` of the scaled sums plus the mins term's four lanes.
#[inline(always)]
pub(crate) unsafe fn q4k_finish(acc: __m256, acc_m: __m128) -> f32 {
    let mut m = [0.0f32; 4];
    _mm_storeu_ps(m.as_mut_ptr(), acc_m);
    hsum(acc) + ((m[0] + m[2]) + (m[1] + m[3]))
}

/// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block (12 bytes at `p`) as i16 lanes,
/// unpacked with whole-word masks like ggml's x86 code ([`scale_min_k4`] per value).
#[inline(always)]
unsafe fn k4_scales_mins(p: *const u8) -> (__m128i, __m128i) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u32);
    let (u0, u1, u2) = (u(0), u(4), u(8));
    let sc0 = u0 & KMASK1;
    let sc1 = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let mn0 = u1 & KMASK1;
    let mn1 = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let both = _mm256_cvtepu8_epi16(_mm_set_epi32(
        mn1 as i32, mn0 as i32, sc1 as i32, sc0 as i32,
    ));
    (
        _mm256_castsi256_si128(both),
        _mm256_extracti128_si256(both, 1),
    )
}

/// i16 scales: lanes 0-3 (bytes 0-15) `a`, lanes 4-7 `b`.
#[inline(always)]
unsafe fn split_scale(a: i8, b: i8) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b as i16), _mm_set1_epi16(a as i16))
}

/// Q6_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 256;
    assert!(w.len() >= nb * 210 && x.len() >= nb * 292);
    let m15 = _mm256_set1_epi8(15);
    let m3 = _mm256_set1_epi8(3);
    // bytes 0-7 of pair_at[p] pick scale 2p, bytes 8-15 scale 2p + 1 ([`split_scale`])
    let pair_at: [__m128i; 8] = std::array::from_fn(|p| {
        _mm_set_epi64x(
            (0x0101_0101_0101_0101u64 * (2 * p as u64 + 1)) as i64,
            (0x0101_0101_0101_0101u64 * (2 * p as u64)) as i64,
        )
    });
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(210 * i);
        let yb = x.as_ptr().add(292 * i);
        for line in 0..4 {
            prefetch_ahead(wb.add(64 * line));
        }
        let d = q8k_d(yb) * f16_at(wb.add(208));
        let sc = _mm_loadu_si128(wb.add(192) as *const __m128i);
        let q8sums = load32(yb.add(260));
        let scales16 = _mm256_cvtepi8_epi16(sc);
        let sub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales16), 5);
        let (ql, qh, q8) = (wb, wb.add(128), yb.add(4));
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let b1 = load32(ql.add(64 * j));
            let b2 = load32(ql.add(64 * j + 32));
            let h = load32(qh.add(32 * j));
            let h0 = _mm256_slli_epi16(_mm256_and_si256(h, m3), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(12)), 2);
            let h2 = _mm256_and_si256(h, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(-64)), 2);
            let q = [
                _mm256_or_si256(_mm256_and_si256(b1, m15), h0),
                _mm256_or_si256(_mm256_and_si256(b2, m15), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15), h3),
            ];
            for (c, qc) in q.iter().enumerate() {
                let p = _mm256_maddubs_epi16(*qc, load32(q8.add(128 * j + 32 * c)));
                let s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pair_at[4 * j + c]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p));
            }
        }
        let sumi = _mm256_sub_epi32(sumi, sub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// Whether [`f16`] prefetches ahead. On the Zen 3 VM the hardware prefetcher alone read the f16
/// stream (64 bytes per step) 4–8 % faster (one thread, 336 M sweep); on the Zen 5 VM software
/// prefetch read it 8–15 % faster (two threads, 280 MB of rows). AVX-512 tells the two apart.
#[inline(always)]
pub(crate) fn prefetch_f16_rows() -> bool {
    crate::kernels::matmul::avx512_vnni_active()
}

/// f16 weights · f16 activations, prefetching where [`prefetch_f16_rows`] says (the
/// block-quant dots always do).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16(w: &[u8], x: &[u8], k: usize) -> f32 {
    assert!(w.len() >= 2 * k && x.len() >= 2 * k);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let np = k & !31;
    let mut s = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    let pf = prefetch_f16_rows();
    while i < np {
        if pf {
            prefetch_ahead(wp.add(2 * i));
        }
        for (j, sj) in s.iter_mut().enumerate() {
            let at = 2 * (i + 8 * j);
            let a = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(at) as *const __m128i));
            let b = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(at) as *const __m128i));
            *sj = _mm256_fmadd_ps(a, b, *sj);
        }
        i += 32;
    }
    f16_finish(&s, np, k, |i| {
        (f16_at(wp.add(2 * i)), f16_at(xp.add(2 * i)))
    })
}

/// [`f16`] with the activations already widened to f32 (`x`: `k` f32 values as bytes, read
/// unaligned): one conversion per 8 values instead of two, the same FMAs, sums and tail (the
/// same bits; see [`super::f16_rows`]).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_wide(w: &[u8], x: &[u8], k: usize) -> f32 {
    assert!(w.len() >= 2 * k && x.len() >= 4 * k);
    let (wp, xp) = (w.as_ptr(), x.as_ptr() as *const f32);
    let np = k & !31;
    let mut s = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    let pf = prefetch_f16_rows();
    while i < np {
        if pf {
            prefetch_ahead(wp.add(2 * i));
        }
        for (j, sj) in s.iter_mut().enumerate() {
            let a = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * (i + 8 * j)) as *const __m128i));
            let b = _mm256_loadu_ps(xp.add(i + 8 * j));
            *sj = _mm256_fmadd_ps(a, b, *sj);
        }
        i += 32;
    }
    f16_finish(&s, np, k, |i| {
        (f16_at(wp.add(2 * i)), xp.add(i).read_unaligned())
    })
}

/// One 32-value step of [`f16_wide`] for `R` widened activation rows at once: each weight
/// vector converted once, FMA'd into every row's four accumulators.
#[inline(always)]
unsafe fn wide_step<const R: usize>(
    wp: *const u8,
    xs: [*const f32; R],
    i: usize,
    s: &mut [[__m256; 4]; R],
) {
    for j in 0..4 {
        let a = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(2 * (i + 8 * j)) as *const __m128i));
        for (sr, x) in s.iter_mut().zip(xs) {
            sr[j] = _mm256_fmadd_ps(a, _mm256_loadu_ps(x.add(i + 8 * j)), sr[j]);
        }
    }
}

/// [`f16_wide`] of one weight row against two widened activation rows: each weight vector
/// converted once for both, each row's accumulators, reduction and tail as in [`f16_wide`]
/// (same bits).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_wide_x2(w: &[u8], xs: [&[u8]; 2], k: usize) -> [f32; 2] {
    assert!(w.len() >= 2 * k && xs.iter().all(|x| x.len() >= 4 * k));
    let wp = w.as_ptr();
    let xp = xs.map(|x| x.as_ptr() as *const f32);
    let np = k & !31;
    let mut s = [[_mm256_setzero_ps(); 4]; 2];
    let mut i = 0;
    let pf = prefetch_f16_rows();
    while i < np {
        if pf {
            prefetch_ahead(wp.add(2 * i));
        }
        wide_step(wp, xp, i, &mut s);
        i += 32;
    }
    [0, 1].map(|r| {
        f16_finish(&s[r], np, k, |i| {
            (f16_at(wp.add(2 * i)), xp[r].add(i).read_unaligned())
        })
    })
}

/// [`f16_wide`] of eight weight rows (`stride` bytes apart, `k` a multiple of 32: no tail)
/// against `R` widened activation rows: `out[r][i]` = row `i` · activation `r`. Each dot keeps
/// its four accumulators and reduction (same bits), but the eight reductions run side by side in
/// vector registers ([`reduce8`]) instead of one scalar chain each: with attention's short rows
/// (K = head size) the scalar reductions, not the FMAs, had set the pace (~70 cycles a row).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` must be valid for `7 * stride + 2 * k` bytes
/// and each `xs[r]` for `k` f32 values.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_wide_rows8<const R: usize>(
    w: *const u8,
    stride: usize,
    xs: [*const f32; R],
    k: usize,
    pf: bool,
) -> [__m256; R] {
    debug_assert!(k.is_multiple_of(32));
    let mut red = [[_mm256_setzero_ps(); 8]; R];
    for row in 0..8 {
        let wp = w.add(row * stride);
        let mut s = [[_mm256_setzero_ps(); 4]; R];
        let mut i = 0;
        while i < k {
            if pf {
                prefetch_ahead(wp.add(2 * i));
            }
            wide_step(wp, xs, i, &mut s);
            i += 32;
        }
        for (rr, sr) in red.iter_mut().zip(&s) {
            rr[row] = _mm256_add_ps(_mm256_add_ps(sr[0], sr[2]), _mm256_add_ps(sr[1], sr[3]));
        }
    }
    red.map(|rr| reduce8(&rr))
}

/// The horizontal end of [`f16_finish`] for eight registers at once: lane `i` of the result is
/// `((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]))` of register `i`, the
/// adds of `_mm_hadd_ps` in ggml's `GGML_F32x8_REDUCE`. (Without a tail, its f64 step returns
/// the same float.)
#[inline(always)]
unsafe fn reduce8(v: &[__m256; 8]) -> __m256 {
    // [lo + hi of a | lo + hi of b]
    let halves = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    let w1 = _mm256_hadd_ps(halves(v[0], v[1]), halves(v[2], v[3]));
    let w2 = _mm256_hadd_ps(halves(v[4], v[5]), halves(v[6], v[7]));
    // lanes hold registers 0, 2, 4, 6 | 1, 3, 5, 7
    let mixed = _mm256_hadd_ps(w1, w2);
    _mm256_permutevar8x32_ps(mixed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

/// ggml_vec_dot_f16's end: the four accumulators reduced, then the elements from `np` to `k`
/// (`at(i)`: weight and activation) multiplied in f32 and added one by one in f64.
#[inline(always)]
unsafe fn f16_finish(
    s: &[__m256; 4],
    np: usize,
    k: usize,
    at: impl Fn(usize) -> (f32, f32),
) -> f32 {
    let r = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
    let mut a = [0.0f32; 8];
    _mm256_storeu_ps(a.as_mut_ptr(), r);
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let mut sumf = ((t[0] + t[1]) + (t[2] + t[3])) as f64;
    for i in np..k {
        let (wv, xv) = at(i);
        sumf += (wv * xv) as f64;
    }
    sumf as f32
}

/// [`f16`] of one weight row against two activation rows: each weight vector converted once
/// for both, each row's four accumulators and reduction as in [`f16`] (same bits).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16x2(w: &[u8], xs: [&[u8]; 2], k: usize) -> [f32; 2] {
    assert!(w.len() >= 2 * k && xs.iter().all(|x| x.len() >= 2 * k));
    let wp = w.as_ptr();
    let xp = xs.map(|x| x.as_ptr());
    let np = k & !31;
    let mut s = [[_mm256_setzero_ps(); 4]; 2];
    let mut i = 0;
    while i < np {
        prefetch_ahead(wp.add(2 * i));
        for j in 0..4 {
            let at = 2 * (i + 8 * j);
            let a = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(at) as *const __m128i));
            for (sr, x) in s.iter_mut().zip(xp) {
                let b = _mm256_cvtph_ps(_mm_loadu_si128(x.add(at) as *const __m128i));
                sr[j] = _mm256_fmadd_ps(a, b, sr[j]);
            }
        }
        i += 32;
    }
    [0, 1].map(|r| {
        f16_finish(&s[r], np, k, |i| {
            (f16_at(wp.add(2 * i)), f16_at(xp[r].add(2 * i)))
        })
    })
}

/// [`f16x2`] twice (four activation rows; sixteen accumulators would not fit the registers).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16x4(w: &[u8], xs: [&[u8]; 4], k: usize) -> [f32; 4] {
    let [a, b] = f16x2(w, [xs[0], xs[1]], k);
    let [c, d] = f16x2(w, [xs[2], xs[3]], k);
    [a, b, c, d]
}

/// 32 bits to 32 bytes of 0x00 / 0xFF (`bytes_from_bits_32`).
#[inline(always)]
pub(crate) unsafe fn bytes_from_bits(p: *const u8) -> __m256i {
    let x32 = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Lanes of Σ x·y, `x` unsigned bytes (`mul_sum_us8_pairs_float` before the conversion).
#[inline(always)]
unsafe fn dot_u8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// q5_0 weights · q8_0 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_0(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 32;
    assert!(w.len() >= nb * 22 && x.len() >= nb * 34);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wb, yb) = (w.as_ptr().add(22 * i), x.as_ptr().add(34 * i));
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(yb));
        let hi = _mm256_andnot_si256(bytes_from_bits(wb.add(2)), _mm256_set1_epi8(-16));
        let qx = _mm256_or_si256(nibbles32(wb.add(6)), hi);
        let q = dot_i8(qx, load32(yb.add(2)));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc);
    }
    hsum(acc)
}

/// q4_1 weights · q8_1 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_1(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 32;
    assert!(w.len() >= nb * 20 && x.len() >= nb * 36);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..nb {
        let (wb, yb) = (w.as_ptr().add(20 * i), x.as_ptr().add(36 * i));
        summs = f16_at(wb.add(2)).mul_add(f16_at(yb.add(2)), summs);
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(yb));
        let q = dot_u8(nibbles32(wb.add(4)), load32(yb.add(4)));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc);
    }
    hsum(acc) + summs
}

/// q5_1 weights · q8_1 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_1(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 32;
    assert!(w.len() >= nb * 24 && x.len() >= nb * 36);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..nb {
        let (wb, yb) = (w.as_ptr().add(24 * i), x.as_ptr().add(36 * i));
        summs = f16_at(wb.add(2)).mul_add(f16_at(yb.add(2)), summs);
        let hi = _mm256_and_si256(bytes_from_bits(wb.add(4)), _mm256_set1_epi8(0x10));
        let qx = _mm256_or_si256(nibbles32(wb.add(8)), hi);
        let q = dot_u8(qx, load32(yb.add(4)));
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(yb));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), d, acc);
    }
    hsum(acc) + summs
}

/// 32 table values of 16 nibble-packed bytes: low nibbles, then high nibbles.
#[inline(always)]
unsafe fn table32(table: __m128i, p: *const u8) -> __m256i {
    let bits = _mm_loadu_si128(p as *const __m128i);
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(bits, m4));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
    _mm256_set_m128i(hi, lo)
}

/// IQ4_NL / MXFP4 (`bytes` per block, codes at `qs`, scale from `scale`) · q8_0.
#[inline(always)]
unsafe fn table_q8_0(
    w: &[u8],
    x: &[u8],
    k: usize,
    bytes: usize,
    qs: usize,
    values: &[i8; 16],
    scale: impl Fn(*const u8) -> f32,
) -> f32 {
    let nb = k / 32;
    assert!(w.len() >= nb * bytes && x.len() >= nb * 34);
    let table = _mm_loadu_si128(values.as_ptr() as *const __m128i);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let block = |ib: usize| -> (f32, __m256i) {
        let (wb, yb) = (wp.add(bytes * ib), xp.add(34 * ib));
        let q = dot_i8(table32(table, wb.add(qs)), load32(yb.add(2)));
        (f16_at(yb) * scale(wb), q)
    };
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut ib = 0;
    while ib + 1 < nb {
        for (h, a) in acc.iter_mut().enumerate() {
            let (d, q) = block(ib + h);
            *a = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(q), *a);
        }
        ib += 2;
    }
    let mut sumf = hsum(_mm256_add_ps(acc[0], acc[1]));
    if ib < nb {
        let (d, q) = block(ib);
        let mut lanes = [0i32; 8];
        _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, q);
        sumf += d * lanes.iter().sum::<i32>() as f32;
    }
    sumf
}

/// IQ4_NL weights · q8_0 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn iq4_nl(w: &[u8], x: &[u8], k: usize) -> f32 {
    table_q8_0(w, x, k, 18, 2, &KVALUES_IQ4NL, |b| f16_at(b))
}

/// IQ4_NL weights · q8_0 activations in tinyBLAS's order (one accumulator, no odd tail).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn iq4_nl_gemm(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 32;
    assert!(w.len() >= nb * 18 && x.len() >= nb * 34);
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (wb, yb) = (w.as_ptr().add(18 * i), x.as_ptr().add(34 * i));
        let q = dot_i8(table32(table, wb.add(2)), load32(yb.add(2)));
        let d = _mm256_set1_ps(f16_at(yb) * f16_at(wb));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc);
    }
    hsum(acc)
}

/// MXFP4 weights · q8_0 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mxfp4(w: &[u8], x: &[u8], k: usize) -> f32 {
    table_q8_0(w, x, k, 17, 1, &KVALUES_MXFP4, |b| e8m0_half(*b))
}

/// IQ4_XS weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn iq4_xs(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 256;
    assert!(w.len() >= nb * 136 && x.len() >= nb * 292);
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(136 * i);
        let yb = x.as_ptr().add(292 * i);
        let sh = u16::from_le_bytes([*wb.add(2), *wb.add(3)]) as i32;
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let low = ((*wb.add(4 + ib / 2) >> (4 * (ib % 2))) & 15) as i32;
            let ls = (low | (((sh >> (2 * ib)) & 3) << 4)) - 32;
            let q = table32(table, wb.add(8 + 16 * ib));
            let y = load32(yb.add(4 + 32 * ib));
            let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y, q));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, _mm256_set1_epi16(ls as i16)));
        }
        let d = f16_at(wb) * q8k_d(yb);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// Q5_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 256;
    assert!(w.len() >= nb * 176 && x.len() >= nb * 292);
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for i in 0..nb {
        let wb = w.as_ptr().add(176 * i);
        let yb = x.as_ptr().add(292 * i);
        let yd = q8k_d(yb);
        let d = yd * f16_at(wb);
        let dmin = -yd * f16_at(wb.add(2));
        let (sc, mn) = scale_min_k4(&w[176 * i + 4..176 * i + 16]);
        let mins: i32 = (0..8)
            .map(|j| mn[j] * (bsum(yb, 2 * j) + bsum(yb, 2 * j + 1)))
            .sum();
        summs = dmin.mul_add(mins as f32, summs);
        let hbits = load32(wb.add(16));
        let (qs, q8) = (wb.add(48), yb.add(4));
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let bits = load32(qs.add(32 * j));
            let h0 = _mm256_and_si256(hbits, _mm256_set1_epi8(1 << (2 * j)));
            let h1 = _mm256_and_si256(hbits, _mm256_set1_epi8(1 << (2 * j + 1)));
            let h0 = _mm256_and_si256(_mm256_cmpeq_epi8(h0, _mm256_setzero_si256()), m4);
            let h1 = _mm256_and_si256(_mm256_cmpeq_epi8(h1, _mm256_setzero_si256()), m4);
            // + 16 where the high bit is set: 16 - (0 or 16)... as (nibble | 16) when set
            let lo = _mm256_or_si256(
                _mm256_and_si256(bits, m4),
                _mm256_andnot_si256(_mm256_slli_epi16(h0, 1), _mm256_set1_epi8(16)),
            );
            let hi = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
                _mm256_andnot_si256(_mm256_slli_epi16(h1, 1), _mm256_set1_epi8(16)),
            );
            let pl = _mm256_maddubs_epi16(lo, load32(q8.add(64 * j)));
            let ph = _mm256_maddubs_epi16(hi, load32(q8.add(64 * j + 32)));
            let pl = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j] as i16), pl);
            let ph = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j + 1] as i16), ph);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) + summs
}

/// Q2_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q2_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 256;
    assert!(w.len() >= nb * 84 && x.len() >= nb * 292);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(84 * i);
        let yb = x.as_ptr().add(292 * i);
        let yd = q8k_d(yb);
        let d = yd * f16_at(wb.add(80));
        let dmin = -yd * f16_at(wb.add(82));
        let raw = _mm_loadu_si128(wb as *const __m128i);
        let mins8 = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0xF));
        let prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mins8), load32(yb.add(260)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
        let sc: [i8; 16] = std::array::from_fn(|j| (*wb.add(j) & 15) as i8);
        let (qs, q8) = (wb.add(16), yb.add(4));
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let bits = load32(qs.add(32 * j));
            for s in 0..4i32 {
                let q = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * s)), m3);
                let p = _mm256_maddubs_epi16(q, load32(q8.add(128 * j + 32 * s as usize)));
                let at = 8 * j + 2 * s as usize;
                sumi =
                    _mm256_add_epi32(sumi, _mm256_madd_epi16(split_scale(sc[at], sc[at + 1]), p));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// Q3_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q3_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 256;
    assert!(w.len() >= nb * 110 && x.len() >= nb * 292);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(110 * i);
        let yb = x.as_ptr().add(292 * i);
        let d = q8k_d(yb) * f16_at(wb.add(108));
        let sc = q3k_scales(&w[110 * i + 96..110 * i + 108]);
        let hbits = load32(wb);
        let (qs, q8) = (wb.add(32), yb.add(4));
        let mut sumi = _mm256_setzero_si256();
        for j in 0..2 {
            let bits = load32(qs.add(32 * j));
            for s in 0..4i32 {
                let bit = _mm256_set1_epi8(1 << (4 * j as i32 + s));
                let unset = _mm256_cmpeq_epi8(_mm256_and_si256(hbits, bit), _mm256_setzero_si256());
                let qh = _mm256_and_si256(unset, _mm256_set1_epi8(4));
                let ql = _mm256_and_si256(_mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * s)), m3);
                let y = load32(q8.add(128 * j + 32 * s as usize));
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(ql, y), _mm256_maddubs_epi16(qh, y));
                let at = 8 * j + 2 * s as usize;
                sumi = _mm256_add_epi32(
                    sumi,
                    _mm256_madd_epi16(split_scale(sc[at] as i8, sc[at + 1] as i8), p),
                );
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// Four 8-lane FMA accumulators over 32-element steps of `load`ed registers.
#[inline(always)]
unsafe fn four_fma(k: usize, load: impl Fn(usize) -> (__m256, __m256)) -> [__m256; 4] {
    let mut s = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i < k & !31 {
        for (j, sj) in s.iter_mut().enumerate() {
            let (a, b) = load(i + 8 * j);
            *sj = _mm256_fmadd_ps(a, b, *sj);
        }
        i += 32;
    }
    s
}

/// f32 weights · f32 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32(w: &[u8], x: &[u8], k: usize) -> f32 {
    assert!(w.len() >= 4 * k && x.len() >= 4 * k);
    let (wp, xp) = (w.as_ptr() as *const f32, x.as_ptr() as *const f32);
    let s = four_fma(k, |i| {
        (_mm256_loadu_ps(wp.add(i)), _mm256_loadu_ps(xp.add(i)))
    });
    let r = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
    let mut a = [0.0f32; 8];
    _mm256_storeu_ps(a.as_mut_ptr(), r);
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let mut sumf = (t[0] + t[1]) + (t[2] + t[3]);
    let start = k & !31;
    let left = k - start;
    let unfused = if left >= 8 { left & !7 } else { 0 };
    let unfused = unfused + if left - unfused >= 4 { 4 } else { 0 };
    for i in start..k {
        let (a, b) = (wp.add(i).read_unaligned(), xp.add(i).read_unaligned());
        sumf = if i < start + unfused {
            sumf + a * b
        } else {
            a.mul_add(b, sumf)
        };
    }
    sumf
}

/// bf16 weights · bf16 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn bf16(w: &[u8], x: &[u8], k: usize) -> f32 {
    assert!(w.len() >= 2 * k && x.len() >= 2 * k);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let load = |p: *const u8| {
        let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
        _mm256_castsi256_ps(_mm256_slli_epi32(v, 16))
    };
    let c = four_fma(k, |i| (load(wp.add(2 * i)), load(xp.add(2 * i))));
    let r = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
    let mut sumf = hsum(r) as f64;
    let bf = |p: *const u8, i: usize| {
        f32::from_bits((u16::from_le_bytes([*p.add(2 * i), *p.add(2 * i + 1)]) as u32) << 16)
    };
    for i in k & !31..k {
        sumf += (bf(wp, i) * bf(xp, i)) as f64;
    }
    sumf as f32
}

/// Activation rows one multi-row call takes (their outputs computed exactly as one-row calls).
pub const ROWS4: usize = 4;

/// [`q8_0`] for 4 activation rows sharing each loaded weight block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0_x4(w: &[u8], xs: [&[u8]; ROWS4], k: usize) -> [f32; ROWS4] {
    let nb = k / 32;
    assert!(w.len() >= nb * 34 && xs.iter().all(|x| x.len() >= nb * 34));
    let wp = w.as_ptr();
    let mut acc = [_mm256_setzero_ps(); ROWS4];
    for i in 0..nb {
        let wb = wp.add(34 * i);
        let dw = f16_at(wb);
        let qx = load32(wb.add(2));
        let ax = _mm256_sign_epi8(qx, qx);
        for (a, x) in acc.iter_mut().zip(&xs) {
            let yb = x.as_ptr().add(34 * i);
            let sy = _mm256_sign_epi8(load32(yb.add(2)), qx);
            let q = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
            let d = _mm256_set1_ps(dw * f16_at(yb));
            *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), *a);
        }
    }
    acc.map(|a| hsum(a))
}

/// [`q4_k`] for 4 activation rows sharing each decoded weight super-block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_k_x4(w: &[u8], xs: [&[u8]; ROWS4], k: usize) -> [f32; ROWS4] {
    let nb = k / 256;
    assert!(w.len() >= nb * 144 && xs.iter().all(|x| x.len() >= nb * 292));
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = [_mm256_setzero_ps(); ROWS4];
    let mut acc_m = [[0.0f32; 4]; ROWS4];
    for i in 0..nb {
        let wb = w.as_ptr().add(144 * i);
        let (wd, wmin) = (f16_at(wb), f16_at(wb.add(2)));
        let (sc, mn) = scale_min_k4(&w[144 * i + 4..144 * i + 16]);
        let qs = wb.add(16);
        let mut sumi = [_mm256_setzero_si256(); ROWS4];
        for j in 0..4 {
            let bits = load32(qs.add(32 * j));
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            let (sl, sh) = (
                _mm256_set1_epi16(sc[2 * j] as i16),
                _mm256_set1_epi16(sc[2 * j + 1] as i16),
            );
            for (s, x) in sumi.iter_mut().zip(&xs) {
                let q8 = x.as_ptr().add(292 * i + 4);
                let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(lo, load32(q8.add(64 * j))));
                let ph =
                    _mm256_madd_epi16(sh, _mm256_maddubs_epi16(hi, load32(q8.add(64 * j + 32))));
                *s = _mm256_add_epi32(*s, _mm256_add_epi32(pl, ph));
            }
        }
        for r in 0..ROWS4 {
            let yb = xs[r].as_ptr().add(292 * i);
            let yd = q8k_d(yb);
            let (d, dmin) = (yd * wd, -yd * wmin);
            for (t, m) in acc_m[r].iter_mut().enumerate() {
                let s0 = bsum(yb, 4 * t) + bsum(yb, 4 * t + 1);
                let s1 = bsum(yb, 4 * t + 2) + bsum(yb, 4 * t + 3);
                let prod = mn[2 * t] * s0 + mn[2 * t + 1] * s1;
                *m = dmin.mul_add(prod as f32, *m);
            }
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
        }
    }
    std::array::from_fn(|r| {
        let m = &acc_m[r];
        hsum(acc[r]) + ((m[0] + m[2]) + (m[1] + m[3]))
    })
}

/// [`q6_k`] for 4 activation rows sharing each decoded weight super-block.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k_x4(w: &[u8], xs: [&[u8]; ROWS4], k: usize) -> [f32; ROWS4] {
    let nb = k / 256;
    assert!(w.len() >= nb * 210 && xs.iter().all(|x| x.len() >= nb * 292));
    let m15 = _mm256_set1_epi8(15);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); ROWS4];
    for i in 0..nb {
        let wb = w.as_ptr().add(210 * i);
        let wd = f16_at(wb.add(208));
        let sc: [i8; 16] = std::array::from_fn(|j| *wb.add(192 + j) as i8);
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192) as *const __m128i));
        let (ql, qh) = (wb, wb.add(128));
        let mut sumi = [_mm256_setzero_si256(); ROWS4];
        for j in 0..2 {
            let b1 = load32(ql.add(64 * j));
            let b2 = load32(ql.add(64 * j + 32));
            let h = load32(qh.add(32 * j));
            let h0 = _mm256_slli_epi16(_mm256_and_si256(h, m3), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(12)), 2);
            let h2 = _mm256_and_si256(h, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(-64)), 2);
            let q = [
                _mm256_or_si256(_mm256_and_si256(b1, m15), h0),
                _mm256_or_si256(_mm256_and_si256(b2, m15), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15), h3),
            ];
            for (c, qc) in q.iter().enumerate() {
                let s = split_scale(sc[8 * j + 2 * c], sc[8 * j + 2 * c + 1]);
                for (sr, x) in sumi.iter_mut().zip(&xs) {
                    let y = load32(x.as_ptr().add(292 * i + 4 + 128 * j + 32 * c));
                    let p = _mm256_maddubs_epi16(*qc, y);
                    *sr = _mm256_add_epi32(*sr, _mm256_madd_epi16(s, p));
                }
            }
        }
        for r in 0..ROWS4 {
            let yb = xs[r].as_ptr().add(292 * i);
            let sub = _mm256_slli_epi32(_mm256_madd_epi16(load32(yb.add(260)), scales16), 5);
            let d = q8k_d(yb) * wd;
            let s = _mm256_sub_epi32(sumi[r], sub);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc[r]);
        }
    }
    acc.map(|a| hsum(a))
}
