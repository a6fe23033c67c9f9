//! CPU compute kernels working directly on ggml's quantized block layouts (no Python types).
//!
//! * [`act`] — activations converted to a weight type's vec_dot type (x86 ggml rules)
//! * [`dot`] — one weight row · one activation row per weight type (ggml's AVX2 order)
//! * [`matmul`] — the multi-threaded, tiled matmul over any supported weight type
//! * [`matmul_step`] — a whole MUL_MAT node (strided operands, broadcast batches)
//! * [`gemm_q8`] — its many-row path for q8_0/q4_0/q5_0 weights (decoded tiles)
//! * [`q4k_paired`] — its one-row Q4_K path with AVX-512 (activations re-laid per call)
//! * [`gemm_float`] — its many-row path for float weights, in llamafile tinyBLAS's order
//! * [`expf8`] — ggml's vector expf on eight lanes (soft max, SwiGLU)
//! * [`expf_libm`] — the C library's scalar expf (flash attention's softmax), inline
//! * [`pool`] — the persistent worker threads every kernel call runs on
//! * [`f16vec`], [`flash_attn`], [`rowops`] — the non-matmul ops of a decode step, with ggml's
//!   roundings

pub mod act;
pub mod dot;
#[cfg(target_arch = "x86_64")]
pub mod dot_avx2;
pub mod expf8;
pub mod expf_libm;
pub mod f16_rows;
pub mod f16vec;
pub mod flash_attn;
pub mod gemm_float;
pub mod gemm_kquant;
pub mod gemm_q8;
pub mod kquant_tiles;
pub mod matmul;
pub mod matmul_step;
pub mod pool;
pub mod probe;
pub mod q4k_paired;
pub mod rowops;
#[cfg(test)]
mod test_util;

use std::fmt;

/// Inconsistent sizes handed to a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    pub reason: String,
}

impl KernelError {
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for KernelError {}

/// IEEE half (binary16) bits to float32 (exact).
#[inline(always)]
pub fn fp16_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    if exp == 0 {
        // zero or subnormal: mant * 2^-24, exact in float32
        let v = mant as f32 * f32::from_bits(0x3380_0000);
        return f32::from_bits(v.to_bits() | sign);
    }
    if exp == 31 {
        return f32::from_bits(sign | 0x7f80_0000 | (mant << 13));
    }
    f32::from_bits(sign | ((exp + 112) << 23) | (mant << 13))
}

/// float32 to IEEE half bits, rounding to nearest even (overflow to inf, NaN stays NaN), the
/// result of ggml's FP32_TO_FP16 conversions.
pub fn f32_to_fp16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xff00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7c00;
    let mantissa_bits = bits & 0x0000_0fff;
    let nonsign = exp_bits + mantissa_bits;
    ((sign >> 16)
        | if shl1_w > 0xff00_0000 {
            0x7e00
        } else {
            nonsign
        }) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_round_trip_all_finite() {
        for h in 0..=u16::MAX {
            let f = fp16_to_f32(h);
            if f.is_nan() {
                assert!(fp16_to_f32(f32_to_fp16(f)).is_nan());
            } else {
                assert_eq!(f32_to_fp16(f), h, "h={h:#x}");
            }
        }
    }

    #[test]
    fn f32_to_fp16_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and the next half (1 + 2^-10): ties to even (1.0)
        assert_eq!(f32_to_fp16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even)
        assert_eq!(f32_to_fp16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_fp16(70000.0), 0x7c00);
        assert_eq!(f32_to_fp16(-0.0), 0x8000);
        assert_eq!(f32_to_fp16(f32::powi(2.0, -24)), 0x0001);
    }
}
