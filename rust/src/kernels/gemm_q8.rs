//! Weights whose blocks are 32 signed bytes and one f16 scale against q8_0 activations
//! (q8_0, q4_0, q5_0), for several activation rows: ggml's AVX2 vec_dot for these types is
//! `acc = fma(d_w·d_x, Σ lanes of w·x, acc)` per block and `hsum` at the end, so a tile of
//! outputs can share the work around that core. Each tile of weight rows is decoded once into
//! signed bytes and f32 scales, the activation scales are widened once per call, and a 4 × 2
//! register tile of outputs runs over the blocks. Every output keeps ggml's lanes, FMA order
//! and final sum, so the bits equal [`super::dot`]'s (the tests compare them).
//!
//! AVX2 only: the portable build keeps the row-dot path, which gives the same bits.

use super::matmul::{Converted, RowsFn};

/// Weight rows and activation rows per register tile.
const MR: usize = 4;
const NR: usize = 2;
/// Activation bytes walked per decoded weight tile (about half of L2).
const XBLOCK_BYTES: usize = 256 * 1024;

/// 32 signed values, aligned for whole-register loads.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Block([i8; 32]);

/// The ggml type ids served, with their block bytes.
fn block_bytes(type_id: u32) -> Option<usize> {
    match type_id {
        8 => Some(34), // q8_0
        2 => Some(18), // q4_0
        6 => Some(22), // q5_0
        _ => None,
    }
}

/// Whether this kernel serves `type_id` for `n` activation rows on this CPU.
pub fn serves(type_id: u32, n: usize) -> bool {
    n >= NR && block_bytes(type_id).is_some() && super::matmul::simd_active()
}

#[inline(always)]
fn f16(b: &[u8]) -> f32 {
    super::fp16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// The rows function for [`super::matmul::run_rows`] (`act` in q8_0 form).
pub fn rows_fn(type_id: u32) -> RowsFn {
    match type_id {
        8 => rows_entry::<8>,
        2 => rows_entry::<2>,
        _ => rows_entry::<6>,
    }
}

fn rows_entry<const TYPE_ID: u32>(
    w: &[u8],
    stride: usize,
    first: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
    _gemm: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            super::matmul::simd_active(),
            "gemm_q8 needs AVX2, FMA and F16C"
        );
        // SAFETY: checked just above.
        unsafe { avx2::rows(TYPE_ID, w, stride, first, k, act, out) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("gemm_q8 is only chosen on x86-64 with AVX2")
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{block_bytes, f16, Block, Converted, MR, NR, XBLOCK_BYTES};
    use crate::kernels::dot_avx2::{bytes_from_bits, hsum, nibbles32};

    /// One weight block as the 32 signed values of ggml's vec_dot (`qx`), and its scale.
    #[inline(always)]
    unsafe fn decode_simd(type_id: u32, b: *const u8, q: &mut Block) -> f32 {
        let qx = match type_id {
            8 => _mm256_loadu_si256(b.add(2) as *const __m256i),
            2 => _mm256_sub_epi8(nibbles32(b.add(2)), _mm256_set1_epi8(8)),
            _ => {
                let hi = _mm256_andnot_si256(bytes_from_bits(b.add(2)), _mm256_set1_epi8(-16));
                _mm256_or_si256(nibbles32(b.add(6)), hi)
            }
        };
        _mm256_store_si256(q.0.as_mut_ptr() as *mut __m256i, qx);
        let h = u16::from_le_bytes([*b, *b.add(1)]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    /// Weight rows `first..first + out.len() / n` against every activation row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rows(
        type_id: u32,
        w: &[u8],
        stride: usize,
        first: usize,
        k: usize,
        act: &Converted,
        out: &mut [f32],
    ) {
        let n = act.rows;
        let nb = k / 32;
        let bb = block_bytes(type_id).expect("served type");
        if n == 0 || nb == 0 {
            return;
        }
        assert!(act.row_bytes == nb * 34 && act.data.len() >= n * nb * 34);
        let rows_total = out.len() / n;
        // activations once, as 32-byte aligned values and f32 scales: [row][block]
        let dy: Vec<f32> = act.data.chunks_exact(34).map(f16).collect();
        let xq: Vec<Block> = act
            .data
            .chunks_exact(34)
            .map(|b| Block(std::array::from_fn(|j| b[2 + j] as i8)))
            .collect();
        let mut wq = vec![Block([0; 32]); MR * nb];
        let mut dw = vec![0.0f32; MR * nb]; // [block][row]: one load gives a block's MR scales
                                            // activation blocks of even size, so none is a small remainder
        let parts = (n * act.row_bytes).div_ceil(XBLOCK_BYTES).max(1);
        let xblock = n.div_ceil(parts).next_multiple_of(NR);
        for r0 in (0..n).step_by(xblock) {
            let r1 = n.min(r0 + xblock);
            for t0 in (0..rows_total).step_by(MR) {
                let t1 = rows_total.min(t0 + MR);
                for i in 0..MR {
                    // rows past the end repeat the last one; their results are dropped
                    let at = (first + (t0 + i).min(t1 - 1)) * stride;
                    let row = &w[at..at + nb * bb];
                    for (b, blk) in row.chunks_exact(bb).enumerate() {
                        dw[b * MR + i] = decode_simd(type_id, blk.as_ptr(), &mut wq[i * nb + b]);
                    }
                }
                for r in (r0..r1).step_by(NR) {
                    let xr: [usize; NR] = std::array::from_fn(|j| (r + j).min(r1 - 1));
                    let res = tile(&wq, &dw, &xq, &dy, xr, nb);
                    for (i, vals) in res.iter().enumerate() {
                        if t0 + i < t1 {
                            for (j, v) in vals.iter().enumerate().take(r1 - r) {
                                out[(t0 + i) * n + r + j] = *v;
                            }
                        }
                    }
                }
            }
        }
    }

    /// MR decoded weight rows × NR activation rows.
    #[inline(always)]
    unsafe fn tile(
        wq: &[Block],
        dw: &[f32],
        xq: &[Block],
        dy: &[f32],
        xr: [usize; NR],
        nb: usize,
    ) -> [[f32; NR]; MR] {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        let xp = xr.map(|r| xq.as_ptr().add(r * nb));
        let dyr = xr.map(|r| dy.as_ptr().add(r * nb));
        for b in 0..nb {
            let ys: [__m256i; NR] =
                std::array::from_fn(|j| _mm256_load_si256(xp[j].add(b) as *const __m256i));
            // d_w·d_x for the 4 weight rows at once per activation row (the same products as
            // the scalar ones), spread to 8 lanes by shuffles: off the FMA/multiply ports
            let dw4 = _mm_loadu_ps(dw.as_ptr().add(b * MR));
            let ds: [__m256; NR] = std::array::from_fn(|j| {
                let d4 = _mm_mul_ps(dw4, _mm_set1_ps(*dyr[j].add(b)));
                _mm256_insertf128_ps(_mm256_castps128_ps256(d4), d4, 1)
            });
            for (i, acc_i) in acc.iter_mut().enumerate() {
                let qx = _mm256_load_si256(wq.as_ptr().add(i * nb + b) as *const __m256i);
                let ax = _mm256_sign_epi8(qx, qx);
                for ((a, y), d8) in acc_i.iter_mut().zip(&ys).zip(&ds) {
                    let sy = _mm256_sign_epi8(*y, qx);
                    let q = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
                    let d = match i {
                        0 => _mm256_shuffle_ps(*d8, *d8, 0x00),
                        1 => _mm256_shuffle_ps(*d8, *d8, 0x55),
                        2 => _mm256_shuffle_ps(*d8, *d8, 0xAA),
                        _ => _mm256_shuffle_ps(*d8, *d8, 0xFF),
                    };
                    *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), *a);
                }
            }
        }
        acc.map(|row| row.map(|a| hsum(a)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::act::ActFormat;
    use crate::kernels::dot::{RowDot, Q4_0, Q5_0, Q8_0};
    use crate::kernels::test_util::noise;

    /// Every output equals the portable row dot bit for bit, ragged tiles included.
    #[test]
    fn tiles_equal_the_row_dots() {
        if !crate::kernels::matmul::simd_active() {
            return; // the kernel only runs with AVX2 (the portable path is tested elsewhere)
        }
        for &t in &[8u32, 2, 6] {
            let bb = block_bytes(t).unwrap();
            for &(m, k, n) in &[(5usize, 64usize, 4usize), (3, 96, 9), (33, 320, 13)] {
                let mut w: Vec<u8> = noise(t as u64, m * k / 32 * bb)
                    .iter()
                    .map(|v| ((v + 1.0) * 127.9) as u8)
                    .collect();
                for blk in w.chunks_exact_mut(bb) {
                    blk[..2].copy_from_slice(&crate::kernels::f32_to_fp16(0.02).to_le_bytes());
                }
                let x = noise(5, n * k);
                let act = Converted::new(ActFormat::Q8_0, &x, k);
                let mut got = vec![0.0f32; m * n];
                rows_fn(t)(&w, k / 32 * bb, 0, k, &act, &mut got, false);
                let row = k / 32 * bb;
                for r in 0..n {
                    for i in 0..m {
                        let (wr, xr) = (&w[i * row..(i + 1) * row], &act.data[r * 34 * (k / 32)..]);
                        let b = match t {
                            8 => Q8_0::dot(wr, xr, k),
                            2 => Q4_0::dot(wr, xr, k),
                            _ => Q5_0::dot(wr, xr, k),
                        };
                        let a = got[i * n + r];
                        assert_eq!(a.to_bits(), b.to_bits(), "type {t} {m}x{k}x{n} at {r},{i}");
                    }
                }
            }
        }
    }
}
