//! Activation rows converted to a weight type's `vec_dot_type`, exactly as ggml's CPU backend
//! does it on x86 with AVX2 (the path the reference rpc-server runs on this project's hosts):
//!
//! * q8_0 / q8_1: `quantize_row_q8_0` / `quantize_row_q8_1` of arch/x86/quants.c: `d = amax / 127`,
//!   codes `round_half_even(x · (127 / amax))`; q8_1 also stores `s = fp16(d · Σ codes)`.
//! * q8_K: `quantize_row_q8_K_ref` (x86 has no SIMD version): `iscale = -127 / max` where `max`
//!   is the signed value of largest magnitude, codes `min(127, nearest_int(iscale · x))`,
//!   `d = 1 / iscale` as float32, and the 16 sums of 16 codes.
//! * f16: F16C's round-to-nearest-even; bf16: `GGML_FP32_TO_BF16` (nearest even, NaN quieted).
//! * f32: the bytes as they are.

use super::blocks::half::f32_to_fp16;
use super::cpu::simd_active;
use super::formats::ActFormat;

impl ActFormat {
    /// Converts one row (`x.len()` a multiple of the block) into `out` (`row_bytes` long).
    pub fn convert_row(self, x: &[f32], out: &mut [u8]) {
        match self {
            Self::Q8_0 | Self::Q8_1 if simd_active() => {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: simd_active() checked AVX2 and F16C on this CPU.
                unsafe {
                    quantize_q8_row_avx2(x, out, self == Self::Q8_1)
                };
            }
            Self::Q8_0 => {
                for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
                    let (d, _, qs) = quantize_q8_x86(xb);
                    ob[..2].copy_from_slice(&d.to_le_bytes());
                    ob[2..].copy_from_slice(&qs.map(|q| q as u8));
                }
            }
            Self::Q8_1 => {
                for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
                    let (d, s, qs) = quantize_q8_x86(xb);
                    ob[..2].copy_from_slice(&d.to_le_bytes());
                    ob[2..4].copy_from_slice(&s.to_le_bytes());
                    ob[4..].copy_from_slice(&qs.map(|q| q as u8));
                }
            }
            Self::Q8K => {
                for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
                    quantize_q8_k(xb, ob);
                }
            }
            Self::F16 => {
                #[cfg(target_arch = "x86_64")]
                if simd_active() {
                    // SAFETY: simd_active() checked F16C (and AVX2) on this CPU.
                    return unsafe { f16_row_f16c(x, out) };
                }
                for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
                    o.copy_from_slice(&f32_to_fp16(*v).to_le_bytes());
                }
            }
            Self::BF16 => {
                for (v, o) in x.iter().zip(out.chunks_exact_mut(2)) {
                    o.copy_from_slice(&f32_to_bf16(*v).to_le_bytes());
                }
            }
            Self::F32 => {
                for (v, o) in x.iter().zip(out.chunks_exact_mut(4)) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}

/// f32 → f16 with F16C's round-to-nearest-even, 8 values at a time (what ggml's x86 build runs;
/// the same bits as [`f32_to_fp16`] for every number).
///
/// # Safety
/// The CPU must support F16C and AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_row_f16c(x: &[f32], out: &mut [u8]) {
    use std::arch::x86_64::*;
    assert!(out.len() >= 2 * x.len());
    let mut chunks = x.chunks_exact(8);
    let mut at = 0;
    for c in &mut chunks {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(c.as_ptr()));
        _mm_storeu_si128(out.as_mut_ptr().add(at) as *mut __m128i, h);
        at += 16;
    }
    for (v, o) in chunks.remainder().iter().zip(out[at..].chunks_exact_mut(2)) {
        o.copy_from_slice(&f32_to_fp16(*v).to_le_bytes());
    }
}

/// Blocks of 32 as arch/x86 `quantize_row_q8_0` / `_q8_1` compute them, with the same
/// instructions (see [`quantize_q8_x86`], the scalar replay the tests compare against).
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn quantize_q8_row_avx2(x: &[f32], out: &mut [u8], with_sum: bool) {
    use std::arch::x86_64::*;
    let block_bytes = if with_sum { 36 } else { 34 };
    let head = block_bytes - 32;
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(block_bytes)) {
        // SAFETY: 32 floats in, 32 code bytes out at `head`.
        unsafe {
            let p = xb.as_ptr();
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            let sign = _mm256_set1_ps(-0.0);
            let mut max_abs = _mm256_andnot_ps(sign, v[0]);
            for vi in &v[1..] {
                max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign, *vi));
            }
            let mut m4 = _mm_max_ps(
                _mm256_extractf128_ps(max_abs, 1),
                _mm256_castps256_ps128(max_abs),
            );
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            let amax = _mm_cvtss_f32(m4);
            let d = amax / 127.0;
            let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let q = v.map(|vi| {
                _mm256_cvtps_epi32(_mm256_round_ps::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(
                    vi, id,
                )))
            });
            ob[..2].copy_from_slice(&f32_to_fp16(d).to_le_bytes());
            if with_sum {
                let s =
                    _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
                let mut lanes = [0i32; 8];
                _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, s);
                let sum = lanes.iter().fold(0i32, |a, &b| a.wrapping_add(b));
                ob[2..4].copy_from_slice(&f32_to_fp16(d * sum as f32).to_le_bytes());
            }
            let lo = _mm256_packs_epi32(q[0], q[1]);
            let hi = _mm256_packs_epi32(q[2], q[3]);
            let bytes = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(lo, hi),
                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
            );
            _mm256_storeu_si256(ob.as_mut_ptr().add(head) as *mut __m256i, bytes);
        }
    }
}

/// `_mm_max_ps(a, b)`: `a > b ? a : b` (the second operand wins ties and NaNs).
#[inline(always)]
fn max_ps(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// One 32-value block as arch/x86 `quantize_row_q8_0/1` computes it: (fp16 `d`, fp16 `s`, codes).
pub fn quantize_q8_x86(x: &[f32]) -> (u16, u16, [i8; 32]) {
    // max over 4 registers of 8 lanes, then the same 8 -> 4 -> 2 -> 1 reduction
    let mut lanes = [0.0f32; 8];
    for (l, m) in lanes.iter_mut().enumerate() {
        *m = x[l].abs();
        for r in 1..4 {
            *m = max_ps(*m, x[8 * r + l].abs());
        }
    }
    let m4: [f32; 4] = std::array::from_fn(|i| max_ps(lanes[i + 4], lanes[i]));
    let m2 = [max_ps(m4[0], m4[2]), max_ps(m4[1], m4[3])];
    let amax = max_ps(m2[0], m2[1]);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0i32;
    for (q, v) in qs.iter_mut().zip(x) {
        // vroundps (nearest even), vcvtps2dq (NaN / out of range: i32::MIN), saturating packs
        let p = v * id;
        let i = if p.abs() < 4_194_304.0 {
            // |p| < 2^22: adding 1.5·2^23 rounds to an integer, ties to even
            ((p + 12_582_912.0) - 12_582_912.0) as i32
        } else if p.is_nan() || p.abs() >= 2_147_483_648.0 {
            i32::MIN
        } else {
            p.round_ties_even() as i32
        };
        sum = sum.wrapping_add(i);
        *q = i.clamp(-128, 127) as i8;
    }
    (f32_to_fp16(d), f32_to_fp16(d * sum as f32), qs)
}

/// ggml's `nearest_int`: round half to even via the 1.5·2^23 trick (|v| < 2^22).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let val = v + 12_582_912.0;
    ((val.to_bits() & 0x007f_ffff) as i32) - 0x0040_0000
}

/// One 256-value block as `quantize_row_q8_K_ref`: f32 `d`, 256 codes, 16 i16 sums.
pub fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if simd_active() && x.len() == 256 {
        // SAFETY: AVX2 detected; 256 values in. NaN blocks take the scalar loop (its order).
        if unsafe { quantize_q8_k_avx2(x, out) } {
            return;
        }
    }
    quantize_q8_k_scalar(x, out);
}

/// [`quantize_q8_k`] with the max search and the codes on 8 lanes; false (nothing written)
/// when the block holds a NaN.
///
/// # Safety
/// The CPU must support AVX2; `x` holds 256 values, `out` 292 bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_q8_k_avx2(x: &[f32], out: &mut [u8]) -> bool {
    use std::arch::x86_64::*;
    let p = x.as_ptr();
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut amax8 = _mm256_setzero_ps();
    let mut nan = _mm256_setzero_ps();
    for i in (0..256).step_by(8) {
        let v = unsafe { _mm256_loadu_ps(p.add(i)) };
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        amax8 = _mm256_max_ps(amax8, _mm256_and_ps(v, abs_mask));
    }
    if _mm256_movemask_ps(nan) != 0 {
        return false;
    }
    let mut lanes = [0.0f32; 8];
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), amax8) };
    let amax = lanes.iter().fold(0.0f32, |a, &b| a.max(b));
    out.fill(0);
    if amax == 0.0 {
        return true;
    }
    // the scalar loop keeps the first value of largest magnitude
    let max = *x.iter().find(|v| v.abs() == amax).unwrap_or(&amax);
    let iscale = -127.0 / max;
    let sc = _mm256_set1_ps(iscale);
    let magic = _mm256_set1_ps(12_582_912.0);
    let low = _mm256_set1_epi32(0x007f_ffff);
    let half = _mm256_set1_epi32(0x0040_0000);
    let cap = _mm256_set1_epi32(127);
    let byte = _mm256_set1_epi32(0xff);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for i in (0..256).step_by(32) {
        // nearest_int(iscale · v).min(127), then its low byte (`as i8`)
        let q: [__m256i; 4] = std::array::from_fn(|j| unsafe {
            let v = _mm256_mul_ps(sc, _mm256_loadu_ps(p.add(i + 8 * j)));
            let bits = _mm256_castps_si256(_mm256_add_ps(v, magic));
            let n = _mm256_sub_epi32(_mm256_and_si256(bits, low), half);
            _mm256_and_si256(_mm256_min_epi32(n, cap), byte)
        });
        let w = _mm256_packus_epi16(
            _mm256_packus_epi32(q[0], q[1]),
            _mm256_packus_epi32(q[2], q[3]),
        );
        let w = _mm256_permutevar8x32_epi32(w, order);
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(4 + i) as *mut __m256i, w) };
    }
    out[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for j in 0..16 {
        let s: i32 = out[4 + 16 * j..4 + 16 * (j + 1)]
            .iter()
            .map(|&q| q as i8 as i32)
            .sum();
        out[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
    }
    true
}

fn quantize_q8_k_scalar(x: &[f32], out: &mut [u8]) {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let a = v.abs();
        if a > amax {
            amax = a;
            max = v;
        }
    }
    out.fill(0);
    if amax == 0.0 {
        return;
    }
    let iscale = -127.0 / max;
    let mut qs = [0i8; 256];
    for (q, v) in qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    out[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for (o, q) in out[4..260].iter_mut().zip(qs) {
        *o = q as u8;
    }
    for (j, chunk) in qs.chunks_exact(16).enumerate() {
        let s: i32 = chunk.iter().map(|&q| q as i32).sum();
        out[260 + 2 * j..262 + 2 * j].copy_from_slice(&(s as i16).to_le_bytes());
    }
}

/// `GGML_FP32_TO_BF16`: round to nearest even, NaN forced quiet.
pub fn f32_to_bf16(f: f32) -> u16 {
    let u = f.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// F16C's conversion equals the software one for every non-NaN bit pattern class: random
    /// bits, ties, subnormals, overflow and infinities.
    #[test]
    fn f16c_conversion_equals_software() {
        if !simd_active() {
            return; // the F16C path only runs where detected (the software path is the spec)
        }
        let mut vals = vec![
            1.0 + f32::powi(2.0, -11),
            65520.0,
            65519.0,
            7e-8,
            3e-8,
            -0.0,
        ];
        vals.extend([
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            6.1e-5,
        ]);
        let mut s: u32 = 0x1234_5678;
        vals.extend(
            (0..1 << 16)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 17;
                    s ^= s << 5;
                    f32::from_bits(s)
                })
                .filter(|v| !v.is_nan()),
        );
        let n = vals.len() & !7;
        let mut hw = vec![0u8; 2 * n];
        ActFormat::F16.convert_row(&vals[..n], &mut hw);
        for (v, h) in vals[..n].iter().zip(hw.chunks_exact(2)) {
            assert_eq!(u16::from_le_bytes([h[0], h[1]]), f32_to_fp16(*v), "{v:e}");
        }
    }

    #[test]
    fn q8_ties_round_to_even() {
        // amax 127 -> id = 1: 2.5 -> 2, 3.5 -> 4, -0.5 -> 0
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = 3.5;
        x[3] = -0.5;
        let (d, s, qs) = quantize_q8_x86(&x);
        assert_eq!(d, f32_to_fp16(1.0));
        assert_eq!(&qs[..4], &[127, 2, 4, 0]);
        assert_eq!(s, f32_to_fp16(133.0));
    }

    /// The AVX2 block quantizer gives the scalar replay's bytes: random rows of several
    /// magnitudes, exact ties, an all-zero block, huge values and infinities.
    #[test]
    fn simd_q8_blocks_equal_the_replay() {
        if !simd_active() {
            return;
        }
        let mut x = Vec::new();
        for scale in [1e-3f32, 1.0, 37.0, 1e6] {
            x.extend(
                crate::kernels::test_util::noise(scale as u64 + 3, 32 * 9)
                    .iter()
                    .map(|v| v * scale),
            );
        }
        let mut ties = [0.0f32; 32];
        ties[0] = 127.0;
        for (i, t) in ties.iter_mut().enumerate().skip(1) {
            *t = i as f32 - 16.5;
        }
        x.extend(ties);
        x.extend([0.0f32; 32]);
        let mut big = [1.0f32; 32];
        big[3] = 3e38;
        big[4] = -3e38;
        x.extend(big);
        let mut inf = [2.0f32; 32];
        inf[7] = f32::INFINITY;
        x.extend(inf);
        for (fmt, bytes) in [(ActFormat::Q8_0, 34), (ActFormat::Q8_1, 36)] {
            let mut fast = vec![0u8; x.len() / 32 * bytes];
            fmt.convert_row(&x, &mut fast);
            for (xb, ob) in x.chunks_exact(32).zip(fast.chunks_exact(bytes)) {
                let (d, s, qs) = quantize_q8_x86(xb);
                assert_eq!(&ob[..2], &d.to_le_bytes(), "{xb:?}");
                if bytes == 36 {
                    assert_eq!(&ob[2..4], &s.to_le_bytes(), "{xb:?}");
                }
                assert_eq!(&ob[bytes - 32..], &qs.map(|q| q as u8), "{xb:?}");
            }
        }
    }

    /// The AVX2 q8_K blocks equal the scalar ones: random blocks, ties of magnitude (first
    /// one wins), exact rounding ties, all-zero and tiny blocks.
    #[test]
    fn simd_q8_k_blocks_equal_scalar() {
        if !simd_active() {
            return;
        }
        let mut blocks: Vec<Vec<f32>> = Vec::new();
        for (i, scale) in [1e-30f32, 1e-3, 1.0, 5e4, 1e30].iter().enumerate() {
            blocks.push(
                crate::kernels::test_util::noise(i as u64 + 11, 256)
                    .iter()
                    .map(|v| v * scale)
                    .collect(),
            );
        }
        let mut tie = vec![0.25f32; 256];
        tie[9] = 2.0;
        tie[40] = -2.0; // same magnitude later: the first (positive) one is the max
        blocks.push(tie.clone());
        tie[9] = -2.0;
        tie[40] = 2.0;
        blocks.push(tie);
        blocks.push(
            (0..256)
                .map(|i| (i as f32 - 127.5) / 127.5 * 127.0)
                .collect(),
        );
        blocks.push(vec![0.0; 256]);
        blocks.push(vec![-0.0; 256]);
        for b in &blocks {
            let (mut fast, mut slow) = ([7u8; 292], [9u8; 292]);
            quantize_q8_k(b, &mut fast);
            quantize_q8_k_scalar(b, &mut slow);
            assert_eq!(fast, slow, "{:?}", &b[..4]);
        }
    }

    #[test]
    fn q8_k_uses_signed_max() {
        let mut x = [0.1f32; 256];
        x[5] = -2.0;
        let mut out = [0u8; 292];
        quantize_q8_k(&x, &mut out);
        let d = f32::from_le_bytes(out[..4].try_into().unwrap());
        assert_eq!(d, 1.0 / (-127.0f32 / -2.0));
        assert_eq!(out[4 + 5] as i8, -127);
        assert_eq!(out[4] as i8, nearest_int(63.5 * 0.1) as i8);
    }

    #[test]
    fn bf16_rounding() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // halfway between 0x3f80 and 0x3f81: to even
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::NAN) & 0x40, 0x40);
    }
}
