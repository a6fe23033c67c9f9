//! The portable dot products' building blocks: AVX2's integer and float lanes emulated in
//! scalar code (same sums in the same order), and the code unpacking of the block formats.

use crate::kernels::blocks::half::fp16_to_f32;

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    fp16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline(always)]
pub(crate) fn f32_at(b: &[u8], at: usize) -> f32 {
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
pub(crate) fn hadd_reduce8(a: &[f32; 8]) -> f32 {
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (t[0] + t[1]) + (t[2] + t[3])
}

/// acc[l] = fma(d, lanes[l], acc[l]) (`_mm256_fmadd_ps`).
#[inline(always)]
pub(crate) fn fma_lanes(acc: &mut [f32; 8], d: f32, lanes: &[i32; 8]) {
    for (a, &s) in acc.iter_mut().zip(lanes) {
        *a = d.mul_add(s as f32, *a);
    }
}

/// Eight AVX2 lanes of Σ w·y over a 32-element chunk (`w` already signed integers).
#[inline(always)]
pub(crate) fn chunk_lanes(w: &[i8; 32], y: &[u8]) -> [i32; 8] {
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
pub(crate) fn superblock_lanes(w: &[i8; 256], sc: &[i32; 16], y: &[u8]) -> [i32; 8] {
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
pub(crate) fn nibbles(qs: &[u8]) -> [u8; 32] {
    std::array::from_fn(|i| if i < 16 { qs[i] & 15 } else { qs[i - 16] >> 4 })
}

/// The 32 five-bit codes of a Q5_0/Q5_1 block from its high bits (4 bytes at `b`) and nibbles
/// (the next 16 bytes).
#[inline(always)]
pub(crate) fn q5_codes(b: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let n = nibbles(&b[4..20]);
    std::array::from_fn(|i| n[i] | (((qh >> i) & 1) << 4) as u8)
}

/// q8_K activation block: (d, codes, bsums).
#[inline(always)]
pub(crate) fn q8k(y: &[u8]) -> (f32, &[u8], [i32; 16]) {
    let bsums =
        std::array::from_fn(|j| i16::from_le_bytes([y[260 + 2 * j], y[261 + 2 * j]]) as i32);
    (f32_at(y, 0), &y[4..260], bsums)
}

/// Per-32 scales repeated per 16 elements.
#[inline(always)]
pub(crate) fn per16(sc: &[i32; 8]) -> [i32; 16] {
    std::array::from_fn(|i| sc[i / 2])
}

/// Sums of 32 codes (vphaddw of the 16 bsums).
#[inline(always)]
pub(crate) fn bsums32(b: &[i32; 16]) -> [i32; 8] {
    std::array::from_fn(|j| b[2 * j] + b[2 * j + 1])
}

/// Q4_K/Q5_K nibbles of one super-block: chunk j/2 low nibbles, then high nibbles.
#[inline(always)]
pub(crate) fn k4_nibbles(qs: &[u8], w: &mut [i8; 256]) {
    for j in 0..4 {
        for i in 0..32 {
            let b = qs[32 * j + i];
            w[64 * j + i] = (b & 15) as i8;
            w[64 * j + 32 + i] = (b >> 4) as i8;
        }
    }
}

/// (m0+m2) + (m1+m3) of the 4-lane min accumulator.
#[inline(always)]
pub(crate) fn hsum4(a: &[f32; 4]) -> f32 {
    (a[0] + a[2]) + (a[1] + a[3])
}

/// Q2_K's 2-bit codes (0..3) of one super-block, in element order.
#[inline(always)]
pub(crate) fn q2k_codes(wb: &[u8], q: &mut [i8; 256]) {
    let qs = &wb[16..80];
    for j in 0..2 {
        for s in 0..4 {
            for i in 0..32 {
                q[128 * j + 32 * s + i] = ((qs[32 * j + i] >> (2 * s)) & 3) as i8;
            }
        }
    }
}

/// Q3_K's signed 3-bit codes (-4..3) of one super-block, in element order: the two low bits,
/// less 4 where the high bit is clear.
#[inline(always)]
pub(crate) fn q3k_codes(wb: &[u8], q: &mut [i8; 256]) {
    let (hmask, qs) = (&wb[..32], &wb[32..96]);
    for j in 0..2 {
        for s in 0..4 {
            for i in 0..32 {
                let low = ((qs[32 * j + i] >> (2 * s)) & 3) as i8;
                let high = (((hmask[i] >> (4 * j + s)) & 1) ^ 1) as i8;
                q[128 * j + 32 * s + i] = low - 4 * high;
            }
        }
    }
}

/// Q5_K's 5-bit codes (0..31) of one super-block: the 4-bit nibbles plus the high bits.
#[inline(always)]
pub(crate) fn q5k_codes(wb: &[u8], q: &mut [i8; 256]) {
    k4_nibbles(&wb[48..176], q);
    for c in 0..8 {
        for i in 0..32 {
            q[32 * c + i] += (((wb[16 + i] >> c) & 1) << 4) as i8;
        }
    }
}

/// Q6_K's 6-bit codes (0..63, bias not removed) of one super-block, in element order.
#[inline(always)]
pub(crate) fn q6k_codes(wb: &[u8], q: &mut [i8; 256]) {
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
pub(crate) fn four_acc(k: usize, get: impl Fn(usize) -> (f32, f32)) -> [[f32; 8]; 4] {
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
pub(crate) fn tinyblas_order(k: usize, get: impl Fn(usize) -> (f32, f32)) -> f32 {
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
pub(crate) fn reduce4(s: &[[f32; 8]; 4]) -> f32 {
    let r: [f32; 8] = std::array::from_fn(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]));
    hadd_reduce8(&r)
}

#[inline(always)]
pub(crate) fn bf16_at(b: &[u8], i: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u32) << 16)
}
