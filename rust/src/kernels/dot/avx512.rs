//! AVX-512 VNNI dot products, taken on top of the AVX2 build where the CPU has them: each keeps
//! ggml's integer lanes and FMAs (same bits as the AVX2 functions they replace).

use std::arch::x86_64::*;

use super::avx2::common::{load32, q4k_blocks};

/// [`q4_k`] with AVX-512 VNNI: the 64 codes of sub-blocks 2j and 2j + 1 in one register
/// (low nibbles, then high), `vpdpwssd` scales and adds the pairs. Each half's int32 lanes hold
/// the same products as ggml's eight lanes, so their sum is its `sumi`, exactly.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn q4_k_wide(w: &[u8], x: &[u8], nb: usize) -> f32 {
    let m4 = _mm512_set1_epi8(0xF);
    // i16 lanes 0-15 pick scale 2j, lanes 16-31 scale 2j + 1, from the 8 scales (i16)
    let pick: [__m512i; 4] = std::array::from_fn(|j| {
        let lo = _mm256_set1_epi16(2 * j as i16);
        let hi = _mm256_set1_epi16(2 * j as i16 + 1);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    });
    q4k_blocks(w, x, nb, |qs, q8, sc, d, acc| {
        let scales = _mm512_castsi128_si512(sc);
        let mut sumi = _mm512_setzero_si512();
        for (j, pick_j) in pick.iter().enumerate() {
            let bits = load32(qs.add(32 * j));
            let both =
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(bits), _mm256_srli_epi16(bits, 4));
            let codes = _mm512_and_si512(both, m4);
            let p = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(q8.add(64 * j) as *const _));
            let s = _mm512_permutexvar_epi16(*pick_j, scales);
            sumi = _mm512_dpwssd_epi32(sumi, p, s);
        }
        fold_wide_block(sumi, d, acc)
    })
}

/// The end of a Q4_K block summed in 512-bit lanes: its two halves added (ggml's eight lanes),
/// then `acc + d · sumi`.
#[inline(always)]
pub(crate) unsafe fn fold_wide_block(sumi: __m512i, d: f32, acc: __m256) -> __m256 {
    let sumi = _mm256_add_epi32(
        _mm512_castsi512_si256(sumi),
        _mm512_extracti64x4_epi64::<1>(sumi),
    );
    _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc)
}
