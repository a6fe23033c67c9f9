//! Constants and small decoders of ggml's block formats that every build of the dot products
//! shares: the 4-bit codebooks, the E8M0 scale, and the packed K-quant scales.

pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `GGML_E8M0_TO_FP32_HALF`.
#[inline(always)]
pub fn e8m0_half(x: u8) -> f32 {
    let bits = if x < 2 {
        0x0020_0000u32 << x
    } else {
        ((x as u32) - 1) << 23
    };
    f32::from_bits(bits)
}

/// The 6-bit (scale, min) pairs of Q4_K / Q5_K (`get_scale_min_k4`).
#[inline(always)]
pub fn scale_min_k4(q: &[u8]) -> ([i32; 8], [i32; 8]) {
    let mut sc = [0i32; 8];
    let mut mn = [0i32; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = (q[j] & 63) as i32;
            mn[j] = (q[j + 4] & 63) as i32;
        } else {
            sc[j] = ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)) as i32;
            mn[j] = ((q[j + 4] >> 4) | ((q[j] >> 6) << 4)) as i32;
        }
    }
    (sc, mn)
}

/// The 16 six-bit scales of a Q3_K block, minus 32.
#[inline(always)]
pub fn q3k_scales(raw: &[u8]) -> [i32; 16] {
    const KM1: u32 = 0x0303_0303;
    const KM2: u32 = 0x0f0f_0f0f;
    let a: [u32; 3] =
        std::array::from_fn(|i| u32::from_le_bytes(raw[4 * i..4 * i + 4].try_into().expect("4")));
    let words = [
        (a[0] & KM2) | ((a[2] & KM1) << 4),
        (a[1] & KM2) | (((a[2] >> 2) & KM1) << 4),
        ((a[0] >> 4) & KM2) | (((a[2] >> 4) & KM1) << 4),
        ((a[1] >> 4) & KM2) | (((a[2] >> 6) & KM1) << 4),
    ];
    std::array::from_fn(|i| (words[i / 4] >> (8 * (i % 4))) as u8 as i32 - 32)
}
