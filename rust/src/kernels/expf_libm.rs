//! The C library's `expf` on x86-64 hosts with FMA, computed inline.
//!
//! ggml's flash attention calls `expf` once per KV position and query row; through the PLT that
//! call was a third of a decode row's attention time. glibc (2.27 on, the host's 2.36 and the
//! reference environment's 2.41 alike) selects its FMA build of expf on such hosts: one table
//! of 2^(i/32), a cubic in double precision and five fused multiply-adds, whose operations and
//! contractions this function repeats in the same order, so it returns the same bits. Inputs
//! outside that main path (|x| ≥ 88: overflow, underflow, infinities, NaN) go to the library
//! itself. Callers compile it with FMA enabled (inside an
//! `avx2,fma` function), or `mul_add` becomes a library call (same values, slower).

/// 2^(i/32) rounded to the nearest double, minus `i << 47`, so that adding `k << 47` for the
/// integer `k` (whose low five bits are `i`) gives 2^(k/32).
const TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

/// 32 / ln 2.
const INV_LN2_32: u64 = 0x40471547652b82fe;
/// 1.5·2^52: adding it rounds to an integer held in the low mantissa bits.
const SHIFT: u64 = 0x4338000000000000;
/// The cubic's coefficients for 2^(r/32) - 1 ≈ C0·r³ + C1·r² + C2·r.
const C0: u64 = 0x3ebc6af84b912394;
const C1: u64 = 0x3f2ebfce50fac4f3;
const C2: u64 = 0x3f962e42ff0c52d6;

/// `expf(x)` with the C library's result on FMA hosts.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    if (x.to_bits() >> 20) & 0x7ff > 0x42a {
        return x.exp();
    }
    let (inv_ln2_32, shift) = (f64::from_bits(INV_LN2_32), f64::from_bits(SHIFT));
    let xd = f64::from(x);
    // k = round(x·32/ln2) in the low bits of `shifted`; r = x·32/ln2 - k, both fused
    let shifted = inv_ln2_32.mul_add(xd, shift);
    let ki = shifted.to_bits();
    let kd = shifted - shift;
    let r = inv_ln2_32.mul_add(xd, -kd);
    let s = f64::from_bits(TAB[(ki & 31) as usize].wrapping_add(ki << 47));
    let z = f64::from_bits(C0).mul_add(r, f64::from_bits(C1));
    let r2 = r * r;
    let y = f64::from_bits(C2).mul_add(r, 1.0);
    let y = z.mul_add(r2, y);
    (y * s) as f32
}

#[cfg(test)]
mod tests {
    use super::expf;

    /// glibc runs another build of expf on a CPU without FMA; nothing here to compare there.
    fn fma_host() -> bool {
        crate::kernels::cpu::has_features!("fma")
    }

    /// Every 61st f32 bit pattern (70 M inputs: every exponent, both signs, NaNs and
    /// infinities) against the C library, which this host runs with FMA like the reference.
    #[test]
    fn matches_the_c_library() {
        if !fma_host() {
            return;
        }
        let mut bad = 0u32;
        let mut first = None;
        for bits in (0..=u32::MAX).step_by(61) {
            let x = f32::from_bits(bits);
            let (ours, libm) = (expf(x), x.exp());
            if ours.to_bits() != libm.to_bits() && !(ours.is_nan() && libm.is_nan()) {
                bad += 1;
                first.get_or_insert(x);
            }
        }
        assert_eq!(bad, 0, "first mismatch at {first:?}");
    }

    /// The softmax range (scores minus their maximum): every 13th f32 in [-104, 0].
    #[test]
    fn matches_the_c_library_on_every_softmax_input() {
        if !fma_host() {
            return;
        }
        let (lo, hi) = ((-104.0f32).to_bits(), (-0.0f32).to_bits());
        for bits in (hi..=lo).step_by(13) {
            let x = f32::from_bits(bits);
            assert_eq!(expf(x).to_bits(), x.exp().to_bits(), "x = {x:e}");
        }
    }
}
