//! The AVX2 dot products of the float formats (f16, bf16, f32), ggml_vec_dot_* order.

use std::arch::x86_64::*;

use super::common::*;
use crate::kernels::cpu::avx512_vnni_active;

/// Whether [`f16`] prefetches ahead. On the Zen 3 VM the hardware prefetcher alone read the f16
/// stream (64 bytes per step) 4–8 % faster (one thread, 336 M sweep); on the AVX-512 EPYC VM
/// software prefetch read it 8–15 % faster (two threads, 280 MB of rows). AVX-512 tells the two
/// apart. The widened-activation dots of one activation row ([`f16_wide`], f16 decode's
/// [`f16_wide_rows8`]) never prefetch: with one conversion per step their loop is light enough
/// for the hardware prefetcher, and a prefetch per line cost them 20–30 % on the AVX-512 VM
/// (one and two threads, 336 M sweep); two rows (twice the loads and FMAs per weight line)
/// still gain from it.
#[inline(always)]
pub(crate) fn prefetch_f16_rows() -> bool {
    avx512_vnni_active()
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
/// same bits; see [`crate::kernels::gemm::f16_rows`]).
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_wide(w: &[u8], x: &[u8], k: usize) -> f32 {
    assert!(w.len() >= 2 * k && x.len() >= 4 * k);
    let (wp, xp) = (w.as_ptr(), x.as_ptr() as *const f32);
    let np = k & !31;
    let [s] = wide_steps(wp, [xp], np, false);
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

/// [`wide_step`] over the values `0..np` (a multiple of 32), prefetching the weights if `pf`:
/// each activation row's four accumulators.
#[inline(always)]
unsafe fn wide_steps<const R: usize>(
    wp: *const u8,
    xs: [*const f32; R],
    np: usize,
    pf: bool,
) -> [[__m256; 4]; R] {
    let mut s = [[_mm256_setzero_ps(); 4]; R];
    let mut i = 0;
    while i < np {
        if pf {
            prefetch_ahead(wp.add(2 * i));
        }
        wide_step(wp, xs, i, &mut s);
        i += 32;
    }
    s
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
    let s = wide_steps(wp, xp, np, prefetch_f16_rows());
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
        let s = wide_steps(w.add(row * stride), xs, k, pf);
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
pub(crate) unsafe fn reduce8(v: &[__m256; 8]) -> __m256 {
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
