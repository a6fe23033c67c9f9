//! The summation order of ggml's tiled K-quant MUL_MAT (ggml-cpu `tiled/`), which the reference
//! CPU backend runs instead of `ggml_vec_dot_*_q8_K` for Q2_K…Q6_K and IQ4_XS weights once a
//! MUL_MAT has at least [`TILED_MIN_ROWS`] activation rows in one src1 batch (MUL_MAT_ID: rows
//! routed to one expert).
//!
//! Per (weight row, activation row) and per 256-element slab (one weight super-block and one
//! q8_K block), the tiled kernel forms two exact integers: `s1 = Σ_sub scale · Σ q_w · q_x`
//! (with the format's code bias removed through the activation block sums) and, for formats
//! with mins, `s2 = Σ_sub min · bsum`. Then, in float32 with FMA:
//! `res = d_w · s1` (then `res = res − dmin_w · s2`), and `acc = acc + d_x · res` over the
//! slabs in order, starting from 0. The integers are exact for every format (measured: IQ4_XS,
//! whose biased codes could saturate a `vpmaddubsw` pair, matches only without saturation), so
//! any integer order gives the same bits: the portable and AVX2 builds here differ only there.
//!
//! Each weight super-block is decoded once per block of activation rows ([`Decoded`]) and then
//! meets every row of the block, as in ggml's tiles.

/// The reference takes the tiled path from this many activation rows on.
pub const TILED_MIN_ROWS: usize = 8;

/// q8_K block: f32 d, 256 codes, 16 i16 sums of 16 codes.
pub const Q8K_BYTES: usize = 292;

/// One weight super-block, decoded: signed effective codes (`Σ sc·q·y` is the exact `s1`),
/// scales and mins per 16 elements, and the f16 factors as f32.
pub struct Decoded {
    pub q: [i8; 256],
    pub sc: [i32; 16],
    pub mn: [i32; 16],
    pub d: f32,
    pub dmin: f32,
}

impl Default for Decoded {
    fn default() -> Self {
        Self {
            q: [0; 256],
            sc: [0; 16],
            mn: [0; 16],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

#[inline(always)]
fn q8k_d(y: &[u8]) -> f32 {
    f32::from_le_bytes([y[0], y[1], y[2], y[3]])
}

#[inline(always)]
fn q8k_bsum(y: &[u8], i: usize) -> i32 {
    i16::from_le_bytes([y[260 + 2 * i], y[261 + 2 * i]]) as i32
}

/// `s2 = Σ min · bsum` over the 16 groups of 16.
#[inline(always)]
fn mins_dot(dec: &Decoded, y: &[u8]) -> i32 {
    (0..16).map(|i| dec.mn[i] * q8k_bsum(y, i)).sum()
}

/// `s1` in plain integer arithmetic.
#[inline(always)]
fn codes_dot(dec: &Decoded, y: &[u8]) -> i32 {
    let codes = &y[4..260];
    let groups = dec
        .q
        .chunks_exact(16)
        .zip(codes.chunks_exact(16))
        .zip(dec.sc);
    groups
        .map(|((q, y), sc)| {
            sc * q
                .iter()
                .zip(y)
                .map(|(&a, &b)| a as i32 * b as i8 as i32)
                .sum::<i32>()
        })
        .sum()
}

/// How the AVX2 build feeds a format's codes to `vpmaddubsw` (unsigned × signed bytes).
#[derive(Clone, Copy)]
pub enum Codes {
    /// Codes plus this bias are unsigned and small enough that a byte pair never saturates
    /// (Q2_K, Q4_K, Q5_K: 0; Q3_K: 4; Q6_K: 32); the bias comes back out through the bsums.
    Biased(i8),
    /// Signed codes too large for that (IQ4_XS): |q| against y signed like q.
    Signed,
}

/// A weight super-block in AVX2 registers: the first `vpmaddubsw` operand per 32 codes (and
/// the codes, for `vpsignb`), the scales per 16 codes as i16 pairs, and the 16 i16 weights of
/// the bsums: the mins (formats with mins) or bias · scale (biased codes).
#[cfg(target_arch = "x86_64")]
struct SlabRegs {
    ubytes: [std::arch::x86_64::__m256i; 8],
    sgnq: [std::arch::x86_64::__m256i; 8],
    scales: [std::arch::x86_64::__m256i; 8],
    per_bsum: std::arch::x86_64::__m256i,
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn slab_regs(dec: &Decoded, codes: Codes, has_min: bool) -> SlabRegs {
    use std::arch::x86_64::*;
    let zero = _mm256_setzero_si256();
    let mut r = SlabRegs {
        ubytes: [zero; 8],
        sgnq: [zero; 8],
        scales: [zero; 8],
        per_bsum: zero,
    };
    for c in 0..8 {
        // SAFETY: 32 bytes at 32·c lie inside the 256 codes.
        let q = unsafe { _mm256_loadu_si256(dec.q.as_ptr().add(32 * c) as *const __m256i) };
        match codes {
            Codes::Biased(bias) => r.ubytes[c] = _mm256_add_epi8(q, _mm256_set1_epi8(bias)),
            Codes::Signed => {
                r.ubytes[c] = _mm256_abs_epi8(q);
                r.sgnq[c] = q; // y·sign(q), and 0 where q is 0 (|q| is 0 there too)
            }
        }
        let (lo, hi) = (dec.sc[2 * c] as i16, dec.sc[2 * c + 1] as i16);
        r.scales[c] = _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
    }
    let weights: [i16; 16] = std::array::from_fn(|i| match codes {
        _ if has_min => dec.mn[i] as i16,
        Codes::Biased(bias) => (bias as i32 * dec.sc[i]) as i16, // |bias·scale| <= 32·127
        Codes::Signed => 0,
    });
    // SAFETY: 16 i16 are 32 bytes.
    r.per_bsum = unsafe { _mm256_loadu_si256(weights.as_ptr() as *const __m256i) };
    r
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum_i32(v: std::arch::x86_64::__m256i) -> i32 {
    use std::arch::x86_64::*;
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// (s1, s2) of one q8_K block with AVX2: `vpmaddubsw` per byte pair (never saturating, see
/// [`Codes`]), the per-16 scales by `vpmaddwd`; the bsums against the mins or the bias.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn ints_avx2(r: &SlabRegs, codes: Codes, has_min: bool, y: &[u8]) -> (i32, i32) {
    use std::arch::x86_64::*;
    assert!(y.len() >= Q8K_BYTES);
    let mut acc = _mm256_setzero_si256();
    for c in 0..8 {
        // SAFETY: bytes 4 + 32·c .. 36 + 32·c lie inside the block (checked above).
        let yv = unsafe { _mm256_loadu_si256(y.as_ptr().add(4 + 32 * c) as *const __m256i) };
        let yv = match codes {
            Codes::Biased(_) => yv,
            Codes::Signed => _mm256_sign_epi8(yv, r.sgnq[c]),
        };
        let p = _mm256_maddubs_epi16(r.ubytes[c], yv);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, r.scales[c]));
    }
    // SAFETY: the 16 bsums are bytes 260..292 (checked above).
    let bs = unsafe { _mm256_loadu_si256(y.as_ptr().add(260) as *const __m256i) };
    if has_min {
        (hsum_i32(acc), hsum_i32(_mm256_madd_epi16(bs, r.per_bsum)))
    } else if let Codes::Biased(1..) = codes {
        (
            hsum_i32(_mm256_sub_epi32(acc, _mm256_madd_epi16(bs, r.per_bsum))),
            0,
        )
    } else {
        (hsum_i32(acc), 0)
    }
}

/// One slab's step of the tiled accumulation.
#[inline(always)]
fn step(acc: f32, dx: f32, dec: &Decoded, s1: i32, s2: i32, has_min: bool) -> f32 {
    let mut res = dec.d * s1 as f32;
    if has_min {
        res = (-dec.dmin).mul_add(s2 as f32, res);
    }
    dx.mul_add(res, acc)
}

/// `out[r] = ` weight row `w` · activation row `xs[r]` (q8_K), in the tiled order.
#[inline(always)]
pub fn rows_portable(
    w: &[u8],
    block_bytes: usize,
    has_min: bool,
    xs: &[&[u8]],
    k: usize,
    out: &mut [f32],
    decode: impl Fn(&[u8], &mut Decoded),
) {
    let blocks = w[..k / 256 * block_bytes].chunks_exact(block_bytes);
    walk(
        blocks,
        has_min,
        xs,
        out,
        decode,
        |_| (),
        |_, dec, y| {
            let s2 = if has_min { mins_dot(dec, y) } else { 0 };
            (codes_dot(dec, y), s2)
        },
    )
}

/// The super-block walk of both builds of the tiled order: each weight super-block of
/// `blocks` decoded, `prepare` run once on it, then `ints(prepared, decoded, y)` gives each
/// activation block's integer sums `(s1, s2)`.
#[inline(always)]
fn walk<P>(
    blocks: std::slice::ChunksExact<'_, u8>,
    has_min: bool,
    xs: &[&[u8]],
    out: &mut [f32],
    decode: impl Fn(&[u8], &mut Decoded),
    prepare: impl Fn(&Decoded) -> P,
    ints: impl Fn(&P, &Decoded, &[u8]) -> (i32, i32),
) {
    out.fill(0.0);
    let mut dec = Decoded::default();
    for (b, wb) in blocks.enumerate() {
        decode(wb, &mut dec);
        let prepared = prepare(&dec);
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            let y = &x[b * Q8K_BYTES..(b + 1) * Q8K_BYTES];
            let (s1, s2) = ints(&prepared, &dec, y);
            *o = step(*o, q8k_d(y), &dec, s1, s2, has_min);
        }
    }
}

/// [`rows_portable`] with the integer dots in AVX2 (same bits).
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows_avx2(
    w: &[u8],
    block_bytes: usize,
    has_min: bool,
    codes: Codes,
    xs: &[&[u8]],
    k: usize,
    out: &mut [f32],
    decode: impl Fn(&[u8], &mut Decoded),
) {
    let prepare = |dec: &Decoded| slab_regs(dec, codes, has_min);
    let ints = |regs: &_, _: &Decoded, y: &[u8]| ints_avx2(regs, codes, has_min, y);
    let blocks = w[..k / 256 * block_bytes].chunks_exact(block_bytes);
    walk(blocks, has_min, xs, out, decode, prepare, ints)
}

/// A format as the many-row kernel ([`super::kquant_gemm`]) needs it.
#[derive(Clone, Copy)]
pub struct Shape {
    pub block_bytes: usize,
    pub has_min: bool,
    pub codes: Codes,
}
