//! ggml's AVX2 `ggml_v_expf` on eight lanes at once, and the soft-max / SwiGLU row loops
//! built on it. The operations are those of [`v_expf`] (which replays one lane
//! in scalar code), in the same order with the same fused multiply-adds, so every lane gets
//! the same bits; the tests compare both on many inputs, the special ranges included.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// ggml's AVX2 `ggml_v_expf`, lane by lane (the same operations, so the same bits).
#[inline(always)]
pub fn v_expf(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r); // 0x1.715476p+0
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // 0x1.7f7d1cp-20
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // 0x1.62e4p-1
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1.0f32.to_bits()));
    let c = n.abs() > 126.0;
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3d2b_9f17)) // 0x1.573e2ep-5
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)), // 0x1.555e66p-3, 0x1.fffdb6p-2
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6) * b); // 0x1.ffffecp-1
    if !c {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        return s1 * s1;
    }
    s2.mul_add(j, s2) * s1
}

/// `v_expf` of eight lanes.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn v_expf8(x: __m256) -> __m256 {
    let r = _mm256_set1_ps(f32::from_bits(0x4b40_0000));
    let z = _mm256_fmadd_ps(x, _mm256_set1_ps(f32::from_bits(0x3fb8_aa3b)), r);
    let n = _mm256_sub_ps(z, r);
    let neg_n = _mm256_sub_ps(_mm256_setzero_ps(), n);
    let inner = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(f32::from_bits(0x3f31_7200)), x);
    let b = _mm256_fmadd_ps(neg_n, _mm256_set1_ps(f32::from_bits(0x35bf_be8e)), inner);
    let e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_set1_epi32(0x3f80_0000)));
    let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
    let c = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0), _CMP_GT_OQ);
    let u = _mm256_mul_ps(b, b);
    let p1 = _mm256_fmadd_ps(
        _mm256_set1_ps(f32::from_bits(0x3c07_2010)),
        b,
        _mm256_set1_ps(f32::from_bits(0x3d2b_9f17)),
    );
    let p2 = _mm256_fmadd_ps(
        _mm256_set1_ps(f32::from_bits(0x3e2a_af33)),
        b,
        _mm256_set1_ps(f32::from_bits(0x3eff_fedb)),
    );
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(p1, u, p2),
        u,
        _mm256_mul_ps(_mm256_set1_ps(f32::from_bits(0x3f7f_fff6)), b),
    );
    let normal = _mm256_fmadd_ps(j, k, k);
    if _mm256_movemask_ps(c) == 0 {
        return normal;
    }
    // |n| > 126: scale in two steps (or saturate past 192), as ggml does
    let n_le_0 = _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ);
    let g = _mm256_and_si256(
        _mm256_castps_si256(n_le_0),
        _mm256_set1_epi32(0x8200_0000u32 as i32),
    );
    let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
    let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    let far = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0), _CMP_GT_OQ);
    let big = _mm256_blendv_ps(
        _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1),
        _mm256_mul_ps(s1, s1),
        far,
    );
    _mm256_blendv_ps(normal, big, c)
}

/// `rowops`' soft-max row on eight lanes at a time: `y = v_expf(x - max)`; returns
/// the sum (each chunk summed in f32 in the SSE order, chunks and tail in f64).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn soft_max_row(x: &[f32], y: &mut [f32], max: f32) -> f64 {
    let n = x.len().min(y.len());
    let np = n & !7;
    let mut sum = 0.0f64;
    let m = _mm256_set1_ps(max);
    for i in (0..np).step_by(8) {
        let v = v_expf8(_mm256_sub_ps(_mm256_loadu_ps(x.as_ptr().add(i)), m));
        _mm256_storeu_ps(y.as_mut_ptr().add(i), v);
        let h = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
        let t = _mm_add_ps(h, _mm_movehl_ps(h, h)); // (h0 + h2), (h1 + h3)
        sum += f64::from(_mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1))));
    }
    for i in np..n {
        let v = (x[i] - max).exp();
        sum += f64::from(v);
        y[i] = v;
    }
    sum
}

/// `rowops`' SwiGLU row (`x / (1 + v_expf(-x)) · g`) on eight lanes at a time, libm
/// expf on the tail. Raw pointers: `y` may be `x` or `g` (in place).
///
/// # Safety
/// AVX2 and FMA present; `x`, `g` readable and `y` writable for `n` floats.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn swiglu_row(x: *const f32, g: *const f32, y: *mut f32, n: usize) {
    let np = n & !7;
    let one = _mm256_set1_ps(1.0);
    for i in (0..np).step_by(8) {
        let xv = _mm256_loadu_ps(x.add(i));
        let e = v_expf8(_mm256_sub_ps(_mm256_setzero_ps(), xv));
        let s = _mm256_div_ps(xv, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(g.add(i))));
    }
    for i in np..n {
        let xi = x.add(i).read();
        y.add(i).write((xi / (1.0 + (-xi).exp())) * g.add(i).read());
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    fn have() -> bool {
        crate::kernels::cpu::has_features!("avx2", "fma")
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn lanes(x: [f32; 8]) -> [f32; 8] {
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), v_expf8(_mm256_loadu_ps(x.as_ptr())));
        out
    }

    /// Every lane equals the scalar replay, bit for bit, over the normal, scaled and saturated
    /// ranges and mixed chunks.
    #[test]
    fn eight_lanes_equal_the_scalar_replay() {
        if !have() {
            return;
        }
        let mut s = 0x1234_5678_9abc_def1u64;
        for _ in 0..20000 {
            let x: [f32; 8] = std::array::from_fn(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 400.0 - 200.0
            });
            // SAFETY: features checked above.
            let got = unsafe { lanes(x) };
            for l in 0..8 {
                assert_eq!(got[l].to_bits(), v_expf(x[l]).to_bits(), "x = {}", x[l]);
            }
        }
        let edges = [-0.0, 0.0, 87.0, 88.7, 89.0, -87.0, -103.0, -150.0, -1e-30];
        for &e in &edges {
            // SAFETY: features checked above.
            let got = unsafe { lanes([e; 8]) };
            assert_eq!(got[0].to_bits(), v_expf(e).to_bits(), "x = {e}");
        }
    }
}

/// The maximum of `x` (−inf when empty), or `None` when `x` holds a NaN.
///
/// # Safety
/// The CPU must support AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub unsafe fn max_row_no_nan(x: &[f32]) -> Option<f32> {
    let n = x.len();
    let np = n & !7;
    let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut nan = _mm256_setzero_ps();
    for i in (0..np).step_by(8) {
        let v = _mm256_loadu_ps(x.as_ptr().add(i));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m = _mm256_max_ps(m, v);
    }
    if _mm256_movemask_ps(nan) != 0 {
        return None;
    }
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let mut max = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    for &v in &x[np..] {
        if v.is_nan() {
            return None;
        }
        max = if max > v { max } else { v };
    }
    Some(max)
}
