//! IEEE half (binary16) to and from float32, with the roundings of ggml's conversions.

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
