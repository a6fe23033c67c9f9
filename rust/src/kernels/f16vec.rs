//! Half-precision vector primitives computed exactly as ggml's x86 CPU backend does them in an
//! AVX2 + FMA + F16C build (the reference server's ISA on the machines rpcnet is measured on):
//!
//! * [`dot_f16`] — `ggml_vec_dot_f16`: four 8-lane float32 accumulators over 32-element steps
//!   (`acc = fma(x, y, acc)`), reduced pairwise (`a0+a2, a1+a3`, then halves, then two
//!   horizontal adds), the tail added in double precision.
//! * [`mad_f16`] — `ggml_vec_mad_f16`: `y = f16(fma(x, v, y))`.
//! * [`scale_f16`] — `ggml_vec_scale_f16`: `y = f16(y · v)`.
//!
//! Each has a portable version with the same arithmetic (every rounding step, lane order
//! included), chosen at run time or forced with [`crate::kernels::cpu::set_portable_only`]
//! (tests run both).

use super::blocks::half::{f32_to_fp16, fp16_to_f32};
use super::cpu::use_avx2;

/// Elements per step of ggml's f16 loops (4 registers of 8 lanes).
const STEP: usize = 32;
const LANES: usize = 8;

/// The reduction of ggml's `GGML_F32x8_REDUCE` over four accumulators.
#[inline(always)]
fn reduce_lanes(acc: [[f32; LANES]; 4]) -> f32 {
    let a02: [f32; LANES] = std::array::from_fn(|l| acc[0][l] + acc[2][l]);
    let a13: [f32; LANES] = std::array::from_fn(|l| acc[1][l] + acc[3][l]);
    let a: [f32; LANES] = std::array::from_fn(|l| a02[l] + a13[l]);
    let t: [f32; 4] = std::array::from_fn(|l| a[l] + a[l + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `Σ x[i]·y[i]` over f16 bits, as `ggml_vec_dot_f16`; `x.len() == y.len()`.
pub fn dot_f16(x: &[u16], y: &[u16]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: the features were detected above.
        return unsafe { dot_f16_avx2(x, y) };
    }
    dot_f16_portable(x, y)
}

pub fn dot_f16_portable(x: &[u16], y: &[u16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !(STEP - 1);
    let mut acc = [[0.0f32; LANES]; 4];
    for i in (0..np).step_by(STEP) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                let p = i + j * LANES + l;
                *lane = fp16_to_f32(x[p]).mul_add(fp16_to_f32(y[p]), *lane);
            }
        }
    }
    let mut sum = f64::from(reduce_lanes(acc));
    for p in np..n {
        sum += f64::from(fp16_to_f32(x[p]) * fp16_to_f32(y[p]));
    }
    sum as f32
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`use_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub unsafe fn dot_f16_avx2(x: &[u16], y: &[u16]) -> f32 {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len());
    let np = n & !(STEP - 1);
    let mut acc = [_mm256_setzero_ps(); 4];
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut i = 0;
    while i < np {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 32 <= np <= len of both slices.
            unsafe {
                let vx = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(i + j * LANES) as *const __m128i));
                let vy = _mm256_cvtph_ps(_mm_loadu_si128(yp.add(i + j * LANES) as *const __m128i));
                *a = _mm256_fmadd_ps(vx, vy, *a);
            }
        }
        i += STEP;
    }
    reduce_avx2(&acc, np..n, |p| fp16_to_f32(x[p]) * fp16_to_f32(y[p]))
}

/// `GGML_F32x8_REDUCE` of the four accumulators (`(a0 + a2) + (a1 + a3)`, halves, two
/// horizontal adds), then the leftover elements' products `product(p)`, `p` in `tail`, added
/// in f64.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn reduce_avx2(
    acc: &[std::arch::x86_64::__m256; 4],
    tail: std::ops::Range<usize>,
    product: impl Fn(usize) -> f32,
) -> f32 {
    use std::arch::x86_64::*;
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]));
    let t0 = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    let t1 = _mm_hadd_ps(t0, t0);
    let mut sum = f64::from(_mm_cvtss_f32(_mm_hadd_ps(t1, t1)));
    for p in tail {
        sum += f64::from(product(p));
    }
    sum as f32
}

/// [`dot_f16_avx2`] of `x` against `R` f16 rows widened to f32 beforehand (exactly: the
/// values `vcvtph2ps` gives): each `x` vector converted once for all rows and no row converted
/// at all, each row's accumulators, reduction and tail unchanged (same bits).
///
/// # Safety
/// AVX2, FMA and F16C present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub unsafe fn dot_f16_wide_avx2<const R: usize>(x: &[u16], ys: [&[f32]; R]) -> [f32; R] {
    use std::arch::x86_64::*;
    let n = ys.iter().fold(x.len(), |n, y| n.min(y.len()));
    let np = n & !(STEP - 1);
    let mut acc = [[_mm256_setzero_ps(); 4]; R];
    let xp = x.as_ptr();
    let yp = ys.map(|y| y.as_ptr());
    let mut i = 0;
    while i < np {
        for j in 0..4 {
            // SAFETY: i + 32 <= np <= len of every slice.
            unsafe {
                let vx = _mm256_cvtph_ps(_mm_loadu_si128(xp.add(i + j * LANES) as *const __m128i));
                for (a, y) in acc.iter_mut().zip(yp) {
                    a[j] = _mm256_fmadd_ps(vx, _mm256_loadu_ps(y.add(i + j * LANES)), a[j]);
                }
            }
        }
        i += STEP;
    }
    std::array::from_fn(|r| reduce_avx2(&acc[r], np..n, |p| fp16_to_f32(x[p]) * ys[r][p]))
}

/// `y[i] = f16(x[i]·v + y[i])` (fused), as `ggml_vec_mad_f16`.
pub fn mad_f16(y: &mut [u16], x: &[u16], v: f32) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: the features were detected above.
        return unsafe { mad_f16_avx2(y, x, v) };
    }
    mad_f16_portable(y, x, v)
}

pub fn mad_f16_portable(y: &mut [u16], x: &[u16], v: f32) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi = f32_to_fp16(fp16_to_f32(*xi).mul_add(v, fp16_to_f32(*yi)));
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`use_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub unsafe fn mad_f16_avx2(y: &mut [u16], x: &[u16], v: f32) {
    use std::arch::x86_64::*;
    let n = y.len().min(x.len());
    let np = n & !(LANES - 1);
    let vv = _mm256_set1_ps(v);
    let mut i = 0;
    while i < np {
        // SAFETY: i + 8 <= np <= len of both slices.
        unsafe {
            let vx = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(i) as *const __m128i));
            let py = y.as_mut_ptr().add(i);
            let vy = _mm256_cvtph_ps(_mm_loadu_si128(py as *const __m128i));
            let r = _mm256_fmadd_ps(vx, vv, vy);
            _mm_storeu_si128(py as *mut __m128i, _mm256_cvtps_ph::<0>(r));
        }
        i += LANES;
    }
    mad_f16_portable(&mut y[np..n], &x[np..n], v);
}

/// `y[i] = f16(y[i]·v)`, as `ggml_vec_scale_f16`.
pub fn scale_f16(y: &mut [u16], v: f32) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: the features were detected above.
        return unsafe { scale_f16_avx2(y, v) };
    }
    scale_f16_portable(y, v)
}

pub fn scale_f16_portable(y: &mut [u16], v: f32) {
    for yi in y.iter_mut() {
        *yi = f32_to_fp16(fp16_to_f32(*yi) * v);
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`use_avx2`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub unsafe fn scale_f16_avx2(y: &mut [u16], v: f32) {
    use std::arch::x86_64::*;
    let n = y.len();
    let np = n & !(LANES - 1);
    let vv = _mm256_set1_ps(v);
    let mut i = 0;
    while i < np {
        // SAFETY: i + 8 <= np <= len.
        unsafe {
            let py = y.as_mut_ptr().add(i);
            let vy = _mm256_cvtph_ps(_mm_loadu_si128(py as *const __m128i));
            _mm_storeu_si128(
                py as *mut __m128i,
                _mm256_cvtps_ph::<0>(_mm256_mul_ps(vy, vv)),
            );
        }
        i += LANES;
    }
    scale_f16_portable(&mut y[np..], v);
}

/// A row conversion `$name(x, out)`, element by element with `$one`, and its AVX2 build `$avx2`
/// converting eight at a time with `$eight` (`$x`, `$o`: pointers to the eight values).
macro_rules! row_conversion {
    ($(#[$doc:meta])* $name:ident, $avx2:ident, $a:ty => $b:ty, $one:expr,
     |$x:ident, $o:ident| $eight:expr) => {
        $(#[$doc])*
        pub fn $name(x: &[$a], out: &mut [$b]) {
            #[cfg(target_arch = "x86_64")]
            if use_avx2() {
                // SAFETY: the features were detected above.
                return unsafe { $avx2(x, out) };
            }
            for (o, v) in out.iter_mut().zip(x) {
                *o = $one(*v);
            }
        }

        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $avx2(x: &[$a], out: &mut [$b]) {
            use std::arch::x86_64::*;
            let n = x.len().min(out.len());
            let np = n & !(LANES - 1);
            let mut i = 0;
            while i < np {
                // SAFETY: i + 8 <= np <= len of both slices.
                unsafe {
                    let ($x, $o) = (x.as_ptr().add(i), out.as_mut_ptr().add(i));
                    $eight;
                }
                i += LANES;
            }
            for p in np..n {
                out[p] = $one(x[p]);
            }
        }
    };
}

row_conversion!(
    /// float32 values to f16 bits, rounding to nearest even (ggml's `from_float` for f16).
    f32_row_to_f16, f32_row_to_f16_avx2, f32 => u16, f32_to_fp16,
    |x, o| _mm_storeu_si128(o as *mut __m128i, _mm256_cvtps_ph::<0>(_mm256_loadu_ps(x)))
);

row_conversion!(
    /// f16 bits to float32 values (exact).
    f16_row_to_f32, f16_row_to_f32_avx2, u16 => f32, fp16_to_f32,
    |x, o| _mm256_storeu_ps(o, _mm256_cvtph_ps(_mm_loadu_si128(x as *const __m128i)))
);

#[cfg(test)]
mod tests {
    use super::*;

    fn halves(seed: u32, n: usize) -> Vec<u16> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                f32_to_fp16(((s % 20001) as f32 - 10000.0) / 3000.0)
            })
            .collect()
    }

    #[test]
    fn simd_and_portable_agree_bitwise() {
        if !use_avx2() {
            return; // nothing to compare on this CPU
        }
        for n in [1usize, 7, 8, 31, 32, 33, 64, 100, 128, 257] {
            let x = halves(1, n);
            let y = halves(2, n);
            // SAFETY: use_avx2() checked the features.
            let fast = unsafe { dot_f16_avx2(&x, &y) };
            assert_eq!(fast.to_bits(), dot_f16_portable(&x, &y).to_bits(), "n={n}");
            let (y2, mut w, mut w2) = (halves(5, n), vec![0.0; n], vec![0.0; n]);
            f16_row_to_f32(&y, &mut w);
            f16_row_to_f32(&y2, &mut w2);
            let [one] = unsafe { dot_f16_wide_avx2(&x, [&w]) };
            let two = unsafe { dot_f16_wide_avx2(&x, [&w, &w2]) };
            assert_eq!(one.to_bits(), fast.to_bits(), "n={n}");
            assert_eq!(
                two.map(f32::to_bits),
                [&y, &y2].map(|r| dot_f16_portable(&x, r).to_bits())
            );
            let (mut a, mut b) = (y.clone(), y.clone());
            unsafe { mad_f16_avx2(&mut a, &x, 0.37) };
            mad_f16_portable(&mut b, &x, 0.37);
            assert_eq!(a, b);
            unsafe { scale_f16_avx2(&mut a, 0.91) };
            scale_f16_portable(&mut b, 0.91);
            assert_eq!(a, b);
        }
    }

    #[test]
    fn dot_is_close_to_exact() {
        let x = halves(3, 200);
        let y = halves(4, 200);
        let exact: f64 = x
            .iter()
            .zip(&y)
            .map(|(a, b)| f64::from(fp16_to_f32(*a)) * f64::from(fp16_to_f32(*b)))
            .sum();
        assert!((f64::from(dot_f16_portable(&x, &y)) - exact).abs() < 1e-3);
    }
}
