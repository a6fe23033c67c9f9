//! ggml's tiled K-quant order ([`super::kquant_tiles`]) for many activation rows, with the
//! activation rows as vector lanes: eight q8_K rows are packed so that lane `t` of a vector holds
//! four codes of row `t`, and each weight's four codes are broadcast to all lanes. Then
//! `vpmaddubsw` + `vpmaddwd` (the scale) + `vpaddd` accumulate `s1` of eight rows in one
//! vector with no horizontal sums, and the bsum terms (`s2`, or the code bias) come from the
//! packed bsums the same way. The integers are exact, so they equal the reference's; the float
//! step runs on eight lanes with [`super::kquant_tiles`]'s operations (same bits).
//!
//! A tile is four weight rows × two groups of eight activation rows (eight accumulators).
//! AVX2 only: the portable build keeps the row kernels, which give the same bits.

use super::kquant_tiles::{Codes, Decoded, Shape, Q8K_BYTES};
use crate::kernels::cpu::avx512_vnni_active;
use crate::kernels::cpu::simd_active;
use crate::kernels::operand::{Converted, RowsJob};

/// Activation rows per packed group: one per 32-bit lane.
const GROUP: usize = 8;
/// Packed bytes per group and super-block: the codes (`[64 quads][8 rows]` of 4 bytes), the
/// bsums (`[8 pairs][8 rows]` of two i16) and the eight d.
const CODES_BYTES: usize = 64 * 32;
const BSUMS_BYTES: usize = 8 * 32;
const SLAB_BYTES: usize = CODES_BYTES + BSUMS_BYTES + 32;
/// Packed activation bytes one pass over the weights walks (about half of L2).
const ACT_BLOCK_BYTES: usize = 256 * 1024;

/// Whether the many-row K-quant path runs here (types with a tiled order, on AVX2).
pub fn serves(type_id: u32) -> bool {
    matches!(type_id, 10..=14 | 23) && simd_active()
}

/// q8_K activation rows (`act`, `k` columns) packed by groups of eight rows (a short last
/// group repeats its last row). `rows` stays the real row count.
pub fn pack(act: &Converted, k: usize) -> Converted {
    let (n, nb) = (act.rows, k / 256);
    let groups = n.div_ceil(GROUP);
    let mut data = vec![0u8; groups * nb * SLAB_BYTES];
    if nb == 0 {
        return Converted {
            data,
            row_bytes: 0,
            rows: n,
        };
    }
    for (g, slabs) in data.chunks_exact_mut(nb * SLAB_BYTES).enumerate() {
        for (b, dst) in slabs.chunks_exact_mut(SLAB_BYTES).enumerate() {
            for t in 0..GROUP {
                let r = (g * GROUP + t).min(n - 1);
                let at = r * act.row_bytes + b * Q8K_BYTES;
                let y = &act.data[at..at + Q8K_BYTES];
                for q in 0..64 {
                    let o = q * 32 + t * 4;
                    dst[o..o + 4].copy_from_slice(&y[4 + 4 * q..8 + 4 * q]);
                }
                for p in 0..8 {
                    let o = CODES_BYTES + p * 32 + t * 4;
                    dst[o..o + 4].copy_from_slice(&y[260 + 4 * p..264 + 4 * p]);
                }
                let o = CODES_BYTES + BSUMS_BYTES + t * 4;
                dst[o..o + 4].copy_from_slice(&y[..4]);
            }
        }
    }
    Converted {
        data,
        row_bytes: nb * SLAB_BYTES,
        rows: n,
    }
}

/// One weight super-block as the tile reads it: the first `vpmaddubsw` operand per code
/// (code + bias, or |code|), the codes (their signs, IQ4_XS), each 16-code scale as 16 i16,
/// the bsum weights as i16 pairs (mins, or bias · scale), and the two factors.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct WeightSlab {
    ubytes: [u8; 256],
    codes: [i8; 256],
    scales: [[i16; 16]; 16],
    per_bsum: [i16; 16],
    d: f32,
    neg_dmin: f32,
}

impl Default for WeightSlab {
    fn default() -> Self {
        Self {
            ubytes: [0; 256],
            codes: [0; 256],
            scales: [[0; 16]; 16],
            per_bsum: [0; 16],
            d: 0.0,
            neg_dmin: 0.0,
        }
    }
}

/// The many-row rows function: weight rows `first..first + out.len() / n` of `w` (`stride`
/// bytes apart) against the packed activations, `out[i · n + r]`.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `act` comes from [`pack`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn rows(job: RowsJob<'_>, shape: Shape, decode: impl Fn(&[u8], &mut Decoded)) {
    use std::arch::x86_64::*;
    let (w, stride, first, k, act, out, _) = job.into_parts();
    let (n, nb, bb) = (act.rows, k / 256, shape.block_bytes);
    if n == 0 || nb == 0 {
        return;
    }
    let groups = n.div_ceil(GROUP);
    assert!(act.data.len() >= groups * nb * SLAB_BYTES);
    let rows_total = out.len() / n;
    // an even number of groups per pass, sized so their packed slabs stay in L2
    let gblock = (ACT_BLOCK_BYTES / (nb * SLAB_BYTES)).clamp(2, groups.next_multiple_of(2)) & !1;
    let mut ws = [WeightSlab::default(); 4];
    let mut dec = Decoded::default();
    // VNNI for biased codes (AVX-512 has no vpsignb for IQ4_XS's signed ones)
    let vnni = matches!(shape.codes, Codes::Biased(_)) && avx512_vnni_active();
    let mut acc = vec![_mm256_setzero_ps(); 4 * gblock]; // [row][group]
    let base = act.data.as_ptr();
    for g0 in (0..groups).step_by(gblock) {
        let g1 = groups.min(g0 + gblock);
        for i0 in (0..rows_total).step_by(4) {
            acc.fill(_mm256_setzero_ps());
            for b in 0..nb {
                for (i, slab) in ws.iter_mut().enumerate() {
                    // rows past the end repeat the last one; their results are dropped
                    let at = (first + (i0 + i).min(rows_total - 1)) * stride + b * bb;
                    decode(&w[at..at + bb], &mut dec);
                    fill(slab, &dec, shape);
                    // the same super-block of the next four rows, asked for a whole pass over
                    // the groups ahead: their rows start new streams the hardware misses
                    let next = (first + (i0 + 4 + i).min(rows_total - 1)) * stride + b * bb;
                    for line in (0..bb).step_by(64) {
                        _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(next + line) as *const i8);
                    }
                }
                for gp in (g0..g1).step_by(2) {
                    let gq = [gp, (gp + 1).min(g1 - 1)];
                    let ys = gq.map(|g| base.add((g * nb + b) * SLAB_BYTES));
                    let res = if vnni {
                        tile_vnni(&ws, ys, shape)
                    } else {
                        tile(&ws, ys, shape)
                    };
                    for (j, y) in ys.iter().enumerate().take(if gp + 1 < g1 { 2 } else { 1 }) {
                        let dx = _mm256_loadu_ps(y.add(CODES_BYTES + BSUMS_BYTES) as *const f32);
                        for (i, s) in ws.iter().enumerate() {
                            let (s1, s2) = (res[i][j], res[4 + i][j]);
                            let mut r = _mm256_mul_ps(_mm256_set1_ps(s.d), _mm256_cvtepi32_ps(s1));
                            if shape.has_min {
                                let nd = _mm256_set1_ps(s.neg_dmin);
                                r = _mm256_fmadd_ps(nd, _mm256_cvtepi32_ps(s2), r);
                            }
                            let a = &mut acc[i * gblock + gq[j] - g0];
                            *a = _mm256_fmadd_ps(dx, r, *a);
                        }
                    }
                }
            }
            for i in 0..4.min(rows_total - i0) {
                for g in g0..g1 {
                    let mut v = [0.0f32; GROUP];
                    _mm256_storeu_ps(v.as_mut_ptr(), acc[i * gblock + g - g0]);
                    let (r0, take) = (g * GROUP, GROUP.min(n - g * GROUP));
                    let dst = (i0 + i) * n + r0;
                    out[dst..dst + take].copy_from_slice(&v[..take]);
                }
            }
        }
    }
}

/// [`WeightSlab`] of a decoded super-block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn fill(s: &mut WeightSlab, dec: &Decoded, shape: Shape) {
    use std::arch::x86_64::*;
    for c in 0..8 {
        // SAFETY: 32 bytes at 32·c lie inside the 256 codes of each array.
        unsafe {
            let q = _mm256_loadu_si256(dec.q.as_ptr().add(32 * c) as *const __m256i);
            let u = match shape.codes {
                Codes::Biased(bias) => _mm256_add_epi8(q, _mm256_set1_epi8(bias)),
                Codes::Signed => {
                    _mm256_storeu_si256(s.codes.as_mut_ptr().add(32 * c) as *mut __m256i, q);
                    _mm256_abs_epi8(q)
                }
            };
            _mm256_storeu_si256(s.ubytes.as_mut_ptr().add(32 * c) as *mut __m256i, u);
        }
    }
    for (dst, &sc) in s.scales.iter_mut().zip(&dec.sc) {
        *dst = [sc as i16; 16];
    }
    s.per_bsum = std::array::from_fn(|i| match shape.codes {
        _ if shape.has_min => dec.mn[i] as i16,
        Codes::Biased(bias) => (bias as i32 * dec.sc[i]) as i16, // |bias·scale| <= 32·127
        Codes::Signed => 0,
    });
    s.d = dec.d;
    s.neg_dmin = -dec.dmin;
}

/// Four lanes' bytes at `p`, broadcast.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn quad(p: *const u8) -> std::arch::x86_64::__m256i {
    // SAFETY: the caller's four bytes.
    unsafe { std::arch::x86_64::_mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32)) }
}

/// `[s1 of row i, group j]` for i < 4, then `[s2 …]` (zero unless the format has mins): four
/// weight super-blocks against the packed slabs `ys` of two groups.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn tile(
    ws: &[WeightSlab; 4],
    ys: [*const u8; 2],
    shape: Shape,
) -> [[std::arch::x86_64::__m256i; 2]; 8] {
    use std::arch::x86_64::*;
    let zero = _mm256_setzero_si256();
    let mut acc = [[zero; 2]; 4];
    // an opaque trip count keeps the sub-block loop rolled (unrolled, LLVM spills)
    for sub in 0..std::hint::black_box(16) {
        for q4 in 0..4 {
            let q = sub * 4 + q4;
            // SAFETY: quad q of 64 in each packed slab and weight slab.
            let y: [__m256i; 2] =
                ys.map(|p| unsafe { _mm256_loadu_si256(p.add(q * 32) as *const __m256i) });
            for (a, s) in acc.iter_mut().zip(ws) {
                // SAFETY: as above.
                let (u, sc) = unsafe {
                    (
                        quad(s.ubytes.as_ptr().add(4 * q)),
                        _mm256_load_si256(s.scales[sub].as_ptr() as *const __m256i),
                    )
                };
                let sg = match shape.codes {
                    // SAFETY: as above.
                    Codes::Signed => unsafe { quad(s.codes.as_ptr().add(4 * q) as *const u8) },
                    Codes::Biased(_) => u,
                };
                for (aj, yj) in a.iter_mut().zip(y) {
                    let yv = match shape.codes {
                        Codes::Signed => _mm256_sign_epi8(yj, sg),
                        Codes::Biased(_) => yj,
                    };
                    *aj = _mm256_add_epi32(*aj, _mm256_madd_epi16(_mm256_maddubs_epi16(u, yv), sc));
                }
            }
        }
    }
    finish(acc, ws, ys, shape)
}

/// [`tile`] with AVX-512 VNNI for biased codes: a register holds the lanes of both groups,
/// `vpdpbusd` sums each 16-code sub-block exactly in i32 (no byte pair to saturate), one
/// `vpmulld` applies its scale, and the bsum terms use `vpdpwssd`: the same integers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512vnni")]
unsafe fn tile_vnni(
    ws: &[WeightSlab; 4],
    ys: [*const u8; 2],
    shape: Shape,
) -> [[std::arch::x86_64::__m256i; 2]; 8] {
    use std::arch::x86_64::*;
    let zero = _mm512_setzero_si512();
    // both groups' 32 bytes at byte offset `at` of their slabs, in one register
    let pair = |at: usize| unsafe {
        // SAFETY: the caller's slabs hold `at + 32` bytes.
        let lo = _mm256_loadu_si256(ys[0].add(at) as *const __m256i);
        let hi = _mm256_loadu_si256(ys[1].add(at) as *const __m256i);
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    };
    let mut acc = [zero; 4];
    // an opaque trip count keeps the sub-block loop rolled
    for sub in 0..std::hint::black_box(16) {
        let mut part = [zero; 4];
        for q4 in 0..4 {
            let q = sub * 4 + q4;
            let y = pair(q * 32);
            for (p, s) in part.iter_mut().zip(ws) {
                // SAFETY: quad q of 64 in the weight slab.
                let u =
                    unsafe { std::ptr::read_unaligned(s.ubytes.as_ptr().add(4 * q) as *const i32) };
                *p = _mm512_dpbusd_epi32(*p, _mm512_set1_epi32(u), y);
            }
        }
        for ((a, p), s) in acc.iter_mut().zip(part).zip(ws) {
            let sc = _mm512_set1_epi32(s.scales[sub][0] as i32);
            *a = _mm512_add_epi32(*a, _mm512_mullo_epi32(p, sc));
        }
    }
    let bias = matches!(shape.codes, Codes::Biased(1..));
    let mut bsum = [zero; 4];
    if shape.has_min || bias {
        for p in 0..8 {
            let bs = pair(CODES_BYTES + p * 32);
            for (t, s) in bsum.iter_mut().zip(ws) {
                // SAFETY: i16 pair p of the 16 bsum weights.
                let wq = unsafe {
                    std::ptr::read_unaligned(s.per_bsum.as_ptr().add(2 * p) as *const i32)
                };
                *t = _mm512_dpwssd_epi32(*t, bs, _mm512_set1_epi32(wq));
            }
        }
    }
    let halves = |v: __m512i| [_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v)];
    let mut res = [[_mm256_setzero_si256(); 2]; 8];
    for i in 0..4 {
        if shape.has_min {
            res[i] = halves(acc[i]);
            res[4 + i] = halves(bsum[i]);
        } else {
            res[i] = halves(_mm512_sub_epi32(acc[i], bsum[i]));
        }
    }
    res
}

/// The tiles' end: `s1` and the bsum terms (`s2`, or the code bias taken off `s1`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn finish(
    acc: [[std::arch::x86_64::__m256i; 2]; 4],
    ws: &[WeightSlab; 4],
    ys: [*const u8; 2],
    shape: Shape,
) -> [[std::arch::x86_64::__m256i; 2]; 8] {
    use std::arch::x86_64::*;
    let zero = _mm256_setzero_si256();
    let mut res = [[zero; 2]; 8];
    let bias = matches!(shape.codes, Codes::Biased(1..));
    for (i, s) in ws.iter().enumerate() {
        for j in 0..2 {
            let mut t = zero;
            if shape.has_min || bias {
                for p in 0..8 {
                    // SAFETY: pair p of 8 in the packed bsums; i16 pair p of the weights.
                    let (bs, wq) = unsafe {
                        (
                            _mm256_loadu_si256(ys[j].add(CODES_BYTES + p * 32) as *const __m256i),
                            quad(s.per_bsum.as_ptr().add(2 * p) as *const u8),
                        )
                    };
                    t = _mm256_add_epi32(t, _mm256_madd_epi16(bs, wq));
                }
            }
            if shape.has_min {
                res[i][j] = acc[i][j];
                res[4 + i][j] = t;
            } else {
                res[i][j] = _mm256_sub_epi32(acc[i][j], t);
            }
        }
    }
    res
}
