//! Register helpers the AVX2 (and AVX-512) dot products share: loads, unpacking, lane sums.

use std::arch::x86_64::*;

use crate::kernels::dot::lanes::hsum8;

#[inline(always)]
pub(crate) unsafe fn load32(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

#[inline(always)]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    let h = u16::from_le_bytes([*p, *p.add(1)]) as u32;
    // A `vmovd` that zeroes the register: left to itself, LLVM inserts the half into whatever
    // register is at hand (often the loop's accumulator), chaining every block's scale to the
    // previous block's FMA and serializing the loop.
    let v: __m128i;
    std::arch::asm!("vmovd {v}, {h:e}", v = out(xmm_reg) v, h = in(reg) h,
        options(pure, nomem, nostack, preserves_flags));
    _mm_cvtss_f32(_mm_cvtph_ps(v))
}

/// Bytes ahead of the current weight block that decode loops prefetch: more cache-line misses
/// in flight than the hardware prefetcher keeps for one stream (a hint only, never faults).
pub(crate) const PREFETCH_AHEAD: usize = 3072;

#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(p: *const u8) {
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD) as *const i8);
}

/// `hsum_float_8` of one register (via [`hsum8`]).
#[inline(always)]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let mut a = [0.0f32; 8];
    _mm256_storeu_ps(a.as_mut_ptr(), v);
    hsum8(&a)
}

/// Lanes of Σ x·y over 32 signed bytes (`mul_sum_i8_pairs_float` before the conversion).
#[inline(always)]
pub(crate) unsafe fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// 16 bytes of nibbles to 32 bytes: low nibbles, then high nibbles (`bytes_from_nibbles_32`).
#[inline(always)]
pub(crate) unsafe fn nibbles32(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_set_m128i(_mm_srli_epi16(tmp, 4), tmp);
    _mm256_and_si256(both, _mm256_set1_epi8(0xF))
}

#[inline(always)]
pub(crate) unsafe fn q8k_d(y: *const u8) -> f32 {
    f32::from_le_bytes([*y, *y.add(1), *y.add(2), *y.add(3)])
}

#[inline(always)]
pub(crate) unsafe fn bsum(y: *const u8, j: usize) -> i32 {
    i16::from_le_bytes([*y.add(260 + 2 * j), *y.add(261 + 2 * j)]) as i32
}

/// A Q4_K super-block's start, shared by both builds of [`q4_k`]: prefetch, `d`, and the
/// mins · (pairs of bsums) term into `acc_m` as ggml does (i16 pair sums, then i32 lanes of two
/// products); returns `d` and the eight scales as i16 lanes.
#[inline(always)]
pub(crate) unsafe fn q4k_start(wb: *const u8, yb: *const u8, acc_m: &mut __m128) -> (f32, __m128i) {
    for line in 0..3 {
        prefetch_ahead(wb.add(64 * line));
    }
    let yd = q8k_d(yb);
    let d = yd * f16_at(wb);
    let dmin = -yd * f16_at(wb.add(2));
    let (sc, mn) = k4_scales_mins(wb.add(4));
    let q8sums = load32(yb.add(260));
    let q8s = _mm_hadd_epi16(
        _mm256_castsi256_si128(q8sums),
        _mm256_extracti128_si256(q8sums, 1),
    );
    let prod = _mm_madd_epi16(mn, q8s);
    *acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), *acc_m);
    (d, sc)
}

/// The super-block loop of both builds of [`q4_k`]: [`q4k_start`], then `block(qs, q8, sc, d,
/// acc)` returns `acc` plus the block's scaled sums (codes at `qs`, activations at `q8`), then
/// [`q4k_finish`].
#[inline(always)]
pub(crate) unsafe fn q4k_blocks(
    w: &[u8],
    x: &[u8],
    nb: usize,
    mut block: impl FnMut(*const u8, *const u8, __m128i, f32, __m256) -> __m256,
) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..nb {
        let wb = w.as_ptr().add(144 * i);
        let yb = x.as_ptr().add(292 * i);
        let (d, sc) = q4k_start(wb, yb, &mut acc_m);
        acc = block(wb.add(16), yb.add(4), sc, d, acc);
    }
    q4k_finish(acc, acc_m)
}

/// [`q4_k`]'s end: the `hsum` of the scaled sums plus the mins term's four lanes.
#[inline(always)]
pub(crate) unsafe fn q4k_finish(acc: __m256, acc_m: __m128) -> f32 {
    let mut m = [0.0f32; 4];
    _mm_storeu_ps(m.as_mut_ptr(), acc_m);
    hsum(acc) + ((m[0] + m[2]) + (m[1] + m[3]))
}

/// The 8 six-bit scales and 8 mins of a Q4_K/Q5_K block (12 bytes at `p`) as i16 lanes,
/// unpacked with whole-word masks like ggml's x86 code ([`scale_min_k4`] per value).
#[inline(always)]
pub(crate) unsafe fn k4_scales_mins(p: *const u8) -> (__m128i, __m128i) {
    pub(crate) const KMASK1: u32 = 0x3f3f_3f3f;
    pub(crate) const KMASK2: u32 = 0x0f0f_0f0f;
    pub(crate) const KMASK3: u32 = 0x0303_0303;
    let u = |o: usize| std::ptr::read_unaligned(p.add(o) as *const u32);
    let (u0, u1, u2) = (u(0), u(4), u(8));
    let sc0 = u0 & KMASK1;
    let sc1 = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let mn0 = u1 & KMASK1;
    let mn1 = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let both = _mm256_cvtepu8_epi16(_mm_set_epi32(
        mn1 as i32, mn0 as i32, sc1 as i32, sc0 as i32,
    ));
    (
        _mm256_castsi256_si128(both),
        _mm256_extracti128_si256(both, 1),
    )
}

/// i16 scales: lanes 0-3 (bytes 0-15) `a`, lanes 4-7 `b`.
#[inline(always)]
pub(crate) unsafe fn split_scale(a: i8, b: i8) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b as i16), _mm_set1_epi16(a as i16))
}

/// 32 bits to 32 bytes of 0x00 / 0xFF (`bytes_from_bits_32`).
#[inline(always)]
pub(crate) unsafe fn bytes_from_bits(p: *const u8) -> __m256i {
    let x32 = u32::from_le_bytes([*p, *p.add(1), *p.add(2), *p.add(3)]);
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf);
    let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
}

/// Lanes of Σ x·y, `x` unsigned bytes (`mul_sum_us8_pairs_float` before the conversion).
#[inline(always)]
pub(crate) unsafe fn dot_u8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1))
}

/// 32 table values of 16 nibble-packed bytes: low nibbles, then high nibbles.
#[inline(always)]
pub(crate) unsafe fn table32(table: __m128i, p: *const u8) -> __m256i {
    let bits = _mm_loadu_si128(p as *const __m128i);
    let m4 = _mm_set1_epi8(0x0f);
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(bits, m4));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
    _mm256_set_m128i(hi, lo)
}

/// Activation rows one multi-row call takes (their outputs computed exactly as one-row calls).
pub const ROWS4: usize = 4;
