//! One weight row · one converted activation row, for every weight type, in the order ggml's
//! x86 AVX2 `ggml_vec_dot_*` functions (arch/x86/quants.c, vec.cpp) compute it.
//!
//! Every AVX2 quantized dot keeps eight i32 lanes per block (or super-block); lane `l` holds the
//! exact integer sum over the block's elements `e` with `(e % 32) / 4 == l` (vpmaddubsw then
//! vpmaddwd over 32-byte registers holding the elements in order). Those lanes become floats
//! and are accumulated with one FMA per block into eight float lanes, summed at the end by
//! `hsum_float_8`. Emulating the lanes and the FMA gives the same bits on any CPU.

use super::act::ActFormat;
use super::fp16_to_f32;
use super::kquant_tiles::{self, Codes, Decoded};

/// A weight type's row dot product against activations in its `vec_dot_type`.
pub trait RowDot {
    /// Elements per weight block.
    const BLOCK: usize;
    /// Bytes per weight block.
    const BLOCK_BYTES: usize;
    /// The activation format ggml's CPU backend converts to.
    const ACT: ActFormat;
    /// `Σ w·x` over `k` elements (`w`, `x` hold exactly one row each).
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32;

    /// [`Self::dot`] with AVX2 intrinsics where a type has them (same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_simd(w: &[u8], x: &[u8], k: usize) -> f32 {
        Self::dot(w, x, k)
    }

    /// The order of ggml's multi-row MUL_MAT path for this type: llamafile's tinyBLAS (f32,
    /// f16, bf16 when N >= 2 and M % 4 == 0; IQ4_NL): one 8-lane FMA accumulator over K (a
    /// zero-padded last step), then `hsum`; ggml's tiled kernel for the K-quants and IQ4_XS
    /// (N >= 8, [`super::kquant_tiles`]). Other types: [`Self::dot`].
    #[inline(always)]
    fn dot_gemm(w: &[u8], x: &[u8], k: usize) -> f32 {
        Self::dot(w, x, k)
    }

    /// [`Self::dot_gemm`] with AVX2 intrinsics where a type has them (same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_gemm_simd(w: &[u8], x: &[u8], k: usize) -> f32 {
        Self::dot_gemm(w, x, k)
    }

    /// `out[r] =` [`Self::dot_gemm`] of `w` and `xs[r]`; types with a multi-row kernel decode
    /// each weight block once for all rows.
    #[inline(always)]
    fn dot_gemm_rows(w: &[u8], xs: &[&[u8]], k: usize, out: &mut [f32]) {
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            *o = Self::dot_gemm(w, x, k);
        }
    }

    /// [`Self::dot_gemm_rows`] with AVX2 intrinsics where a type has them (same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_gemm_rows_simd(w: &[u8], xs: &[&[u8]], k: usize, out: &mut [f32]) {
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            // SAFETY: forwarded from the caller.
            *o = unsafe { Self::dot_gemm_simd(w, x, k) };
        }
    }

    /// [`Self::dot_gemm_rows_simd`] for four weight rows: `out[i · out_stride + r]` for weight
    /// row `ws[i]` and activation row `xs[r]`; types with a four-row kernel share each
    /// activation block among the rows.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_gemm_rows4_simd(
        ws: [&[u8]; 4],
        xs: &[&[u8]],
        k: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        for (i, w) in ws.iter().enumerate() {
            let dst = &mut out[i * out_stride..i * out_stride + xs.len()];
            // SAFETY: forwarded from the caller.
            unsafe { Self::dot_gemm_rows_simd(w, xs, k, dst) };
        }
    }

    /// The many-row path of the K-quant formats ([`super::gemm_kquant::rows`]) over activations
    /// packed by [`super::gemm_kquant::pack`]; `false` (nothing done) for other types.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; for the K-quant formats `act` is packed.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tiled_rows_simd(
        _w: &[u8],
        _stride: usize,
        _first: usize,
        _k: usize,
        _act: &super::matmul::Converted,
        _out: &mut [f32],
    ) -> bool {
        false
    }

    /// [`Self::dot_simd`] for four activation rows at once (each result the same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_simd4(w: &[u8], xs: [&[u8]; 4], k: usize) -> [f32; 4] {
        // SAFETY: forwarded from the caller.
        xs.map(|x| unsafe { Self::dot_simd(w, x, k) })
    }

    /// [`Self::dot_simd`] for two activation rows at once (each result the same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_simd2(w: &[u8], xs: [&[u8]; 2], k: usize) -> [f32; 2] {
        // SAFETY: forwarded from the caller.
        xs.map(|x| unsafe { Self::dot_simd(w, x, k) })
    }
}

/// Overrides `dot_simd4` with a multi-row function of [`super::dot_avx2`].
macro_rules! simd_dot4 {
    ($f:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn dot_simd4(w: &[u8], xs: [&[u8]; 4], k: usize) -> [f32; 4] {
            // SAFETY: the caller guarantees AVX2, FMA and F16C.
            unsafe { super::dot_avx2::$f(w, xs, k) }
        }
    };
}

/// Overrides `dot_simd` with a function of [`super::dot_avx2`].
macro_rules! simd_dot {
    ($f:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn dot_simd(w: &[u8], x: &[u8], k: usize) -> f32 {
            // SAFETY: the caller guarantees AVX2, FMA and F16C.
            unsafe { super::dot_avx2::$f(w, x, k) }
        }
    };
}

/// Overrides `dot_gemm` and `dot_gemm_rows` with the tiled K-quant order
/// ([`super::kquant_tiles`]); `$decode` fills one super-block's [`Decoded`].
macro_rules! tiled_dot {
    ($bytes:expr, $has_min:expr, $codes:expr, $decode:expr) => {
        #[inline(always)]
        fn dot_gemm(w: &[u8], x: &[u8], k: usize) -> f32 {
            let mut out = [0.0f32];
            Self::dot_gemm_rows(w, &[x], k, &mut out);
            out[0]
        }
        #[inline(always)]
        fn dot_gemm_rows(w: &[u8], xs: &[&[u8]], k: usize, out: &mut [f32]) {
            kquant_tiles::rows_portable(w, $bytes, $has_min, xs, k, out, $decode)
        }
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn dot_gemm_rows_simd(w: &[u8], xs: &[&[u8]], k: usize, out: &mut [f32]) {
            // SAFETY: the caller guarantees AVX2, FMA and F16C.
            unsafe { kquant_tiles::rows_avx2(w, $bytes, $has_min, $codes, xs, k, out, $decode) }
        }
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn tiled_rows_simd(
            w: &[u8],
            stride: usize,
            first: usize,
            k: usize,
            act: &super::matmul::Converted,
            out: &mut [f32],
        ) -> bool {
            let shape = kquant_tiles::Shape {
                block_bytes: $bytes,
                has_min: $has_min,
                codes: $codes,
            };
            // SAFETY: the caller guarantees AVX2, FMA and F16C and the packed activations.
            unsafe { super::gemm_kquant::rows(w, stride, first, k, act, out, shape, $decode) };
            true
        }
    };
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    fp16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline(always)]
fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `hsum_float_8`: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
#[inline(always)]
pub fn hsum8(a: &[f32; 8]) -> f32 {
    let q = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (q[0] + q[2]) + (q[1] + q[3])
}

/// `GGML_F32x8_REDUCE` of one register: t = lo + hi, then (t0+t1) + (t2+t3) (two vhaddps).
#[inline(always)]
fn hadd_reduce8(a: &[f32; 8]) -> f32 {
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// acc[l] = fma(d, lanes[l], acc[l]) (`_mm256_fmadd_ps`).
#[inline(always)]
fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: &[i32; 8]) {
    for (a, &s) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(s as f32, *a);
    }
}

/// Eight AVX2 lanes of Σ w·y over a 32-element chunk (`w` already signed integers).
#[inline(always)]
fn chunk_lanes(w: &[i8; 32], y: &[u8]) -> [i32; 8] {
    let mut s = [0i32; 8];
    for (l, sl) in s.iter_mut().enumerate() {
        for t in 0..4 {
            *sl += w[4 * l + t] as i32 * y[4 * l + t] as i8 as i32;
        }
    }
    s
}

/// Lanes of Σ sc(e)·w(e)·y(e) over a 256-element super-block, `sc` one scale per 16 elements.
#[inline(always)]
fn superblock_lanes(w: &[i8; 256], sc: &[i32; 16], y: &[u8]) -> [i32; 8] {
    let mut s = [0i32; 8];
    for c in 0..8 {
        let wc: &[i8; 32] = w[32 * c..32 * c + 32].try_into().expect("32");
        let part = chunk_lanes(wc, &y[32 * c..32 * c + 32]);
        for l in 0..8 {
            s[l] += part[l] * sc[2 * c + l / 4];
        }
    }
    s
}

/// 32 elements of a 16-byte nibble array: low nibbles first, then high nibbles.
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; 32] {
    std::array::from_fn(|i| if i < 16 { qs[i] & 15 } else { qs[i - 16] >> 4 })
}

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

/// Q8_0/Q4_0/Q5_0 family: one FMA per block of `d_w · d_x` times the lanes.
macro_rules! simple_q8_0 {
    ($name:ident, $bytes:expr, $decode:expr) => {
        simple_q8_0!($name, $bytes, $decode, );
    };
    ($name:ident, $bytes:expr, $decode:expr, $($simd:ident)? $(; $simd4:ident)?) => {
        pub struct $name;
        impl RowDot for $name {
            const BLOCK: usize = 32;
            const BLOCK_BYTES: usize = $bytes;
            const ACT: ActFormat = ActFormat::Q8_0;
            #[inline(always)]
            fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
                let mut acc = [0.0f32; 8];
                for (wb, yb) in w.chunks_exact($bytes).zip(x.chunks_exact(34)).take(k / 32) {
                    let d = f16_at(wb, 0) * f16_at(yb, 0);
                    let q: [i8; 32] = $decode(wb);
                    fma_lanes(&mut acc, d, &chunk_lanes(&q, &yb[2..]));
                }
                hsum8(&acc)
            }
            $(simd_dot!($simd);)?
            $(simd_dot4!($simd4);)?
        }
    };
}

simple_q8_0!(
    Q8_0,
    34,
    |b: &[u8]| -> [i8; 32] { std::array::from_fn(|i| b[2 + i] as i8) },
    q8_0; q8_0_x4
);
simple_q8_0!(
    Q4_0,
    18,
    |b: &[u8]| -> [i8; 32] { nibbles(&b[2..18]).map(|v| v as i8 - 8) },
    q4_0
);
simple_q8_0!(
    Q5_0,
    22,
    |b: &[u8]| -> [i8; 32] {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let n = nibbles(&b[6..22]);
        std::array::from_fn(|i| (n[i] | (((qh >> i) & 1) << 4) as u8) as i8 - 16)
    },
    q5_0
);

/// Q4_1/Q5_1 × q8_1: lanes of unsigned codes, plus `Σ m · s` accumulated with a scalar FMA.
macro_rules! min_q8_1 {
    ($name:ident, $bytes:expr, $decode:expr, $scale:expr, $simd:ident) => {
        pub struct $name;
        impl RowDot for $name {
            const BLOCK: usize = 32;
            const BLOCK_BYTES: usize = $bytes;
            const ACT: ActFormat = ActFormat::Q8_1;
            #[inline(always)]
            fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
                let mut acc = [0.0f32; 8];
                let mut summs = 0.0f32;
                for (wb, yb) in w.chunks_exact($bytes).zip(x.chunks_exact(36)).take(k / 32) {
                    summs = f16_at(wb, 2).mul_add(f16_at(yb, 2), summs);
                    let q: [i8; 32] = $decode(wb);
                    fma_lanes(
                        &mut acc,
                        $scale(f16_at(wb, 0), f16_at(yb, 0)),
                        &chunk_lanes(&q, &yb[4..]),
                    );
                }
                hsum8(&acc) + summs
            }
            simd_dot!($simd);
        }
    };
}

min_q8_1!(
    Q4_1,
    20,
    |b: &[u8]| -> [i8; 32] { nibbles(&b[4..20]).map(|v| v as i8) },
    |dx: f32, dy: f32| dx * dy,
    q4_1
);
min_q8_1!(
    Q5_1,
    24,
    |b: &[u8]| -> [i8; 32] {
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let n = nibbles(&b[8..24]);
        std::array::from_fn(|i| (n[i] | (((qh >> i) & 1) << 4) as u8) as i8)
    },
    |dx: f32, dy: f32| dx * dy,
    q5_1
);

/// IQ4_NL / MXFP4 × q8_0: two float accumulators (even and odd blocks), an odd last block
/// added separately as `d · sumi` (multiply, then add).
macro_rules! table_q8_0 {
    ($name:ident, $bytes:expr, $table:expr, $d:expr, $qs:expr, $simd:ident $(; $gemm_simd:ident)?) => {
        pub struct $name;
        impl RowDot for $name {
            const BLOCK: usize = 32;
            const BLOCK_BYTES: usize = $bytes;
            const ACT: ActFormat = ActFormat::Q8_0;
            #[inline(always)]
            fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
                let nb = k / 32;
                let mut acc = [[0.0f32; 8]; 2];
                let block = |ib: usize| -> (f32, [i32; 8]) {
                    let wb = &w[ib * $bytes..(ib + 1) * $bytes];
                    let yb = &x[ib * 34..(ib + 1) * 34];
                    let q = nibbles(&wb[$qs..$qs + 16]).map(|v| $table[v as usize]);
                    (f16_at(yb, 0) * $d(wb), chunk_lanes(&q, &yb[2..]))
                };
                let mut ib = 0;
                while ib + 1 < nb {
                    for (h, a) in acc.iter_mut().enumerate() {
                        let (d, lanes) = block(ib + h);
                        fma_lanes(a, d, &lanes);
                    }
                    ib += 2;
                }
                let both: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
                let mut sumf = hsum8(&both);
                if ib < nb {
                    let (d, lanes) = block(ib);
                    sumf += d * lanes.iter().sum::<i32>() as f32;
                }
                sumf
            }
            simd_dot!($simd);
            $(
            /// llamafile's tinyBLAS Q0 kernel (ggml's MUL_MAT at N >= 2): one accumulator.
            #[inline(always)]
            fn dot_gemm(w: &[u8], x: &[u8], k: usize) -> f32 {
                let mut acc = [0.0f32; 8];
                for (wb, yb) in w.chunks_exact($bytes).zip(x.chunks_exact(34)).take(k / 32) {
                    let q = nibbles(&wb[$qs..$qs + 16]).map(|v| $table[v as usize]);
                    fma_lanes(&mut acc, f16_at(yb, 0) * $d(wb), &chunk_lanes(&q, &yb[2..]));
                }
                hsum8(&acc)
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn dot_gemm_simd(w: &[u8], x: &[u8], k: usize) -> f32 {
                // SAFETY: the caller guarantees AVX2, FMA and F16C.
                unsafe { super::dot_avx2::$gemm_simd(w, x, k) }
            }
            )?
        }
    };
}

table_q8_0!(IQ4NL, 18, KVALUES_IQ4NL, |b: &[u8]| f16_at(b, 0), 2, iq4_nl; iq4_nl_gemm);
table_q8_0!(
    MXFP4,
    17,
    KVALUES_MXFP4,
    |b: &[u8]| e8m0_half(b[0]),
    1,
    mxfp4
);

/// q8_K activation block: (d, codes, bsums).
#[inline(always)]
fn q8k(y: &[u8]) -> (f32, &[u8], [i32; 16]) {
    let bsums =
        std::array::from_fn(|j| i16::from_le_bytes([y[260 + 2 * j], y[261 + 2 * j]]) as i32);
    (f32_at(y, 0), &y[4..260], bsums)
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

/// Per-32 scales repeated per 16 elements.
#[inline(always)]
fn per16(sc: &[i32; 8]) -> [i32; 16] {
    std::array::from_fn(|i| sc[i / 2])
}

/// Sums of 32 codes (vphaddw of the 16 bsums).
#[inline(always)]
fn bsums32(b: &[i32; 16]) -> [i32; 8] {
    std::array::from_fn(|j| b[2 * j] + b[2 * j + 1])
}

/// Q4_K/Q5_K nibbles of one super-block: chunk j/2 low nibbles, then high nibbles.
#[inline(always)]
fn k4_nibbles(qs: &[u8], w: &mut [i8; 256]) {
    for j in 0..4 {
        for i in 0..32 {
            let b = qs[32 * j + i];
            w[64 * j + i] = (b & 15) as i8;
            w[64 * j + 32 + i] = (b >> 4) as i8;
        }
    }
}

pub struct Q2K;
impl RowDot for Q2K {
    const BLOCK: usize = 256;
    const BLOCK_BYTES: usize = 84;
    const ACT: ActFormat = ActFormat::Q8K;
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let mut acc = [0.0f32; 8];
        for (wb, yb) in w.chunks_exact(84).zip(x.chunks_exact(292)).take(k / 256) {
            let (yd, q8, bs) = q8k(yb);
            let d = yd * f16_at(wb, 80);
            let dmin = -yd * f16_at(wb, 82);
            let scales = &wb[..16];
            let prod: [i32; 8] = std::array::from_fn(|l| {
                (scales[2 * l] >> 4) as i32 * bs[2 * l]
                    + (scales[2 * l + 1] >> 4) as i32 * bs[2 * l + 1]
            });
            fma_lanes(&mut acc, dmin, &prod);
            let sc: [i32; 16] = std::array::from_fn(|i| (scales[i] & 15) as i32);
            let mut q = [0i8; 256];
            q2k_codes(wb, &mut q);
            fma_lanes(&mut acc, d, &superblock_lanes(&q, &sc, q8));
        }
        hsum8(&acc)
    }
    simd_dot!(q2_k);
    tiled_dot!(84, true, Codes::Biased(0), |wb: &[u8], t: &mut Decoded| {
        let scales = &wb[..16];
        t.sc = std::array::from_fn(|i| (scales[i] & 15) as i32);
        t.mn = std::array::from_fn(|i| (scales[i] >> 4) as i32);
        q2k_codes(wb, &mut t.q);
        (t.d, t.dmin) = (f16_at(wb, 80), f16_at(wb, 82));
    });
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

pub struct Q3K;
impl RowDot for Q3K {
    const BLOCK: usize = 256;
    const BLOCK_BYTES: usize = 110;
    const ACT: ActFormat = ActFormat::Q8K;
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let mut acc = [0.0f32; 8];
        for (wb, yb) in w.chunks_exact(110).zip(x.chunks_exact(292)).take(k / 256) {
            let (yd, q8, _) = q8k(yb);
            let d = yd * f16_at(wb, 108);
            let hmask = &wb[..32];
            let qs = &wb[32..96];
            let sc = q3k_scales(&wb[96..108]);
            let mut q = [0i8; 256];
            for j in 0..2 {
                for s in 0..4 {
                    let bit = 4 * j + s;
                    for i in 0..32 {
                        let low = ((qs[32 * j + i] >> (2 * s)) & 3) as i8;
                        let high = if hmask[i] >> bit & 1 == 1 { 0 } else { 4 };
                        q[128 * j + 32 * s + i] = low - high;
                    }
                }
            }
            fma_lanes(&mut acc, d, &superblock_lanes(&q, &sc, q8));
        }
        hsum8(&acc)
    }
    simd_dot!(q3_k);
    tiled_dot!(
        110,
        false,
        Codes::Biased(4),
        |wb: &[u8], t: &mut Decoded| {
            let (hmask, qs) = (&wb[..32], &wb[32..96]);
            for j in 0..2 {
                for s in 0..4 {
                    for i in 0..32 {
                        let low = ((qs[32 * j + i] >> (2 * s)) & 3) as i8;
                        let high = (((hmask[i] >> (4 * j + s)) & 1) ^ 1) as i8;
                        t.q[128 * j + 32 * s + i] = low - 4 * high;
                    }
                }
            }
            t.sc = q3k_scales(&wb[96..108]);
            t.d = f16_at(wb, 108);
        }
    );
}

/// (m0+m2) + (m1+m3) of the 4-lane min accumulator.
#[inline(always)]
fn hsum4(a: &[f32; 4]) -> f32 {
    (a[0] + a[2]) + (a[1] + a[3])
}

pub struct Q4K;
impl RowDot for Q4K {
    const BLOCK: usize = 256;
    const BLOCK_BYTES: usize = 144;
    const ACT: ActFormat = ActFormat::Q8K;
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let mut acc = [0.0f32; 8];
        let mut acc_m = [0.0f32; 4];
        let mut q = [0i8; 256];
        for (wb, yb) in w.chunks_exact(144).zip(x.chunks_exact(292)).take(k / 256) {
            let (yd, q8, bs) = q8k(yb);
            let d = yd * f16_at(wb, 0);
            let dmin = -yd * f16_at(wb, 2);
            let (sc, mn) = scale_min_k4(&wb[4..16]);
            let s32 = bsums32(&bs);
            for (t, m) in acc_m.iter_mut().enumerate() {
                let prod = mn[2 * t] * s32[2 * t] + mn[2 * t + 1] * s32[2 * t + 1];
                *m = dmin.mul_add(prod as f32, *m);
            }
            k4_nibbles(&wb[16..144], &mut q);
            fma_lanes(&mut acc, d, &superblock_lanes(&q, &per16(&sc), q8));
        }
        hsum8(&acc) + hsum4(&acc_m)
    }
    simd_dot!(q4_k);
    simd_dot4!(q4_k_x4);
    tiled_dot!(144, true, Codes::Biased(0), |wb: &[u8], t: &mut Decoded| {
        let (sc, mn) = scale_min_k4(&wb[4..16]);
        (t.sc, t.mn) = (per16(&sc), per16(&mn));
        k4_nibbles(&wb[16..144], &mut t.q);
        (t.d, t.dmin) = (f16_at(wb, 0), f16_at(wb, 2));
    });
}

pub struct Q5K;
impl RowDot for Q5K {
    const BLOCK: usize = 256;
    const BLOCK_BYTES: usize = 176;
    const ACT: ActFormat = ActFormat::Q8K;
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let mut acc = [0.0f32; 8];
        let mut summs = 0.0f32;
        let mut q = [0i8; 256];
        for (wb, yb) in w.chunks_exact(176).zip(x.chunks_exact(292)).take(k / 256) {
            let (yd, q8, bs) = q8k(yb);
            let d = yd * f16_at(wb, 0);
            let dmin = -yd * f16_at(wb, 2);
            let (sc, mn) = scale_min_k4(&wb[4..16]);
            let s32 = bsums32(&bs);
            let mins: i32 = (0..8).map(|j| mn[j] * s32[j]).sum();
            summs = dmin.mul_add(mins as f32, summs);
            q5k_codes(wb, &mut q);
            fma_lanes(&mut acc, d, &superblock_lanes(&q, &per16(&sc), q8));
        }
        hsum8(&acc) + summs
    }
    simd_dot!(q5_k);
    tiled_dot!(176, true, Codes::Biased(0), |wb: &[u8], t: &mut Decoded| {
        let (sc, mn) = scale_min_k4(&wb[4..16]);
        (t.sc, t.mn) = (per16(&sc), per16(&mn));
        q5k_codes(wb, &mut t.q);
        (t.d, t.dmin) = (f16_at(wb, 0), f16_at(wb, 2));
    });
}

pub struct Q6K;
impl RowDot for Q6K {
    const BLOCK: usize = 256;
    const BLOCK_BYTES: usize = 210;
    const ACT: ActFormat = ActFormat::Q8K;
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let mut acc = [0.0f32; 8];
        let mut q = [0i8; 256];
        for (wb, yb) in w.chunks_exact(210).zip(x.chunks_exact(292)).take(k / 256) {
            let (yd, q8, bs) = q8k(yb);
            let d = yd * f16_at(wb, 208);
            let sc: [i32; 16] = std::array::from_fn(|i| wb[192 + i] as i8 as i32);
            q6k_codes(wb, &mut q);
            let mut lanes = superblock_lanes(&q, &sc, q8);
            for (l, v) in lanes.iter_mut().enumerate() {
                *v -= 32 * (bs[2 * l] * sc[2 * l] + bs[2 * l + 1] * sc[2 * l + 1]);
            }
            fma_lanes(&mut acc, d, &lanes);
        }
        hsum8(&acc)
    }
    simd_dot!(q6_k);
    simd_dot4!(q6_k_x4);
    tiled_dot!(
        210,
        false,
        Codes::Biased(32),
        |wb: &[u8], t: &mut Decoded| {
            // the 6-bit codes minus their bias 32 (ggml removes it through the bsums: same s1)
            q6k_codes(wb, &mut t.q);
            t.q.iter_mut().for_each(|v| *v -= 32);
            t.sc = std::array::from_fn(|i| wb[192 + i] as i8 as i32);
            t.d = f16_at(wb, 208);
        }
    );
}

pub struct IQ4XS;
impl RowDot for IQ4XS {
    const BLOCK: usize = 256;
    const BLOCK_BYTES: usize = 136;
    const ACT: ActFormat = ActFormat::Q8K;
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let mut acc = [0.0f32; 8];
        let mut q = [0i8; 256];
        for (wb, yb) in w.chunks_exact(136).zip(x.chunks_exact(292)).take(k / 256) {
            let (yd, q8, _) = q8k(yb);
            let sh = u16::from_le_bytes([wb[2], wb[3]]) as i32;
            let sc8: [i32; 8] = std::array::from_fn(|ib| {
                let low = ((wb[4 + ib / 2] >> (4 * (ib % 2))) & 15) as i32;
                (low | (((sh >> (2 * ib)) & 3) << 4)) - 32
            });
            for ib in 0..8 {
                let n = nibbles(&wb[8 + 16 * ib..24 + 16 * ib]);
                for i in 0..32 {
                    q[32 * ib + i] = KVALUES_IQ4NL[n[i] as usize];
                }
            }
            let lanes = superblock_lanes(&q, &per16(&sc8), q8);
            fma_lanes(&mut acc, f16_at(wb, 0) * yd, &lanes);
        }
        hsum8(&acc)
    }
    simd_dot!(iq4_xs);
    tiled_dot!(136, false, Codes::Signed, |wb: &[u8], t: &mut Decoded| {
        let sh = u16::from_le_bytes([wb[2], wb[3]]) as i32;
        let sc8: [i32; 8] = std::array::from_fn(|ib| {
            let low = ((wb[4 + ib / 2] >> (4 * (ib % 2))) & 15) as i32;
            (low | (((sh >> (2 * ib)) & 3) << 4)) - 32
        });
        t.sc = per16(&sc8);
        for ib in 0..8 {
            let qs = &wb[8 + 16 * ib..24 + 16 * ib];
            for i in 0..16 {
                t.q[32 * ib + i] = KVALUES_IQ4NL[(qs[i] & 15) as usize];
                t.q[32 * ib + 16 + i] = KVALUES_IQ4NL[(qs[i] >> 4) as usize];
            }
        }
        t.d = f16_at(wb, 0);
    });
}

/// Q2_K's 2-bit codes (0..3) of one super-block, in element order.
#[inline(always)]
fn q2k_codes(wb: &[u8], q: &mut [i8; 256]) {
    let qs = &wb[16..80];
    for j in 0..2 {
        for s in 0..4 {
            for i in 0..32 {
                q[128 * j + 32 * s + i] = ((qs[32 * j + i] >> (2 * s)) & 3) as i8;
            }
        }
    }
}

/// Q5_K's 5-bit codes (0..31) of one super-block: the 4-bit nibbles plus the high bits.
#[inline(always)]
fn q5k_codes(wb: &[u8], q: &mut [i8; 256]) {
    k4_nibbles(&wb[48..176], q);
    for c in 0..8 {
        for i in 0..32 {
            q[32 * c + i] += (((wb[16 + i] >> c) & 1) << 4) as i8;
        }
    }
}

/// Q6_K's 6-bit codes (0..63, bias not removed) of one super-block, in element order.
#[inline(always)]
fn q6k_codes(wb: &[u8], q: &mut [i8; 256]) {
    let (ql, qh) = (&wb[..128], &wb[128..192]);
    for j in 0..2 {
        for i in 0..32 {
            let h = qh[32 * j + i];
            let (l0, l1) = (ql[64 * j + i], ql[64 * j + 32 + i]);
            q[128 * j + i] = ((l0 & 15) | ((h & 3) << 4)) as i8;
            q[128 * j + 32 + i] = ((l1 & 15) | (((h >> 2) & 3) << 4)) as i8;
            q[128 * j + 64 + i] = ((l0 >> 4) | (((h >> 4) & 3) << 4)) as i8;
            q[128 * j + 96 + i] = ((l1 >> 4) | (((h >> 6) & 3) << 4)) as i8;
        }
    }
}

/// Four 8-lane FMA accumulators over 32-element steps (`GGML_F16_STEP` / `GGML_F32_STEP`).
#[inline(always)]
fn four_acc(k: usize, get: impl Fn(usize) -> (f32, f32)) -> [[f32; 8]; 4] {
    let mut sum = [[0.0f32; 8]; 4];
    for i in (0..k & !31).step_by(32) {
        for (j, s) in sum.iter_mut().enumerate() {
            for (l, v) in s.iter_mut().enumerate() {
                let (a, b) = get(i + 8 * j + l);
                *v = a.mul_add(b, *v);
            }
        }
    }
    sum
}

/// tinyBLAS's per-output accumulation (see [`RowDot::dot_gemm`]).
#[inline(always)]
fn tinyblas_order(k: usize, get: impl Fn(usize) -> (f32, f32)) -> f32 {
    let mut acc = [0.0f32; 8];
    for l in (0..k.div_ceil(8) * 8).step_by(8) {
        for (j, a) in acc.iter_mut().enumerate() {
            let (x, y) = if l + j < k { get(l + j) } else { (0.0, 0.0) };
            *a = x.mul_add(y, *a);
        }
    }
    hsum8(&acc)
}

/// `GGML_F32x8_REDUCE` of four registers: (0+2), (1+3), then together, then two vhaddps.
#[inline(always)]
fn reduce4(s: &[[f32; 8]; 4]) -> f32 {
    let r: [f32; 8] = std::array::from_fn(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]));
    hadd_reduce8(&r)
}

pub struct F16;
impl RowDot for F16 {
    const BLOCK: usize = 1;
    const BLOCK_BYTES: usize = 2;
    const ACT: ActFormat = ActFormat::F16;
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let get = |i: usize| (f16_at(w, 2 * i), f16_at(x, 2 * i));
        let mut sumf = reduce4(&four_acc(k, get)) as f64;
        for i in k & !31..k {
            let (a, b) = get(i);
            sumf += (a * b) as f64;
        }
        sumf as f32
    }
    simd_dot!(f16);
    simd_dot4!(f16x4);
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dot_simd2(w: &[u8], xs: [&[u8]; 2], k: usize) -> [f32; 2] {
        // SAFETY: the caller guarantees AVX2, FMA and F16C.
        unsafe { super::dot_avx2::f16x2(w, xs, k) }
    }
    #[inline(always)]
    fn dot_gemm(w: &[u8], x: &[u8], k: usize) -> f32 {
        tinyblas_order(k, |i| (f16_at(w, 2 * i), f16_at(x, 2 * i)))
    }
}

#[inline(always)]
fn bf16_at(b: &[u8], i: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
}

pub struct BF16;
impl RowDot for BF16 {
    const BLOCK: usize = 1;
    const BLOCK_BYTES: usize = 2;
    const ACT: ActFormat = ActFormat::BF16;
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let c = four_acc(k, |i| (bf16_at(w, i), bf16_at(x, i)));
        // (c1 + c3) + (c2 + c4), then hsum_float_8
        let r: [f32; 8] = std::array::from_fn(|l| (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]));
        let mut sumf = hsum8(&r) as f64;
        for i in k & !31..k {
            sumf += (bf16_at(w, i) * bf16_at(x, i)) as f64;
        }
        sumf as f32
    }
    simd_dot!(bf16);
    #[inline(always)]
    fn dot_gemm(w: &[u8], x: &[u8], k: usize) -> f32 {
        tinyblas_order(k, |i| (bf16_at(w, i), bf16_at(x, i)))
    }
}

pub struct F32;
impl RowDot for F32 {
    const BLOCK: usize = 1;
    const BLOCK_BYTES: usize = 4;
    const ACT: ActFormat = ActFormat::F32;
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let get = |i: usize| (f32_at(w, 4 * i), f32_at(x, 4 * i));
        let mut sumf = reduce4(&four_acc(k, get));
        // The reference build's leftover loop (GCC, vectorized): groups of 8, then one of 4,
        // as a rounded product then an add; the last 0-3 elements fused.
        let start = k & !31;
        let left = k - start;
        let unfused = if left >= 8 { left & !7 } else { 0 };
        let unfused = unfused + if left - unfused >= 4 { 4 } else { 0 };
        for i in start..k {
            let (a, b) = get(i);
            sumf = if i < start + unfused {
                sumf + a * b
            } else {
                a.mul_add(b, sumf)
            };
        }
        sumf
    }
    simd_dot!(f32);
    #[inline(always)]
    fn dot_gemm(w: &[u8], x: &[u8], k: usize) -> f32 {
        tinyblas_order(k, |i| (f32_at(w, 4 * i), f32_at(x, 4 * i)))
    }
}
