//! AVX2+FMA+F16C builds of the hottest row dots (q8_0, q4_0, q4_K, q6_K, f16): the intrinsics
//! of ggml's x86 vec_dot, giving the same lanes, FMAs and final sums as the portable code in
//! [`super::dot`] (the tests compare both bit for bit).
//!
//! Every function here is `unsafe`: the caller guarantees the CPU has AVX2, FMA and F16C, and
//! the slices hold `k` values' worth of blocks (checked with asserts, so bad sizes panic rather
//! than read out of bounds).

use std::arch::x86_64::*;

use super::dot::{hsum8, scale_min_k4};

#[inline(always)]
unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
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
unsafe fn nibbles32(p: *const u8) -> __m256i {
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
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = [0.0f32; 4];
    for i in 0..nb {
        let wb = w.as_ptr().add(144 * i);
        let yb = x.as_ptr().add(292 * i);
        let yd = q8k_d(yb);
        let d = yd * f16_at(wb);
        let dmin = -yd * f16_at(wb.add(2));
        let (sc, mn) = scale_min_k4(&w[144 * i + 4..144 * i + 16]);
        for (t, m) in acc_m.iter_mut().enumerate() {
            let s0 = bsum(yb, 4 * t) + bsum(yb, 4 * t + 1);
            let s1 = bsum(yb, 4 * t + 2) + bsum(yb, 4 * t + 3);
            let prod = mn[2 * t] * s0 + mn[2 * t + 1] * s1;
            *m = dmin.mul_add(prod as f32, *m);
        }
        let (qs, q8) = (wb.add(16), yb.add(4));
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let bits = load32(qs.add(32 * j));
            let lo = _mm256_and_si256(bits, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            let pl = _mm256_maddubs_epi16(lo, load32(q8.add(64 * j)));
            let ph = _mm256_maddubs_epi16(hi, load32(q8.add(64 * j + 32)));
            let pl = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j] as i16), pl);
            let ph = _mm256_madd_epi16(_mm256_set1_epi16(sc[2 * j + 1] as i16), ph);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]))
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
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(210 * i);
        let yb = x.as_ptr().add(292 * i);
        let d = q8k_d(yb) * f16_at(wb.add(208));
        let sc: [i8; 16] = std::array::from_fn(|j| *wb.add(192 + j) as i8);
        let q8sums = load32(yb.add(260));
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192) as *const __m128i));
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
                let s = split_scale(sc[8 * j + 2 * c], sc[8 * j + 2 * c + 1]);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p));
            }
        }
        let sumi = _mm256_sub_epi32(sumi, sub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// f16 weights · f16 activations.
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
    while i < np {
        for (j, sj) in s.iter_mut().enumerate() {
            let at = 2 * (i + 8 * j);
            let a = _mm256_cvtph_ps(_mm_loadu_si128(wp.add(at) as *const __m128i));
            let b = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(at) as *const __m128i));
            *sj = _mm256_fmadd_ps(a, b, *sj);
        }
        i += 32;
    }
    let r = _mm256_add_ps(_mm256_add_ps(s[0], s[2]), _mm256_add_ps(s[1], s[3]));
    let mut a = [0.0f32; 8];
    _mm256_storeu_ps(a.as_mut_ptr(), r);
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let mut sumf = ((t[0] + t[1]) + (t[2] + t[3])) as f64;
    for i in np..k {
        sumf += (f16_at(wp.add(2 * i)) * f16_at(xp.add(2 * i))) as f64;
    }
    sumf as f32
}
