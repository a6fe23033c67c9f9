//! The AVX2 dot products of the 32-element block formats against q8_0 / q8_1 activations.

use std::arch::x86_64::*;

use super::common::*;
use crate::kernels::blocks::tables::{e8m0_half, KVALUES_IQ4NL, KVALUES_MXFP4};

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
