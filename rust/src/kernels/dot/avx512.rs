//! AVX-512 VNNI dot products, taken on top of the AVX2 build where the CPU has them: each keeps
//! ggml's integer lanes and FMAs (same bits as the AVX2 functions they replace).

use std::arch::x86_64::*;

use super::avx2::common::{f16_at, hsum, load32, prefetch_ahead, q4k_blocks, q8k_d};
use super::avx2::float::reduce8;

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

/// [`q6_k`] with AVX-512 VNNI: each 64 bytes of low bits hold the codes of two 32-value
/// groups (low nibbles) and two more (high nibbles), so one register carries what ggml's AVX2
/// code holds in two; the high bits come from one 32-byte load shifted per half, and
/// `vpdpwssd` scales and adds the pairs. Lanes 0-7 and 8-15 of the sum together hold ggml's
/// eight lanes (the same products, integer sums): same bits.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F/BW/VNNI; `w` and `x` hold `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn q6_k_wide(w: &[u8], x: &[u8], nb: usize) -> f32 {
    let m15 = _mm512_set1_epi8(15);
    let m48 = _mm512_set1_epi8(48);
    let halves = |a: i16, b: i16| {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_set1_epi16(a)),
            _mm256_set1_epi16(b),
        )
    };
    // high bits 0-1 (low half) and 2-3 (high half) up to bits 4-5; then 4-5 and 6-7
    let (up_a, down_b) = (halves(4, 2), halves(0, 2));
    // i16 lane l of group g's products takes scale 4g + l / 8 (16 values per scale)
    let pick: [__m512i; 4] = std::array::from_fn(|g| {
        let idx: [i16; 32] = std::array::from_fn(|l| (4 * g + l / 8) as i16);
        _mm512_loadu_si512(idx.as_ptr() as *const _)
    });
    let mut acc = _mm256_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(210 * i);
        let yb = x.as_ptr().add(292 * i);
        for line in 0..4 {
            prefetch_ahead(wb.add(64 * line));
        }
        let d = q8k_d(yb) * f16_at(wb.add(208));
        let sc = _mm_loadu_si128(wb.add(192) as *const __m128i);
        let scales16 = _mm256_cvtepi8_epi16(sc);
        let sub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(load32(yb.add(260)), scales16));
        let scales = _mm512_castsi256_si512(scales16);
        let q8 = yb.add(4);
        let mut sumi = _mm512_setzero_si512();
        for j in 0..2 {
            let low = _mm512_loadu_si512(wb.add(64 * j) as *const _);
            let high = _mm512_broadcast_i64x4(load32(wb.add(128 + 32 * j)));
            let ha = _mm512_and_si512(_mm512_sllv_epi16(high, up_a), m48);
            let hb = _mm512_and_si512(_mm512_srlv_epi16(high, down_b), m48);
            let a = _mm512_or_si512(_mm512_and_si512(low, m15), ha);
            let b = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(low), m15), hb);
            let scale = |g: usize| _mm512_permutexvar_epi16(pick[g], scales);
            sumi = scaled_pair(
                sumi,
                [a, b],
                q8.add(128 * j),
                [scale(2 * j), scale(2 * j + 1)],
            );
        }
        let sumi = _mm256_add_epi32(
            _mm512_castsi512_si256(sumi),
            _mm512_extracti64x4_epi64::<1>(sumi),
        );
        let sumi = _mm256_sub_epi32(sumi, sub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum(acc)
}

/// `sumi` plus two registers of unsigned codes times the 128 activation bytes at `y` (64 each,
/// `maddubs` pairs), each pair of products scaled by its i16 lane of `scales` (`vpdpwssd`).
#[inline(always)]
pub(crate) unsafe fn scaled_pair(
    sumi: __m512i,
    codes: [__m512i; 2],
    y: *const u8,
    scales: [__m512i; 2],
) -> __m512i {
    let p0 = _mm512_maddubs_epi16(codes[0], _mm512_loadu_si512(y as *const _));
    let p1 = _mm512_maddubs_epi16(codes[1], _mm512_loadu_si512(y.add(64) as *const _));
    _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(sumi, p0, scales[0]), p1, scales[1])
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

/// Widened activation bytes (all rows of a call) that still stay in L1 beside the streamed
/// weights, for [`f16_wide_rows8`].
const F16_WIDE_L1_ACT: usize = 24 * 1024;

/// [`super::avx2::f16_wide_rows8`] with 16-lane registers: the 32 values of a step in two
/// `vcvtph2ps zmm`, accumulator 0 holding ggml's accumulators 0 and 1 side by side and
/// accumulator 1 its 2 and 3. Each lane sees the same FMAs in the same order, and the two
/// halves of their sum are ggml's `(s0 + s2)` and `(s1 + s3)`: the same bits in half the
/// instructions: on the AVX-512 VM two activation rows read rows from memory 20–30 % faster
/// (one thread), one row as fast. Software prefetch only past [`F16_WIDE_L1_ACT`] bytes of
/// widened activations: below it cost one and two activation rows alike on the AVX-512 VM
/// (336 M shapes), above it read two rows of K = 4096 25 % faster. Rows one after
/// another, each read whole: K blocks across the eight rows (to keep two long activation rows
/// in L1) read the 336 M shapes at half the speed, the prefetcher losing the interleaved
/// streams.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F; as `f16_wide_rows8`.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
pub(crate) unsafe fn f16_wide_rows8<const R: usize>(
    w: *const u8,
    stride: usize,
    xs: [*const f32; R],
    k: usize,
) -> [__m256; R] {
    debug_assert!(k.is_multiple_of(32));
    // activation rows too long to stay in L1 beside the weights are read from L2 at every
    // weight row, and the slower loop leaves the hardware prefetcher behind
    let pf = R * k * 4 > F16_WIDE_L1_ACT;
    let mut red = [[_mm256_setzero_ps(); 8]; R];
    for row in 0..8 {
        let wp = w.add(row * stride);
        let mut s = [[_mm512_setzero_ps(); 2]; R];
        let mut i = 0;
        while i < k {
            if pf {
                prefetch_ahead(wp.add(2 * i));
            }
            for h in 0..2 {
                let a = _mm512_cvtph_ps(_mm256_loadu_si256(
                    wp.add(2 * (i + 16 * h)) as *const __m256i
                ));
                for (sr, x) in s.iter_mut().zip(xs) {
                    sr[h] = _mm512_fmadd_ps(a, _mm512_loadu_ps(x.add(i + 16 * h)), sr[h]);
                }
            }
            i += 32;
        }
        for (rr, sr) in red.iter_mut().zip(&s) {
            // [s0 + s2 | s1 + s3], then its halves added
            let t = _mm512_add_ps(sr[0], sr[1]);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(t)));
            rr[row] = _mm256_add_ps(_mm512_castps512_ps256(t), hi);
        }
    }
    red.map(|rr| reduce8(&rr))
}
