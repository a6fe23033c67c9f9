//! Weights whose blocks are 32 signed bytes and one f16 scale against q8_0 activations
//! (q8_0, q4_0, q5_0), for several activation rows: ggml's AVX2 vec_dot for these types is
//! `acc = fma(d_w·d_x, Σ lanes of w·x, acc)` per block and `hsum` at the end, so a tile of
//! outputs can share the work around that core. Each panel of 8 weight rows is decoded once
//! into `maddubs` operands (|q| and q for q8_0's sign trick; q4_0/q5_0 as unsigned `q + 8` /
//! `q + 16`, the offset taken off exactly through per-lane activation sums), the products
//! d_w·d_x of the panel are tabled per activation block, and 4 × 2 register tiles run over the
//! blocks. Every output keeps ggml's integer lanes, FMA order and final sum, so the bits equal
//! [`crate::kernels::dot`]'s (the tests compare them).
//!
//! With AVX-512 VNNI (`mod vnni`, from 4 activation rows) a register holds a pair of weight
//! rows and `vpdpbusd` makes the four-byte integer lanes in one step (every weight stored
//! unsigned as `v + offset`, the offset taken off through the activation lane sums), for the
//! same integer lanes, FMAs and sums: the same bits again.
//!
//! x86-64 SIMD only: the portable build keeps the row-dot path, which gives the same bits.

use crate::kernels::blocks::half::fp16_to_f32;
use crate::kernels::cpu::avx512_vnni_active;
use crate::kernels::cpu::simd_active;
use crate::kernels::gemm::float_tiles::store_tile;
use crate::kernels::operand::{Converted, RowsFn, RowsJob};

/// Weight rows and activation rows per register tile.
const MR: usize = 4;
/// Weight rows decoded together: two tiles share one table of scale products.
const PANEL: usize = 8;
const NR: usize = 2;
/// Activation bytes (with their products) walked per decoded weight panel (about half of L2).
const XBLOCK_BYTES: usize = 256 * 1024;
/// Weight blocks (of 32) per pass over an activation block, for rows longer than
/// `KC_FROM` blocks (shorter ones in one pass: measured faster up to K = 2048).
const KC_BLOCKS: usize = 32;
const KC_FROM: usize = 64;

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
    n >= NR && block_bytes(type_id).is_some() && simd_active()
}

#[inline(always)]
fn f16(b: &[u8]) -> f32 {
    fp16_to_f32(u16::from_le_bytes([b[0], b[1]]))
}

/// The rows function for the matmul's thread split (`act` packed by [`pack`] with the same
/// `vnni`).
pub fn rows_fn(type_id: u32, vnni: bool) -> RowsFn {
    match (type_id, vnni) {
        (8, false) => rows_entry::<8, false>,
        (2, false) => rows_entry::<2, false>,
        (_, false) => rows_entry::<6, false>,
        (8, true) => rows_entry::<8, true>,
        (2, true) => rows_entry::<2, true>,
        (_, true) => rows_entry::<6, true>,
    }
}

/// What the weights are stored as for `maddubs` / `vpdpbusd`: `v + offset` in an unsigned
/// byte, the offset taken off exactly through per-lane activation sums. q4_0 and q5_0 are
/// stored so already; q8_0 keeps ggml's sign trick (0) under AVX2 and adds 128 under VNNI.
fn offset(type_id: u32, vnni: bool) -> u8 {
    match type_id {
        2 => 8,
        6 => 16,
        _ if vnni => 128,
        _ => 0,
    }
}

/// Bytes of [`pack`]'s layout for `blocks` activation blocks.
fn packed_bytes(blocks: usize, off: u8) -> usize {
    blocks * (32 + 4 + if off != 0 { 32 } else { 0 })
}

/// One call of the tiles: its sizes and the packed activations (see [`pack`]: values, scales,
/// offset sums, each `[row][block]`), read in place with unaligned loads.
#[derive(Clone, Copy)]
struct Call {
    /// Activation rows, K blocks, bytes of a weight block, weight rows.
    n: usize,
    nb: usize,
    bb: usize,
    rows_total: usize,
    xq: *const Block,
    dy: *const f32,
    ysum: *const Block,
}

impl Call {
    /// The call of `job`, with its weights, stride, first row and output; `None` when there is
    /// nothing to compute. The activations must come from [`pack`] with this `vnni`.
    #[allow(clippy::type_complexity)]
    fn new(
        type_id: u32,
        job: RowsJob<'_>,
        vnni: bool,
    ) -> Option<(Self, &[u8], usize, usize, &mut [f32])> {
        let (w, stride, first, k, act, out, _) = job.into_parts();
        let (n, nb) = (act.rows, k / 32);
        let bb = block_bytes(type_id).expect("served type");
        if n == 0 || nb == 0 {
            return None;
        }
        let blocks = n * nb;
        let off = offset(type_id, vnni);
        assert!(act.row_bytes == nb * 34 && act.data.len() >= packed_bytes(blocks, off));
        let data = act.data.as_ptr();
        let call = Self {
            n,
            nb,
            bb,
            rows_total: out.len() / n,
            xq: data as *const Block,
            dy: data.wrapping_add(blocks * 32) as *const f32,
            ysum: data.wrapping_add(blocks * 36) as *const Block,
        };
        Some((call, w, stride, first, out))
    }

    /// `(n, nb, rows_total, xq, dy, ysum)`.
    #[allow(clippy::type_complexity)]
    fn parts(&self) -> (usize, usize, usize, *const Block, *const f32, *const Block) {
        (
            self.n,
            self.nb,
            self.rows_total,
            self.xq,
            self.dy,
            self.ysum,
        )
    }

    /// `decode(b, i, block)` for every block `b` of the panel's weight rows `i` (rows `rows` of
    /// the call; rows past the end repeat the last one, their results dropped).
    #[inline(always)]
    fn decode_panel(
        &self,
        w: &[u8],
        stride: usize,
        first: usize,
        rows: std::ops::Range<usize>,
        mut decode: impl FnMut(usize, usize, *const u8),
    ) {
        for i in 0..PANEL {
            let at = (first + (rows.start + i).min(rows.end - 1)) * stride;
            let row = &w[at..at + self.nb * self.bb];
            for (b, blk) in row.chunks_exact(self.bb).enumerate() {
                decode(b, i, blk.as_ptr());
            }
        }
    }
}

/// q8_0 activation rows (`act`) laid out once per matmul for the tiles of every thread: the
/// 32 values of each block back to back, then the f32 scales, then (where the weights carry an
/// offset) the offset lane sums (negated for `vnni`, whose `vpdpbusd` starts from them), each
/// `[row][block]`. `row_bytes` and `rows` stay those of `act`.
pub fn pack(act: &Converted, type_id: u32, vnni: bool) -> Converted {
    let blocks = act.data.len() / 34;
    let off = offset(type_id, vnni);
    let mut data = vec![0u8; packed_bytes(blocks, off)];
    let (values, rest) = data.split_at_mut(blocks * 32);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    let (scales, sums) = rest.split_at_mut(blocks * 4);
    for (i, b) in act.data.chunks_exact(34).enumerate() {
        values[i * 32..i * 32 + 32].copy_from_slice(&b[2..]);
        scales[i * 4..i * 4 + 4].copy_from_slice(&f16(b).to_le_bytes());
        #[cfg(target_arch = "x86_64")]
        if off != 0 {
            // SAFETY: AVX2 is present wherever this kernel is chosen (`serves`); 32 bytes each.
            unsafe { avx2::offset_sum(b[2..].as_ptr(), off, vnni, sums[i * 32..].as_mut_ptr()) };
        }
    }
    Converted {
        data,
        row_bytes: act.row_bytes,
        rows: act.rows,
    }
}

fn rows_entry<const TYPE_ID: u32, const VNNI: bool>(job: RowsJob<'_>) {
    #[cfg(target_arch = "x86_64")]
    {
        if VNNI {
            assert!(
                avx512_vnni_active(),
                "gemm_q8's VNNI tiles need AVX-512 F, BW and VNNI"
            );
            // SAFETY: checked just above.
            return unsafe { vnni::rows(TYPE_ID, job) };
        }
        assert!(simd_active(), "gemm_q8 needs AVX2, FMA and F16C");
        // SAFETY: checked just above.
        unsafe { avx2::rows(TYPE_ID, job) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("gemm_q8 is only chosen on x86-64 with AVX2")
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{offset, Block, Call, RowsJob, KC_BLOCKS, KC_FROM, MR, NR, PANEL, XBLOCK_BYTES};
    use crate::kernels::dot::avx2::common::{bytes_from_bits, hsum, nibbles32};

    /// One weight block: the unsigned operand of `maddubs` (|v| for q8_0, `v + offset`
    /// otherwise) into `a`, the signed values into `s` (q8_0 only), and its scale.
    #[inline(always)]
    unsafe fn decode_simd(type_id: u32, b: *const u8, a: &mut Block, s: &mut Block) -> f32 {
        let ua = match type_id {
            8 => {
                let qx = _mm256_loadu_si256(b.add(2) as *const __m256i);
                _mm256_store_si256(s.0.as_mut_ptr() as *mut __m256i, qx);
                _mm256_sign_epi8(qx, qx)
            }
            2 => nibbles32(b.add(2)),
            _ => {
                let hi = _mm256_and_si256(bytes_from_bits(b.add(2)), _mm256_set1_epi8(16));
                _mm256_or_si256(nibbles32(b.add(6)), hi)
            }
        };
        _mm256_store_si256(a.0.as_mut_ptr() as *mut __m256i, ua);
        let h = u16::from_le_bytes([*b, *b.add(1)]);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    /// Lane sums `offset · Σ y` of the activation block at `y` (lane m: bytes 4m..4m+3),
    /// negated if `negate`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn offset_sum(y: *const u8, off: u8, negate: bool, dst: *mut u8) {
        let yv = _mm256_loadu_si256(y as *const __m256i);
        // maddubs takes `off` unsigned: 128 · 127 · 2 still fits its i16 pairs
        let lanes = _mm256_madd_epi16(
            _mm256_maddubs_epi16(_mm256_set1_epi8(off as i8), yv),
            _mm256_set1_epi16(1),
        );
        let lanes = if negate {
            _mm256_sub_epi32(_mm256_setzero_si256(), lanes)
        } else {
            lanes
        };
        _mm256_storeu_si256(dst as *mut __m256i, lanes);
    }

    /// Weight rows `first..first + out.len() / n` against every activation row.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rows(type_id: u32, job: RowsJob<'_>) {
        let Some((call, w, stride, first, out)) = Call::new(type_id, job, false) else {
            return;
        };
        let (n, nb, rows_total, xq, dy, ysum) = call.parts();
        let off = offset(type_id, false);
        // the decoded panel, each [block][row]: unsigned operands, signed values (q8_0 only),
        // scales
        let mut wa = vec![Block([0; 32]); PANEL * nb];
        let mut ws = vec![Block([0; 32]); PANEL * nb];
        let mut dw = vec![0.0f32; PANEL * nb];
        // the K blocks walked per pass: tiles keep their accumulators between passes, so a long
        // row (ffn_down) does not shrink the activation block to a few rows; activation blocks
        // of even size, so none is a small remainder, sized by what one activation row of a
        // pass brings into cache: values, products (and offset sums)
        let kc = if nb > KC_FROM { KC_BLOCKS } else { nb };
        let row_cache = kc * (32 + 4 * PANEL + if off != 0 { 32 } else { 0 });
        let parts = (n * row_cache).div_ceil(XBLOCK_BYTES).max(1);
        let xblock = n.div_ceil(parts).next_multiple_of(NR);
        // d_w·d_x of the panel's rows for every activation block of the pass:
        // [row - r0][block - kb][PANEL], the same products as ggml's scalar ones, so the tile
        // loop only broadcasts them
        let mut prod = vec![0.0f32; xblock * kc * PANEL];
        let zero = [[_mm256_setzero_ps(); NR]; MR];
        let mut accs = vec![zero; PANEL / MR * xblock / NR]; // [sub][r pair]
        for r0 in (0..n).step_by(xblock) {
            let r1 = n.min(r0 + xblock);
            for t0 in (0..rows_total).step_by(PANEL) {
                let t1 = rows_total.min(t0 + PANEL);
                call.decode_panel(w, stride, first, t0..t1, |b, i, blk| {
                    let (a, s) = (&mut wa[b * PANEL + i], &mut ws[b * PANEL + i]);
                    dw[b * PANEL + i] = decode_simd(type_id, blk, a, s);
                });
                accs.fill(zero);
                for kb in (0..nb).step_by(kc) {
                    let kn = kc.min(nb - kb);
                    let (pp, dwp) = (prod.as_mut_ptr(), dw.as_ptr());
                    for r in r0..r1 {
                        let dst = pp.add((r - r0) * kc * PANEL);
                        for b in 0..kn {
                            let d = dy.add(r * nb + kb + b).read_unaligned();
                            let v = _mm256_mul_ps(
                                _mm256_loadu_ps(dwp.add((kb + b) * PANEL)),
                                _mm256_set1_ps(d),
                            );
                            _mm256_storeu_ps(dst.add(b * PANEL), v);
                        }
                    }
                    for sub in (t0..t1).step_by(MR) {
                        let s0 = sub - t0;
                        for r in (r0..r1).step_by(NR) {
                            let xr: [usize; NR] = std::array::from_fn(|j| (r + j).min(r1 - 1));
                            let xp = xr.map(|x| xq.add(x * nb + kb));
                            let pr = xr.map(|x| prod.as_ptr().add((x - r0) * kc * PANEL + s0));
                            let (wa, ws) = (
                                wa.as_ptr().add(kb * PANEL + s0),
                                ws.as_ptr().add(kb * PANEL + s0),
                            );
                            let acc = &mut accs[s0 / MR * (xblock / NR) + (r - r0) / NR];
                            if off == 0 {
                                tile::<true>(wa, ws, xp, xp, pr, kn, acc)
                            } else {
                                let sp = xr.map(|x| ysum.add(x * nb + kb));
                                tile::<false>(wa, ws, xp, sp, pr, kn, acc)
                            };
                        }
                    }
                }
                for sub in (t0..t1).step_by(MR) {
                    let s0 = sub - t0;
                    for r in (r0..r1).step_by(NR) {
                        let acc = &accs[s0 / MR * (xblock / NR) + (r - r0) / NR];
                        let res = acc.map(|row| row.map(|a| hsum(a)));
                        super::store_tile(out, &res, sub, t1, n, r, r1);
                    }
                }
            }
        }
    }

    /// MR decoded weight rows (`wa`/`ws`: [block][PANEL]) × NR activation rows (`xp`, their
    /// offset lane sums `sp`, the products `pp`: [block][PANEL]). `SIGNED`: ggml's sign trick
    /// on `ws`; else the unsigned weights times the activations less the offset sums.
    #[inline(always)]
    unsafe fn tile<const SIGNED: bool>(
        wa: *const Block,
        ws: *const Block,
        xp: [*const Block; NR],
        sp: [*const Block; NR],
        pp: [*const f32; NR],
        nb: usize,
        acc_io: &mut [[__m256; NR]; MR],
    ) {
        // opaque, or LLVM rebuilds the row pointers from their indices inside the loop
        let (wa, ws, xp, sp, pp) = std::hint::black_box((wa, ws, xp, sp, pp));
        let ones = _mm256_set1_epi16(1);
        let mut acc = *acc_io;
        for b in 0..nb {
            let ys: [__m256i; NR] =
                std::array::from_fn(|j| _mm256_loadu_si256(xp[j].add(b) as *const __m256i));
            for (i, acc_i) in acc.iter_mut().enumerate() {
                // volatile: loaded here, once per weight row and block, not all hoisted ahead
                // (which pushed the accumulators out of registers)
                let ua = std::ptr::read_volatile(wa.add(b * PANEL + i) as *const __m256i);
                let qx = if SIGNED {
                    std::ptr::read_volatile(ws.add(b * PANEL + i) as *const __m256i)
                } else {
                    ua
                };
                for (j, a) in acc_i.iter_mut().enumerate() {
                    let q = if SIGNED {
                        let sy = _mm256_sign_epi8(ys[j], qx);
                        _mm256_madd_epi16(_mm256_maddubs_epi16(ua, sy), ones)
                    } else {
                        let lanes = _mm256_madd_epi16(_mm256_maddubs_epi16(ua, ys[j]), ones);
                        _mm256_sub_epi32(lanes, _mm256_loadu_si256(sp[j].add(b) as *const __m256i))
                    };
                    let d = _mm256_broadcast_ss(&*pp[j].add(b * PANEL + i));
                    *a = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q), *a);
                }
            }
        }
        *acc_io = acc;
    }
}

/// The AVX-512 VNNI tiles: a 512-bit register holds one block of two weight rows, `vpdpbusd`
/// sums each lane's four byte products (the lanes `maddubs` + `madd` make) onto the negated
/// offset sums, and the FMA of each half is that row's AVX2 FMA.
#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::RowsJob;
    use super::{f16, XBLOCK_BYTES};
    use super::{Block, Call, KC_BLOCKS, KC_FROM, PANEL};
    use crate::kernels::dot::avx2::common::{bytes_from_bits, nibbles32};
    use crate::kernels::dot::lanes::hsum8;

    /// Weight-row pairs per register tile (a whole panel: 8 rows; 4 x 4 register tiles
    /// measured 1.1x faster than 2 x 4, 2 x 6 and 4 x 3).
    const PAIRS: usize = 4;
    /// Activation rows per register tile.
    const NR: usize = 4;
    /// Row pairs of a panel.
    const PANEL_PAIRS: usize = PANEL / 2;

    /// The unsigned operand `v + offset` of one weight block into `a`; its scale.
    #[inline(always)]
    unsafe fn decode(type_id: u32, b: *const u8, a: &mut Block) -> f32 {
        let ua = match type_id {
            8 => _mm256_xor_si256(
                _mm256_loadu_si256(b.add(2) as *const __m256i),
                _mm256_set1_epi8(-128),
            ),
            2 => nibbles32(b.add(2)),
            _ => {
                let hi = _mm256_and_si256(bytes_from_bits(b.add(2)), _mm256_set1_epi8(16));
                _mm256_or_si256(nibbles32(b.add(6)), hi)
            }
        };
        _mm256_store_si256(a.0.as_mut_ptr() as *mut __m256i, ua);
        f16(std::slice::from_raw_parts(b, 2))
    }

    /// Weight rows `first..first + out.len() / n` against every activation row.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni")]
    pub unsafe fn rows(type_id: u32, job: RowsJob<'_>) {
        let Some((call, w, stride, first, out)) = Call::new(type_id, job, true) else {
            return;
        };
        let (n, nb, rows_total, xq, dy, ysum) = call.parts();
        // the decoded panel: unsigned operands [block][PANEL], and each row pair's scales
        // spread over the halves of a register, [block][pair][16]
        let mut wa = vec![Block([0; 32]); PANEL * nb];
        let mut dw = vec![[0.0f32; 16]; PANEL_PAIRS * nb];
        let kc = if nb > KC_FROM { KC_BLOCKS } else { nb };
        let parts = (n * kc * (32 + 4 + 32)).div_ceil(XBLOCK_BYTES).max(1);
        let xblock = n.div_ceil(parts).next_multiple_of(NR);
        let zero = [[_mm512_setzero_ps(); NR]; PAIRS];
        let mut accs = vec![zero; PANEL_PAIRS / PAIRS * xblock / NR]; // [sub][r group]
        for r0 in (0..n).step_by(xblock) {
            let r1 = n.min(r0 + xblock);
            for t0 in (0..rows_total).step_by(PANEL) {
                let t1 = rows_total.min(t0 + PANEL);
                call.decode_panel(w, stride, first, t0..t1, |b, i, blk| {
                    let d = decode(type_id, blk, &mut wa[b * PANEL + i]);
                    dw[b * PANEL_PAIRS + i / 2][(i % 2) * 8..(i % 2) * 8 + 8].fill(d);
                });
                accs.fill(zero);
                for kb in (0..nb).step_by(kc) {
                    let kn = kc.min(nb - kb);
                    for sub in (t0..t1).step_by(2 * PAIRS) {
                        let s0 = sub - t0;
                        for r in (r0..r1).step_by(NR) {
                            let xr: [usize; NR] = std::array::from_fn(|j| (r + j).min(r1 - 1));
                            let at = xr.map(|x| x * nb + kb);
                            let acc = &mut accs[s0 / (2 * PAIRS) * (xblock / NR) + (r - r0) / NR];
                            tile(
                                wa.as_ptr().add(kb * PANEL + s0),
                                dw.as_ptr().add(kb * PANEL_PAIRS + s0 / 2) as *const f32,
                                at.map(|a| xq.add(a)),
                                at.map(|a| ysum.add(a)),
                                at.map(|a| dy.add(a)),
                                kn,
                                acc,
                            );
                        }
                    }
                }
                for sub in (t0..t1).step_by(2 * PAIRS) {
                    let s0 = sub - t0;
                    for r in (r0..r1).step_by(NR) {
                        let acc = &accs[s0 / (2 * PAIRS) * (xblock / NR) + (r - r0) / NR];
                        let mut res = [[0.0f32; NR]; 2 * PAIRS];
                        for (p, pair) in acc.iter().enumerate() {
                            for (j, v) in pair.iter().enumerate() {
                                let mut lanes = [0.0f32; 16];
                                _mm512_storeu_ps(lanes.as_mut_ptr(), *v);
                                let (lo, hi) = lanes.split_at(8);
                                res[2 * p][j] = hsum8(lo.try_into().expect("8 lanes"));
                                res[2 * p + 1][j] = hsum8(hi.try_into().expect("8 lanes"));
                            }
                        }
                        super::store_tile(out, &res, sub, t1, n, r, r1);
                    }
                }
            }
        }
    }

    /// 2·PAIRS decoded weight rows (`wa`: [block][PANEL], `dw`: [block][pair][16]) × NR
    /// activation rows (`xp`, their negated offset sums `sp`, their scales `dp`).
    #[inline(always)]
    unsafe fn tile(
        wa: *const Block,
        dw: *const f32,
        xp: [*const Block; NR],
        sp: [*const Block; NR],
        dp: [*const f32; NR],
        nb: usize,
        acc_io: &mut [[__m512; NR]; PAIRS],
    ) {
        // opaque, or LLVM rebuilds the row pointers from their indices inside the loop
        let (wa, dw, xp, sp, dp) = std::hint::black_box((wa, dw, xp, sp, dp));
        let mut acc = *acc_io;
        for b in 0..nb {
            let both = |p: *const Block| {
                _mm512_broadcast_i64x4(_mm256_loadu_si256(p.add(b) as *const __m256i))
            };
            let ys: [__m512i; NR] = std::array::from_fn(|j| both(xp[j]));
            let cs: [__m512i; NR] = std::array::from_fn(|j| both(sp[j]));
            for (p, acc_p) in acc.iter_mut().enumerate() {
                let u = _mm512_loadu_si512(wa.add(b * PANEL + 2 * p) as *const __m512i);
                let dwv = _mm512_loadu_ps(dw.add((b * PANEL_PAIRS + p) * 16));
                for (j, a) in acc_p.iter_mut().enumerate() {
                    let q = _mm512_dpbusd_epi32(cs[j], u, ys[j]);
                    // d_w·d_x as ggml's scalar product, then its FMA
                    let d = _mm512_mul_ps(dwv, _mm512_set1_ps(*dp[j].add(b)));
                    *a = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(q), *a);
                }
            }
        }
        *acc_io = acc;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::blocks::half::f32_to_fp16;
    use crate::kernels::dot::{
        by_type::{Q4_0, Q5_0, Q8_0},
        row_dot::RowDot,
    };
    use crate::kernels::formats::ActFormat;
    use crate::kernels::test_util::noise;

    /// Every output equals the portable row dot bit for bit, ragged tiles included.
    #[test]
    fn tiles_equal_the_row_dots() {
        if !simd_active() {
            return; // the kernel only runs with AVX2 (the portable path is tested elsewhere)
        }
        tiles_equal_the_row_dots_on(false);
        if avx512_vnni_active() {
            tiles_equal_the_row_dots_on(true);
        }
    }

    fn tiles_equal_the_row_dots_on(vnni: bool) {
        for &t in &[8u32, 2, 6] {
            let bb = block_bytes(t).unwrap();
            for &(m, k, n) in &[
                (5usize, 64usize, 4usize),
                (3, 96, 9),
                (33, 320, 13),
                (9, 2304, 5),
            ] {
                let mut w: Vec<u8> = noise(t as u64, m * k / 32 * bb)
                    .iter()
                    .map(|v| ((v + 1.0) * 127.9) as u8)
                    .collect();
                for blk in w.chunks_exact_mut(bb) {
                    blk[..2].copy_from_slice(&f32_to_fp16(0.02).to_le_bytes());
                }
                let x = noise(5, n * k);
                let act = Converted::new(ActFormat::Q8_0, &x, k);
                let mut got = vec![0.0f32; m * n];
                let packed = pack(&act, t, vnni);
                rows_fn(t, vnni)(RowsJob::new(
                    &w,
                    k / 32 * bb,
                    0,
                    k,
                    &packed,
                    &mut got,
                    false,
                ));
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
                        let what = format!("vnni {vnni} type {t} {m}x{k}x{n} at {r},{i}");
                        assert_eq!(a.to_bits(), b.to_bits(), "{what}");
                    }
                }
            }
        }
    }
}
