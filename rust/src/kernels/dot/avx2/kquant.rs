//! The AVX2 dot products of the K-quant formats (and IQ4_XS) against q8_K activations.

use std::arch::x86_64::*;

use super::common::*;
use crate::kernels::blocks::tables::{q3k_scales, scale_min_k4, KVALUES_IQ4NL};
use crate::kernels::cpu::avx512_vnni_active;
use crate::kernels::dot::avx512::{q4_k_wide, q6_k_wide};

/// Q4_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    let nb = k / 256;
    assert!(w.len() >= nb * 144 && x.len() >= nb * 292);
    if avx512_vnni_active() {
        return q4_k_wide(w, x, nb);
    }
    let m4 = _mm256_set1_epi8(0xF);
    // i16 lane j of scale_at[j] picks scale j of a `scales` vector (get_scale_shuffle_k4)
    let scale_at: [__m256i; 8] =
        std::array::from_fn(|j| _mm256_set1_epi16((((2 * j + 1) << 8) | (2 * j)) as i16));
    q4k_blocks(w, x, nb, |qs, q8, sc, d, acc| {
        let scales = _mm256_set_m128i(sc, sc);
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
        _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc)
    })
}

/// Σ over the `k / 256` super-blocks (`w_bytes` each, against q8_K blocks) of `d · sumi` in one
/// float register, then its `hsum`: `block(i, wb, yb, acc)` gives super-block `i`'s `d` and
/// integer lanes, after any FMA of its own into `acc`.
#[inline(always)]
unsafe fn superblocks_acc(
    w: &[u8],
    x: &[u8],
    k: usize,
    w_bytes: usize,
    mut block: impl FnMut(usize, *const u8, *const u8, &mut __m256) -> (f32, __m256i),
) -> f32 {
    let nb = k / 256;
    assert!(w.len() >= nb * w_bytes && x.len() >= nb * 292);
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(w_bytes * i);
        let yb = x.as_ptr().add(292 * i);
        let (d, sumi) = block(i, wb, yb, &mut acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// The 128 six-bit codes of half `j` of a Q6_K super-block (low bits at `ql`, high bits at
/// `qh`), as four registers of 32 unsigned bytes in element order.
#[inline(always)]
unsafe fn q6k_codes(
    ql: *const u8,
    qh: *const u8,
    j: usize,
    m15: __m256i,
    m3: __m256i,
) -> [__m256i; 4] {
    let b1 = load32(ql.add(64 * j));
    let b2 = load32(ql.add(64 * j + 32));
    let h = load32(qh.add(32 * j));
    let h0 = _mm256_slli_epi16(_mm256_and_si256(h, m3), 4);
    let h1 = _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(12)), 2);
    let h2 = _mm256_and_si256(h, _mm256_set1_epi8(48));
    let h3 = _mm256_srli_epi16(_mm256_and_si256(h, _mm256_set1_epi8(-64)), 2);
    [
        _mm256_or_si256(_mm256_and_si256(b1, m15), h0),
        _mm256_or_si256(_mm256_and_si256(b2, m15), h1),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b1, 4), m15), h2),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(b2, 4), m15), h3),
    ]
}

/// Q6_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q6_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    if avx512_vnni_active() {
        let nb = k / 256;
        assert!(w.len() >= nb * 210 && x.len() >= nb * 292);
        return q6_k_wide(w, x, nb);
    }
    q6_k_avx2(w, x, k)
}

/// [`q6_k`] in ggml's AVX2 registers.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k_avx2(w: &[u8], x: &[u8], k: usize) -> f32 {
    let m15 = _mm256_set1_epi8(15);
    let m3 = _mm256_set1_epi8(3);
    // bytes 0-7 of pair_at[p] pick scale 2p, bytes 8-15 scale 2p + 1 ([`split_scale`])
    let pair_at: [__m128i; 8] = std::array::from_fn(|p| {
        _mm_set_epi64x(
            (0x0101_0101_0101_0101u64 * (2 * p as u64 + 1)) as i64,
            (0x0101_0101_0101_0101u64 * (2 * p as u64)) as i64,
        )
    });
    superblocks_acc(w, x, k, 210, |_, wb, yb, _| {
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
            let q = q6k_codes(ql, qh, j, m15, m3);
            for (c, qc) in q.iter().enumerate() {
                let p = _mm256_maddubs_epi16(*qc, load32(q8.add(128 * j + 32 * c)));
                let s = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, pair_at[4 * j + c]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s, p));
            }
        }
        let sumi = _mm256_sub_epi32(sumi, sub);
        (d, sumi)
    })
}

/// IQ4_XS weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn iq4_xs(w: &[u8], x: &[u8], k: usize) -> f32 {
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    superblocks_acc(w, x, k, 136, |_, wb, yb, _| {
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
        (d, sumi)
    })
}

/// Q5_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    let m4 = _mm256_set1_epi8(0xF);
    let mut summs = 0.0f32;
    let sum = superblocks_acc(w, x, k, 176, |i, wb, yb, _| {
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
        (d, sumi)
    });
    sum + summs
}

/// Q2_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q2_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    superblocks_acc(w, x, k, 84, |_, wb, yb, acc| {
        let yd = q8k_d(yb);
        let d = yd * f16_at(wb.add(80));
        let dmin = -yd * f16_at(wb.add(82));
        let raw = _mm_loadu_si128(wb as *const __m128i);
        let mins8 = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0xF));
        let prod = _mm256_madd_epi16(_mm256_cvtepi8_epi16(mins8), load32(yb.add(260)));
        *acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), *acc);
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
        (d, sumi)
    })
}

/// Q3_K weights · q8_K activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q3_k(w: &[u8], x: &[u8], k: usize) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    superblocks_acc(w, x, k, 110, |i, wb, yb, _| {
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
        (d, sumi)
    })
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
            let q = q6k_codes(ql, qh, j, m15, m3);
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
