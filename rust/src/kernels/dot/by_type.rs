//! One weight row · one converted activation row, for every weight type, in the order ggml's
//! x86 AVX2 `ggml_vec_dot_*` functions (arch/x86/quants.c, vec.cpp) compute it.
//!
//! Every AVX2 quantized dot keeps eight i32 lanes per block (or super-block); lane `l` holds the
//! exact integer sum over the block's elements `e` with `(e % 32) / 4 == l` (vpmaddubsw then
//! vpmaddwd over 32-byte registers holding the elements in order). Those lanes become floats
//! and are accumulated with one FMA per block into eight float lanes, summed at the end by
//! `hsum_float_8`. Emulating the lanes and the FMA gives the same bits on any CPU.

use super::kquant_tiles::{self, Codes, Decoded};
use super::lanes::*;
use crate::kernels::blocks::tables::{
    e8m0_half, q3k_scales, scale_min_k4, KVALUES_IQ4NL, KVALUES_MXFP4,
};

/// A weight type `$name` and its [`RowDot`] impl: `$block` values of `$bytes` bytes per
/// block against `$act` activations, then the impl's functions.
macro_rules! row_dot {
    ($(#[$doc:meta])* $name:ident, $block:expr, $bytes:expr, $act:ident, { $($items:tt)* }) => {
        $(#[$doc])*
        pub struct $name;
        impl $crate::kernels::dot::row_dot::RowDot for $name {
            const BLOCK: usize = $block;
            const BLOCK_BYTES: usize = $bytes;
            const ACT: $crate::kernels::formats::ActFormat = $crate::kernels::formats::ActFormat::$act;
            $($items)*
        }
    };
}
pub(crate) use row_dot;

/// The (weight block, activation block) pairs of one row of `k` values, `block` values each.
#[inline(always)]
fn block_pairs<'a>(
    w: &'a [u8],
    x: &'a [u8],
    k: usize,
    block: usize,
    (w_bytes, x_bytes): (usize, usize),
) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
    w.chunks_exact(w_bytes)
        .zip(x.chunks_exact(x_bytes))
        .take(k / block)
}

/// The portable dot of a K-quant row (`w_bytes`-byte super-blocks against q8_K blocks): eight
/// float lanes, `block(acc, wb, q8k(yb))` adding each super-block's FMAs, then `hsum_float_8`.
#[inline(always)]
fn superblock_dot(
    w: &[u8],
    x: &[u8],
    k: usize,
    w_bytes: usize,
    mut block: impl FnMut(&mut [f32; 8], &[u8], (f32, &[u8], [i32; 16])),
) -> f32 {
    let mut acc = [0.0f32; 8];
    for (wb, yb) in block_pairs(w, x, k, 256, (w_bytes, 292)) {
        block(&mut acc, wb, q8k(yb));
    }
    hsum8(&acc)
}

/// Overrides `dot_simd4` with a multi-row function of [`super::avx2`].
macro_rules! simd_dot4 {
    ($f:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn dot_simd4(w: &[u8], xs: [&[u8]; 4], k: usize) -> [f32; 4] {
            // SAFETY: the caller guarantees AVX2, FMA and F16C.
            unsafe { crate::kernels::dot::avx2::$f(w, xs, k) }
        }
    };
}

/// Overrides `dot_simd` with a function of [`super::avx2`].
macro_rules! simd_dot {
    ($f:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn dot_simd(w: &[u8], x: &[u8], k: usize) -> f32 {
            // SAFETY: the caller guarantees AVX2, FMA and F16C.
            unsafe { crate::kernels::dot::avx2::$f(w, x, k) }
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
        unsafe fn tiled_rows_simd(job: crate::kernels::operand::RowsJob<'_>) -> bool {
            let shape = kquant_tiles::Shape {
                block_bytes: $bytes,
                has_min: $has_min,
                codes: $codes,
            };
            // SAFETY: the caller guarantees AVX2, FMA and F16C and the packed activations.
            unsafe { crate::kernels::dot::kquant_gemm::rows(job, shape, $decode) };
            true
        }
    };
}

/// Q8_0/Q4_0/Q5_0 family: one FMA per block of `d_w · d_x` times the lanes.
macro_rules! simple_q8_0 {
    ($name:ident, $bytes:expr, $decode:expr) => {
        simple_q8_0!($name, $bytes, $decode, );
    };
    ($name:ident, $bytes:expr, $decode:expr, $($simd:ident)? $(; $simd4:ident)?) => {
        row_dot!($name, 32, $bytes, Q8_0, {
            #[inline(always)]
            fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
                let mut acc = [0.0f32; 8];
                for (wb, yb) in block_pairs(w, x, k, 32, ($bytes, 34)) {
                    let d = f16_at(wb, 0) * f16_at(yb, 0);
                    let q: [i8; 32] = $decode(wb);
                    fma_lanes(&mut acc, d, &chunk_lanes(&q, &yb[2..]));
                }
                hsum8(&acc)
            }
            $(simd_dot!($simd);)?
            $(simd_dot4!($simd4);)?
        });
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
    |b: &[u8]| -> [i8; 32] { q5_codes(&b[2..22]).map(|v| v as i8 - 16) },
    q5_0
);

/// Q4_1/Q5_1 × q8_1: lanes of unsigned codes, plus `Σ m · s` accumulated with a scalar FMA.
macro_rules! min_q8_1 {
    ($name:ident, $bytes:expr, $decode:expr, $simd:ident) => {
        row_dot!($name, 32, $bytes, Q8_1, {
            #[inline(always)]
            fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
                let mut acc = [0.0f32; 8];
                let mut summs = 0.0f32;
                for (wb, yb) in block_pairs(w, x, k, 32, ($bytes, 36)) {
                    summs = f16_at(wb, 2).mul_add(f16_at(yb, 2), summs);
                    let q: [i8; 32] = $decode(wb);
                    let d = f16_at(wb, 0) * f16_at(yb, 0);
                    fma_lanes(&mut acc, d, &chunk_lanes(&q, &yb[4..]));
                }
                hsum8(&acc) + summs
            }
            simd_dot!($simd);
        });
    };
}

min_q8_1!(
    Q4_1,
    20,
    |b: &[u8]| nibbles(&b[4..20]).map(|v| v as i8),
    q4_1
);
min_q8_1!(
    Q5_1,
    24,
    |b: &[u8]| q5_codes(&b[4..24]).map(|v| v as i8),
    q5_1
);

/// IQ4_NL / MXFP4 × q8_0: two float accumulators (even and odd blocks), an odd last block
/// added separately as `d · sumi` (multiply, then add).
macro_rules! table_q8_0 {
    ($name:ident, $bytes:expr, $table:expr, $d:expr, $qs:expr, $simd:ident $(; $gemm_simd:ident)?) => {
        row_dot!($name, 32, $bytes, Q8_0, {
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
                for (wb, yb) in block_pairs(w, x, k, 32, ($bytes, 34)) {
                    let q = nibbles(&wb[$qs..$qs + 16]).map(|v| $table[v as usize]);
                    fma_lanes(&mut acc, f16_at(yb, 0) * $d(wb), &chunk_lanes(&q, &yb[2..]));
                }
                hsum8(&acc)
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn dot_gemm_simd(w: &[u8], x: &[u8], k: usize) -> f32 {
                // SAFETY: the caller guarantees AVX2, FMA and F16C.
                unsafe { crate::kernels::dot::avx2::$gemm_simd(w, x, k) }
            }
            )?
        });
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

row_dot!(Q2K, 256, 84, Q8K, {
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        superblock_dot(w, x, k, 84, |acc, wb, (yd, q8, bs)| {
            let d = yd * f16_at(wb, 80);
            let dmin = -yd * f16_at(wb, 82);
            let scales = &wb[..16];
            let prod: [i32; 8] = std::array::from_fn(|l| {
                (scales[2 * l] >> 4) as i32 * bs[2 * l]
                    + (scales[2 * l + 1] >> 4) as i32 * bs[2 * l + 1]
            });
            fma_lanes(acc, dmin, &prod);
            let sc: [i32; 16] = std::array::from_fn(|i| (scales[i] & 15) as i32);
            let mut q = [0i8; 256];
            q2k_codes(wb, &mut q);
            fma_lanes(acc, d, &superblock_lanes(&q, &sc, q8));
        })
    }
    simd_dot!(q2_k);
    tiled_dot!(84, true, Codes::Biased(0), |wb, t| {
        let scales = &wb[..16];
        t.sc = std::array::from_fn(|i| (scales[i] & 15) as i32);
        t.mn = std::array::from_fn(|i| (scales[i] >> 4) as i32);
        q2k_codes(wb, &mut t.q);
        (t.d, t.dmin) = (f16_at(wb, 80), f16_at(wb, 82));
    });
});

row_dot!(Q3K, 256, 110, Q8K, {
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        superblock_dot(w, x, k, 110, |acc, wb, (yd, q8, _)| {
            let d = yd * f16_at(wb, 108);
            let sc = q3k_scales(&wb[96..108]);
            let mut q = [0i8; 256];
            q3k_codes(wb, &mut q);
            fma_lanes(acc, d, &superblock_lanes(&q, &sc, q8));
        })
    }
    simd_dot!(q3_k);
    tiled_dot!(110, false, Codes::Biased(4), |wb, t| {
        q3k_codes(wb, &mut t.q);
        (t.sc, t.d) = (q3k_scales(&wb[96..108]), f16_at(wb, 108));
    });
});

/// What Q4_K and Q5_K take from a super-block and its q8_K block besides the codes: `d` and
/// `-dmin` times the activation scale, the scales and mins, the q8 codes, the sums of 32 codes.
struct K4Block<'a> {
    d: f32,
    dmin: f32,
    sc: [i32; 8],
    mn: [i32; 8],
    q8: &'a [u8],
    s32: [i32; 8],
}

impl<'a> K4Block<'a> {
    #[inline(always)]
    fn new(wb: &[u8], (yd, q8, bs): (f32, &'a [u8], [i32; 16])) -> Self {
        let (sc, mn) = scale_min_k4(&wb[4..16]);
        Self {
            d: yd * f16_at(wb, 0),
            dmin: -yd * f16_at(wb, 2),
            sc,
            mn,
            q8,
            s32: bsums32(&bs),
        }
    }
}

/// The tiled decode of a Q4_K (`Q5` false) or Q5_K super-block.
#[inline(always)]
fn k4_decode<const Q5: bool>(wb: &[u8], t: &mut Decoded) {
    let (sc, mn) = scale_min_k4(&wb[4..16]);
    (t.sc, t.mn) = (per16(&sc), per16(&mn));
    if Q5 {
        q5k_codes(wb, &mut t.q);
    } else {
        k4_nibbles(&wb[16..144], &mut t.q);
    }
    (t.d, t.dmin) = (f16_at(wb, 0), f16_at(wb, 2));
}

/// The portable dot of a Q4_K (`Q5` false) or Q5_K row: ggml keeps Q4_K's min products in
/// four lanes and Q5_K's in one sum.
#[inline(always)]
fn k4_dot<const Q5: bool>(w: &[u8], x: &[u8], k: usize) -> f32 {
    let mut acc_m = [0.0f32; 4];
    let mut summs = 0.0f32;
    let mut q = [0i8; 256];
    let w_bytes = if Q5 { 176 } else { 144 };
    let sum = superblock_dot(w, x, k, w_bytes, |acc, wb, yb| {
        let b = K4Block::new(wb, yb);
        if Q5 {
            let mins: i32 = (0..8).map(|j| b.mn[j] * b.s32[j]).sum();
            summs = b.dmin.mul_add(mins as f32, summs);
            q5k_codes(wb, &mut q);
        } else {
            for (t, m) in acc_m.iter_mut().enumerate() {
                let prod = b.mn[2 * t] * b.s32[2 * t] + b.mn[2 * t + 1] * b.s32[2 * t + 1];
                *m = b.dmin.mul_add(prod as f32, *m);
            }
            k4_nibbles(&wb[16..144], &mut q);
        }
        fma_lanes(acc, b.d, &superblock_lanes(&q, &per16(&b.sc), b.q8));
    });
    if Q5 {
        sum + summs
    } else {
        sum + hsum4(&acc_m)
    }
}

/// Q4_K (`$q5` false) and Q5_K, through [`k4_dot`] and [`k4_decode`].
macro_rules! k4_type {
    ($name:ident, $bytes:expr, $q5:expr, $simd:ident $(; $simd4:ident)?) => {
        row_dot!($name, 256, $bytes, Q8K, {
            #[inline(always)]
            fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
                k4_dot::<$q5>(w, x, k)
            }
            simd_dot!($simd);
            $(simd_dot4!($simd4);)?
            tiled_dot!($bytes, true, Codes::Biased(0), |wb, t| {
                k4_decode::<$q5>(wb, t)
            });
        });
    };
}

k4_type!(Q4K, 144, false, q4_k; q4_k_x4);
k4_type!(Q5K, 176, true, q5_k);

row_dot!(Q6K, 256, 210, Q8K, {
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let mut q = [0i8; 256];
        superblock_dot(w, x, k, 210, |acc, wb, (yd, q8, bs)| {
            let d = yd * f16_at(wb, 208);
            let sc: [i32; 16] = std::array::from_fn(|i| wb[192 + i] as i8 as i32);
            q6k_codes(wb, &mut q);
            let mut lanes = superblock_lanes(&q, &sc, q8);
            for (l, v) in lanes.iter_mut().enumerate() {
                *v -= 32 * (bs[2 * l] * sc[2 * l] + bs[2 * l + 1] * sc[2 * l + 1]);
            }
            fma_lanes(acc, d, &lanes);
        })
    }
    simd_dot!(q6_k);
    simd_dot4!(q6_k_x4);
    tiled_dot!(210, false, Codes::Biased(32), |wb, t| {
        // the 6-bit codes minus their bias 32 (ggml removes it through the bsums: same s1)
        q6k_codes(wb, &mut t.q);
        t.q.iter_mut().for_each(|v| *v -= 32);
        t.sc = std::array::from_fn(|i| wb[192 + i] as i8 as i32);
        t.d = f16_at(wb, 208);
    });
});

/// IQ4_XS's eight 6-bit sub-block scales of one super-block, less 32.
#[inline(always)]
fn iq4xs_scales(wb: &[u8]) -> [i32; 8] {
    let sh = u16::from_le_bytes([wb[2], wb[3]]) as i32;
    std::array::from_fn(|ib| {
        let low = ((wb[4 + ib / 2] >> (4 * (ib % 2))) & 15) as i32;
        (low | (((sh >> (2 * ib)) & 3) << 4)) - 32
    })
}

/// IQ4_XS's codes (IQ4_NL values) of one super-block, in element order.
#[inline(always)]
fn iq4xs_codes(wb: &[u8], q: &mut [i8; 256]) {
    for ib in 0..8 {
        let qs = &wb[8 + 16 * ib..24 + 16 * ib];
        for i in 0..16 {
            q[32 * ib + i] = KVALUES_IQ4NL[(qs[i] & 15) as usize];
            q[32 * ib + 16 + i] = KVALUES_IQ4NL[(qs[i] >> 4) as usize];
        }
    }
}

row_dot!(IQ4XS, 256, 136, Q8K, {
    #[inline(always)]
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let mut q = [0i8; 256];
        superblock_dot(w, x, k, 136, |acc, wb, (yd, q8, _)| {
            iq4xs_codes(wb, &mut q);
            let lanes = superblock_lanes(&q, &per16(&iq4xs_scales(wb)), q8);
            fma_lanes(acc, f16_at(wb, 0) * yd, &lanes);
        })
    }
    simd_dot!(iq4_xs);
    tiled_dot!(136, false, Codes::Signed, |wb, t| {
        t.sc = per16(&iq4xs_scales(wb));
        iq4xs_codes(wb, &mut t.q);
        t.d = f16_at(wb, 0);
    });
});

row_dot!(F16, 1, 2, F16, {
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
        unsafe { crate::kernels::dot::avx2::f16x2(w, xs, k) }
    }
    #[inline(always)]
    fn dot_gemm(w: &[u8], x: &[u8], k: usize) -> f32 {
        tinyblas_order(k, |i| (f16_at(w, 2 * i), f16_at(x, 2 * i)))
    }
});

row_dot!(BF16, 1, 2, BF16, {
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
});

row_dot!(F32, 1, 4, F32, {
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
});
