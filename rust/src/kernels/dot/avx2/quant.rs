//! The AVX2 dot products of the 32-element block formats against q8_0 / q8_1 activations.

use std::arch::x86_64::*;

use super::common::*;
use crate::kernels::blocks::tables::{e8m0_half, KVALUES_IQ4NL, KVALUES_MXFP4};

/// Σ over the `k / 32` blocks of `d · lanes` in one float register, then its `hsum`:
/// `block(wb, yb)` gives `d` and the lanes of a weight block (`w_bytes`) and an activation block
/// (`x_bytes`).
#[inline(always)]
unsafe fn one_acc(
    w: &[u8],
    x: &[u8],
    k: usize,
    (w_bytes, x_bytes): (usize, usize),
    mut block: impl FnMut(*const u8, *const u8) -> (__m256, __m256i),
) -> f32 {
    let nb = k / 32;
    assert!(w.len() >= nb * w_bytes && x.len() >= nb * x_bytes);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let (d, q) = block(wp.add(w_bytes * i), xp.add(x_bytes * i));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), acc);
    }
    hsum(acc)
}

/// q8_0 weights · q8_0 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q8_0(w: &[u8], x: &[u8], k: usize) -> f32 {
    one_acc(w, x, k, (34, 34), |wb, yb| {
        prefetch_ahead(wb);
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(yb));
        (d, dot_i8(load32(wb.add(2)), load32(yb.add(2))))
    })
}

/// q4_0 weights · q8_0 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_0(w: &[u8], x: &[u8], k: usize) -> f32 {
    one_acc(w, x, k, (18, 34), |wb, yb| {
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(yb));
        let qx = _mm256_sub_epi8(nibbles32(wb.add(2)), _mm256_set1_epi8(8));
        (d, dot_i8(qx, load32(yb.add(2))))
    })
}

/// q5_0 weights · q8_0 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_0(w: &[u8], x: &[u8], k: usize) -> f32 {
    one_acc(w, x, k, (22, 34), |wb, yb| {
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(yb));
        let hi = _mm256_andnot_si256(bytes_from_bits(wb.add(2)), _mm256_set1_epi8(-16));
        let qx = _mm256_or_si256(nibbles32(wb.add(6)), hi);
        (d, dot_i8(qx, load32(yb.add(2))))
    })
}

/// q4_1 weights · q8_1 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q4_1(w: &[u8], x: &[u8], k: usize) -> f32 {
    let mut summs = 0.0f32;
    let sum = one_acc(w, x, k, (20, 36), |wb, yb| {
        summs = f16_at(wb.add(2)).mul_add(f16_at(yb.add(2)), summs);
        let d = _mm256_set1_ps(f16_at(wb) * f16_at(yb));
        (d, dot_u8(nibbles32(wb.add(4)), load32(yb.add(4))))
    });
    sum + summs
}

/// q5_1 weights · q8_1 activations.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn q5_1(w: &[u8], x: &[u8], k: usize) -> f32 {
    let mut summs = 0.0f32;
    let sum = one_acc(w, x, k, (24, 36), |wb, yb| {
        summs = f16_at(wb.add(2)).mul_add(f16_at(yb.add(2)), summs);
        let hi = _mm256_and_si256(bytes_from_bits(wb.add(4)), _mm256_set1_epi8(0x10));
        let qx = _mm256_or_si256(nibbles32(wb.add(8)), hi);
        // fma(d, lanes) = fma(lanes, d): ggml's operand order, same product
        (
            _mm256_set1_ps(f16_at(wb) * f16_at(yb)),
            dot_u8(qx, load32(yb.add(4))),
        )
    });
    sum + summs
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
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    one_acc(w, x, k, (18, 34), |wb, yb| {
        let q = dot_i8(table32(table, wb.add(2)), load32(yb.add(2)));
        (_mm256_set1_ps(f16_at(yb) * f16_at(wb)), q)
    })
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
