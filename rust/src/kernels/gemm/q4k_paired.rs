//! Q4_K decode (one activation row) with AVX-512: the q8_K activations re-laid so that one
//! 64-byte load of weight codes meets its activations in one 64-byte load.
//!
//! A Q4_K super-block stores sub-blocks 2j and 2j + 1 as the low and high nibbles of the same
//! 32 bytes. Loading 64 bytes of codes (j, j + 1) and masking gives sub-blocks (2j, 2j + 2) and
//! (2j + 1, 2j + 3) in one register each, so the activations are stored with their sub-blocks in
//! the order 0, 2, 1, 3, 4, 6, 5, 7; the pair sums of the bsums (the mins term's operand) and the
//! scale `d` are precomputed per block. The per-block work drops from ~100 to ~75 micro-ops (no
//! 256-to-512 inserts, one vector unpack of the scales instead of scalar masks). Every int32
//! lane still holds ggml's lane sum and every FMA is ggml's (`vec_dot_q4_K_q8_K`): same bits.

use crate::kernels::cpu::avx512_vnni_active;
use crate::kernels::dot::by_type::{row_dot, Q4K};
use crate::kernels::operand::Converted;

/// Bytes of one activation block in this layout: 256 codes, 8 i16 pair sums, `d` (f32), pad.
pub const BLOCK_BYTES: usize = 288;
const Q8K_BYTES: usize = 292;
const SUMS_AT: usize = 256;
const D_AT: usize = 272;
/// Sub-block held in each 32-byte slot of the codes.
const SLOT_SUB_BLOCK: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

/// Whether one-row Q4_K matmuls take this layout on this CPU right now.
pub fn serves(type_id: u32, n: usize) -> bool {
    type_id == 12 && n == 1 && avx512_vnni_active()
}

/// q8_K activation rows (`k` columns, the standard 292-byte blocks) in this layout.
pub fn pack(act: &Converted, k: usize) -> Converted {
    let nb = k / 256;
    let row_bytes = nb * BLOCK_BYTES;
    let mut data = vec![0u8; act.rows * row_bytes];
    for (r, dst_row) in data.chunks_exact_mut(row_bytes.max(1)).enumerate() {
        let src_row = act.row(r);
        for (src, dst) in src_row
            .chunks_exact(Q8K_BYTES)
            .zip(dst_row.chunks_exact_mut(BLOCK_BYTES))
        {
            pack_block(src, dst);
        }
    }
    Converted {
        data,
        row_bytes,
        rows: act.rows,
    }
}

fn pack_block(src: &[u8], dst: &mut [u8]) {
    for (slot, &sub) in SLOT_SUB_BLOCK.iter().enumerate() {
        dst[32 * slot..32 * slot + 32].copy_from_slice(&src[4 + 32 * sub..36 + 32 * sub]);
    }
    let bsum = |j: usize| i16::from_le_bytes([src[260 + 2 * j], src[261 + 2 * j]]);
    for s in 0..8 {
        // `_mm_hadd_epi16` of the bsums: a wrapping i16 add, as ggml's x86 code does
        let pair = bsum(2 * s).wrapping_add(bsum(2 * s + 1));
        dst[SUMS_AT + 2 * s..SUMS_AT + 2 * s + 2].copy_from_slice(&pair.to_le_bytes());
    }
    dst[D_AT..D_AT + 4].copy_from_slice(&src[..4]);
}

/// One packed activation row back in the standard q8_K layout (the portable fallback).
fn unpack_row(x: &[u8], k: usize) -> Vec<u8> {
    let nb = k / 256;
    let mut out = vec![0u8; nb * Q8K_BYTES];
    for (src, dst) in x
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(Q8K_BYTES))
    {
        for (slot, &sub) in SLOT_SUB_BLOCK.iter().enumerate() {
            dst[4 + 32 * sub..36 + 32 * sub].copy_from_slice(&src[32 * slot..32 * slot + 32]);
        }
        dst[..4].copy_from_slice(&src[D_AT..D_AT + 4]);
        // the bsums themselves are not kept; a sum pair's first half carries the pair's sum
        for s in 0..8 {
            dst[260 + 4 * s..262 + 4 * s]
                .copy_from_slice(&src[SUMS_AT + 2 * s..SUMS_AT + 2 * s + 2]);
        }
    }
    out
}

row_dot!(
    /// Q4_K weights · activations in this layout.
    Q4KPaired, 256, 144, Q8K, {
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        Q4K::dot(w, &unpack_row(x, k), k)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dot_simd(w: &[u8], x: &[u8], k: usize) -> f32 {
        if avx512_vnni_active() {
            // SAFETY: AVX-512 F/BW/VNNI checked just above.
            unsafe { wide::dot(w, x, k) }
        } else {
            Self::dot(w, x, k)
        }
    }
});

#[cfg(target_arch = "x86_64")]
mod wide {
    use std::arch::x86_64::*;

    use super::{BLOCK_BYTES, D_AT, SUMS_AT};
    use crate::kernels::dot::avx2::common::{f16_at, prefetch_ahead, q4k_finish};
    use crate::kernels::dot::avx512::{fold_wide_block, scaled_pair};

    /// The eight scales and eight mins of a Q4_K block (12 bytes at `p`, 16 readable) as i16
    /// lanes 0-7 and 8-15: ggml's `utmp` masks on four u32 lanes at once.
    #[inline(always)]
    unsafe fn scales_mins(p: *const u8) -> __m256i {
        let v = _mm_loadu_si128(p as *const __m128i); // u0, u1, u2, (codes)
        let low6 = _mm_and_si128(v, _mm_set1_epi32(0x3f3f_3f3f)); // sc0, mn0
        let top2 = _mm_and_si128(_mm_srli_epi32::<2>(v), _mm_set1_epi32(0x3030_3030));
        let u2 = _mm_srlv_epi32(
            _mm_shuffle_epi32::<0b1010_1010>(v),
            _mm_setr_epi32(0, 4, 0, 0),
        );
        let high = _mm_or_si128(top2, _mm_and_si128(u2, _mm_set1_epi32(0x0f0f_0f0f))); // sc1, mn1
        _mm256_cvtepu8_epi16(_mm_unpacklo_epi32(low6, high)) // sc0, sc1, mn0, mn1
    }

    /// # Safety
    /// The CPU must support AVX2, FMA, F16C and AVX-512 F/BW/VNNI.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
    pub unsafe fn dot(w: &[u8], x: &[u8], k: usize) -> f32 {
        let nb = k / 256;
        assert!(w.len() >= nb * 144 && x.len() >= nb * BLOCK_BYTES);
        let m4 = _mm512_set1_epi8(0xF);
        // i16 lanes 0-15 pick one scale, 16-31 another: the sub-blocks of each code register
        let pick: [__m512i; 4] = [(0, 2), (1, 3), (4, 6), (5, 7)].map(|(a, b)| {
            let lo = _mm256_set1_epi16(a);
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), _mm256_set1_epi16(b))
        });
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for i in 0..nb {
            let wb = w.as_ptr().add(144 * i);
            let yb = x.as_ptr().add(BLOCK_BYTES * i);
            for line in 0..3 {
                prefetch_ahead(wb.add(64 * line));
            }
            let yd = std::ptr::read_unaligned(yb.add(D_AT) as *const f32);
            let d = yd * f16_at(wb);
            let dmin = -yd * f16_at(wb.add(2));
            let both = scales_mins(wb.add(4));
            let sums = _mm_loadu_si128(yb.add(SUMS_AT) as *const __m128i);
            let prod = _mm_madd_epi16(_mm256_extracti128_si256::<1>(both), sums);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
            let scales = _mm512_castsi256_si512(both);
            let qs = wb.add(16);
            let mut sumi = _mm512_setzero_si512();
            for half in 0..2 {
                let bits = _mm512_loadu_si512(qs.add(64 * half) as *const _);
                let lo = _mm512_and_si512(bits, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(bits), m4);
                let scale = |g: usize| _mm512_permutexvar_epi16(pick[g], scales);
                let both = [scale(2 * half), scale(2 * half + 1)];
                sumi = scaled_pair(sumi, [lo, hi], yb.add(128 * half), both);
            }
            acc = fold_wide_block(sumi, d, acc);
        }
        q4k_finish(acc, acc_m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::cpu::avx512_vnni_active;
    use crate::kernels::dot::row_dot::RowDot;
    use crate::kernels::formats::ActFormat;
    use crate::kernels::test_util::{noise, weights};

    /// The packed layout, on every build, gives the standard layout's bits.
    #[test]
    fn paired_layout_keeps_the_bits() {
        for k in [256usize, 1024, 2816] {
            let m = 3;
            let w = weights(12, m, k, k as u64);
            let act = Converted::new(ActFormat::Q8K, &noise(7 + k as u64, k), k);
            let packed = pack(&act, k);
            let row = k / 256 * 144;
            for i in 0..m {
                let wr = &w[i * row..(i + 1) * row];
                let want = Q4K::dot(wr, act.row(0), k);
                assert_eq!(
                    Q4KPaired::dot(wr, packed.row(0), k).to_bits(),
                    want.to_bits()
                );
                #[cfg(target_arch = "x86_64")]
                if avx512_vnni_active() {
                    // SAFETY: checked just above.
                    let got = unsafe { wide::dot(wr, packed.row(0), k) };
                    assert_eq!(got.to_bits(), want.to_bits(), "k {k} row {i}");
                }
            }
        }
    }
}
