//! FLASH_ATTN_EXT for f16 K and V, computed like ggml's CPU backend (`ops.cpp`, one query row
//! at a time, `ggml_compute_forward_flash_attn_ext_f16_one_chunk`):
//!
//! * the q row is rounded to f16 (K's vec_dot type); `s = dot_f16(k, q)` in ggml's lane order;
//! * `s = s·scale`, then `softcap·tanh(s)`, then `+ slope·mask` (rows with mask -inf skipped);
//! * online softmax with the V accumulator in f16 (`VKQ16`): on a new maximum the accumulator is
//!   scaled by `exp(M_old − M)`, then `VKQ16 += v·exp(s − M)`; `S = S·ms + vs` (fused);
//! * sinks are merged after the loop in float32, then the row is scaled by `1/S`.
//!
//! For one query row at one sequence and at least 512 KV positions, ggml splits the KV range
//! into `threads` chunks and merges the chunks' (M, S, VKQ) partials in order
//! (`ggml_flash_attn_ext_reduce_partials`); the result depends on the thread count, so this
//! kernel does the same with its own thread count (the reference's `-t` when they match).
//!
//! All the query rows one thread owns walk the KV positions together, position by position:
//! the K (and V) rows of every KV head at one position are one cache row (2 KiB for 8 heads of
//! 128), read once and in order, where walking one head after another would stride over the
//! whole cache once per head (a decode step's attention at 1792 positions, 16 layers of 16
//! heads: 15.5 -> 10.6 ms on one thread). Each row's operations and their order are unchanged.
//!
//! The cost is proportional to the KV positions the graph passes (`n_kv`), never to the cache.

use super::expf_libm::expf;
use super::f16vec::{
    dot_f16_portable, f16_row_to_f32, f32_row_to_f16, mad_f16_portable, scale_f16_portable,
    use_avx2,
};

// The AVX2 primitives, callable from `row_impl::<true>` (compiled with the same features); on
// other targets the SIMD variant is never chosen.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn simd_dots<const G: usize>(x: &[u16], ys: [&[f32]; G]) -> [f32; G] {
    // SAFETY: only reached from row_avx2, after feature detection.
    unsafe { super::f16vec::dot_f16_wide_avx2(x, ys) }
}
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn simd_mad(y: &mut [u16], x: &[u16], v: f32) {
    // SAFETY: as simd_dots.
    unsafe { super::f16vec::mad_f16_avx2(y, x, v) }
}
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn simd_scale(y: &mut [u16], v: f32) {
    // SAFETY: as simd_dots.
    unsafe { super::f16vec::scale_f16_avx2(y, v) }
}
#[cfg(not(target_arch = "x86_64"))]
fn simd_dots<const G: usize>(_: &[u16], _: [&[f32]; G]) -> [f32; G] {
    unreachable!("the SIMD walk runs on x86-64 only")
}
#[cfg(not(target_arch = "x86_64"))]
fn simd_mad(_: &mut [u16], _: &[u16], _: f32) {
    unreachable!("the SIMD walk runs on x86-64 only")
}
#[cfg(not(target_arch = "x86_64"))]
fn simd_scale(y: &mut [u16], v: f32) {
    scale_f16_portable(y, v)
}
use super::{fp16_to_f32, KernelError};

mod tiled;
use tiled::Q_TILE;

/// tanhf correctly rounded, as the reference's C library (glibc >= 2.41, CORE-MATH) computes it.
#[inline]
pub fn tanhf(x: f32) -> f32 {
    (x as f64).tanh() as f32
}

/// Multiply-adds (rows × KV × (DK + DV)) below which a node runs on one thread.
const MIN_PARALLEL_WORK: usize = 1 << 20;

/// KV positions from which ggml splits one decode row over threads.
pub const SPLIT_KV_MIN: usize = 512;

/// A strided 4-D operand: base pointer of element 0 and byte strides (ggml's `nb`).
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    pub ptr: *const u8,
    pub ne: [usize; 4],
    pub nb: [usize; 4],
}

/// Everything one FLASH_ATTN_EXT node needs. `q` f32 [DK, n_q, n_head, ne3]; `k` f16 [DK, n_kv,
/// ..]; `v` f16 [DV, n_kv, ..]; `mask` f16 [>= n_kv, >= n_q, ..]; `sinks` f32 [n_head];
/// `out` f32 rows of DV, row `(i3·n_q + i1)·n_head + i2`, `out_row` bytes apart.
#[derive(Clone, Copy, Debug)]
pub struct FlashAttn {
    pub q: Operand,
    pub k: Operand,
    pub v: Operand,
    pub mask: Option<Operand>,
    pub sinks: Option<*const f32>,
    pub out: *mut u8,
    pub out_row: usize,
    pub scale: f32,
    pub max_bias: f32,
    pub softcap: f32,
    /// K and V are f32 (the tiled path only); f16 otherwise.
    pub kv_f32: bool,
}

// SAFETY: the pointers are only read (inputs) or written at disjoint rows (out) by the threads
// of one call; the caller guarantees they stay valid for the call.
unsafe impl Send for FlashAttn {}
unsafe impl Sync for FlashAttn {}

/// One KV chunk's work: (chunk index, [(head, its partial slot)]).
type ChunkJob<'a> = (usize, Vec<(usize, &'a mut [f32])>);

/// Per-thread scratch for one row.
struct Scratch {
    q16: Vec<u16>,
    /// `q16` widened back to f32 (exact), for the SIMD dots: K rows are the only operand
    /// converted per position.
    q32: Vec<f32>,
    vkq16: Vec<u16>,
    vkq32: Vec<f32>,
    /// slope · mask of the row at every KV position (filled by `walk_start` when there is a
    /// mask): converted once per walk, where each position would convert its value again.
    mask32: Vec<f32>,
}

impl Scratch {
    fn new(dk: usize, dv: usize) -> Self {
        Self {
            q16: vec![0; dk],
            q32: vec![0.0; dk],
            vkq16: vec![0; dv],
            vkq32: vec![0.0; dv],
            mask32: Vec::new(),
        }
    }
}

/// The state of a walk over KV positions for `G` query rows that share their K and V rows.
struct Walk<'s, const G: usize> {
    irs: [usize; G],
    sc: [&'s mut Scratch; G],
    /// The score scale, the softcap folded in (ggml: softcap · tanh(s · scale / softcap)).
    scale: f32,
    k_base: *const u8,
    v_base: *const u8,
    s_sum: [f32; G],
    m_max: [f32; G],
}

/// Positions ahead whose K and V rows a decode row prefetches.
const AHEAD: usize = 4;

/// Positions whose K dots a SIMD walk computes together.
const DOTS_AHEAD: usize = 8;

/// A hint to load `bytes` from `p` (a row of K or V, possibly past the end: never faults).
#[inline(always)]
fn prefetch_rows(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for off in (0..bytes).step_by(64) {
        // SAFETY: prefetching is a hint; it never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(off) as *const i8,
            )
        };
    }
}

impl FlashAttn {
    fn dk(&self) -> usize {
        self.k.ne[0]
    }
    fn dv(&self) -> usize {
        self.v.ne[0]
    }
    fn n_kv(&self) -> usize {
        self.k.ne[1]
    }
    fn n_rows(&self) -> usize {
        self.q.ne[1] * self.q.ne[2] * self.q.ne[3]
    }

    /// Sizes that must agree (extents against buffers are the caller's job).
    pub fn check(&self) -> Result<(), KernelError> {
        let [dk, n_q, n_head, n3] = self.q.ne;
        let bad = |why: &str| Err(KernelError::new(format!("flash_attn_ext: {why}")));
        if self.k.ne[0] != dk || self.v.ne[1] != self.k.ne[1] {
            return bad("K/V shapes do not match Q");
        }
        for kv in [&self.k, &self.v] {
            if kv.ne[2] == 0 || kv.ne[3] == 0 || n_head % kv.ne[2] != 0 || n3 % kv.ne[3] != 0 {
                return bad("K/V heads do not divide Q heads");
            }
        }
        if let Some(m) = &self.mask {
            if m.ne[0] < self.n_kv() || m.ne[1] < n_q || m.ne[2] == 0 || m.ne[3] == 0 {
                return bad("mask is smaller than KV × Q");
            }
            if n_head % m.ne[2] != 0 || n3 % m.ne[3] != 0 {
                return bad("mask heads do not divide Q heads");
            }
        }
        if self.kv_f32 && n_q < Q_TILE {
            return bad("f32 K/V are only supported from 64 query rows");
        }
        if self.out_row < self.dv() * 4 {
            return bad("output rows overlap");
        }
        Ok(())
    }

    fn slope(&self, h: usize) -> f32 {
        if self.max_bias <= 0.0 {
            return 1.0;
        }
        let n_head = self.q.ne[2] as u32;
        let n_head_log2 = 1u32 << (n_head as f64).log2().floor() as u32;
        let m0 = 2.0f32.powf(-self.max_bias / n_head_log2 as f32);
        let m1 = 2.0f32.powf(-(self.max_bias / 2.0) / n_head_log2 as f32);
        let h = h as u32;
        if h < n_head_log2 {
            m0.powf((h + 1) as f32)
        } else {
            m1.powf((2 * (h - n_head_log2) + 1) as f32)
        }
    }

    /// Online softmax of query rows `rows` over KV positions `c0..c1`, all rows position by
    /// position (the K and V rows of every KV head at a position are one cache row); rows
    /// that share their K and V rows walk in pairs (each K row converted once for both) when
    /// every consecutive pair does. Leaves row `i`'s f32 accumulator in `scratch[i].vkq32`
    /// and returns its (M, S); sinks are merged when `with_sinks`. Each row gets exactly
    /// ggml's operations for one row, in its order.
    ///
    /// # Safety
    /// The operands must be valid for the shapes and strides they describe; `scratch` holds
    /// one scratch per row.
    unsafe fn walk_rows(
        &self,
        rows: &[usize],
        c0: usize,
        c1: usize,
        with_sinks: bool,
        scratch: &mut [Scratch],
    ) -> Vec<(f32, f32)> {
        let paired =
            rows.len().is_multiple_of(2) && rows.chunks_exact(2).all(|r| self.share_kv(r[0], r[1]));
        // SAFETY (walk_start, walks_to_end): per this function's contract.
        if paired {
            let walks: Vec<Walk<'_, 2>> = rows
                .chunks_exact(2)
                .zip(scratch.chunks_exact_mut(2))
                .map(|(r, s)| {
                    let [a, b] = s else { unreachable!() };
                    unsafe { self.walk_start([r[0], r[1]], [a, b]) }
                })
                .collect();
            unsafe { self.walks_to_end(walks, c0, c1, with_sinks) }
        } else {
            let walks: Vec<Walk<'_, 1>> = rows
                .iter()
                .zip(scratch.iter_mut())
                .map(|(r, s)| unsafe { self.walk_start([*r], [s]) })
                .collect();
            unsafe { self.walks_to_end(walks, c0, c1, with_sinks) }
        }
    }

    /// `walks` over positions `c0..c1`, then finished: (M, S) per row, in order.
    ///
    /// # Safety
    /// As [`Self::walk_rows`].
    unsafe fn walks_to_end<const G: usize>(
        &self,
        mut walks: Vec<Walk<'_, G>>,
        c0: usize,
        c1: usize,
        with_sinks: bool,
    ) -> Vec<(f32, f32)> {
        // SAFETY: per this function's contract.
        unsafe { self.walks(&mut walks, c0, c1) };
        walks
            .into_iter()
            .flat_map(|w| unsafe { self.walk_finish(w, with_sinks) })
            .collect()
    }

    /// K and V bases of query row `ir` (its KV head).
    fn kv_bases(&self, ir: usize) -> (*const u8, *const u8) {
        let [_, n_q, n_head, n3] = self.q.ne;
        let iq3 = ir / (n_head * n_q);
        let iq2 = (ir - iq3 * n_head * n_q) / n_q;
        let (k, v) = (&self.k, &self.v);
        let at =
            |o: &Operand| (iq2 / (n_head / o.ne[2])) * o.nb[2] + (iq3 / (n3 / o.ne[3])) * o.nb[3];
        (k.ptr.wrapping_add(at(k)), v.ptr.wrapping_add(at(v)))
    }

    /// Whether query rows `a` and `b` read the same K and V rows (GQA heads, or two query
    /// positions of one head), so one walk over the KV positions can serve both.
    fn share_kv(&self, a: usize, b: usize) -> bool {
        self.kv_bases(a) == self.kv_bases(b)
    }

    /// Several walks over the same positions, position by position: at each position every
    /// walk takes its step, so the K and V rows of all KV heads (one cache row) are read
    /// together. Each walk's own operations and their order are those of a walk alone.
    #[inline(always)]
    unsafe fn walks_impl<const SIMD: bool, const G: usize>(
        &self,
        walks: &mut [Walk<'_, G>],
        c0: usize,
        c1: usize,
    ) {
        let mut ic = c0;
        #[cfg(target_arch = "x86_64")]
        if SIMD && self.dk().is_multiple_of(32) {
            // eight positions' K dots at a time, their reductions side by side (the dots do
            // not depend on the softmax state, so each keeps its value and place in the walk)
            // per walk: whether any of its rows sees one of the positions, and the dots
            let mut dots = vec![(false, [[0.0f32; DOTS_AHEAD]; G]); walks.len()];
            while ic + DOTS_AHEAD <= c1 {
                for (w, (live, d)) in walks.iter().zip(dots.iter_mut()) {
                    *live = (ic..ic + DOTS_AHEAD).any(|p| !self.all_masked(w, p));
                    if *live {
                        // SAFETY: per this function's contract; SIMD: features detected.
                        *d = unsafe { self.dots8(w, ic) };
                    }
                }
                for p in 0..DOTS_AHEAD {
                    for (w, (live, d)) in walks.iter_mut().zip(&dots) {
                        if *live {
                            let at: [f32; G] = std::array::from_fn(|g| d[g][p]);
                            // SAFETY: per this function's contract.
                            unsafe { self.walk_step::<SIMD, G>(w, ic + p, Some(at)) };
                        }
                    }
                }
                ic += DOTS_AHEAD;
            }
        }
        for ic in ic..c1 {
            for w in walks.iter_mut() {
                // SAFETY: per this function's contract.
                unsafe { self.walk_step::<SIMD, G>(w, ic, None) };
            }
        }
    }

    /// Whether every row of walk `w` is masked out (-inf) at position `ic`.
    #[inline(always)]
    fn all_masked<const G: usize>(&self, w: &Walk<'_, G>, ic: usize) -> bool {
        self.mask_values(w, ic)
            .iter()
            .all(|&m| m == f32::NEG_INFINITY)
    }

    /// slope · mask of each row of walk `w` at position `ic` (0 without a mask).
    #[inline(always)]
    fn mask_values<const G: usize>(&self, w: &Walk<'_, G>, ic: usize) -> [f32; G] {
        // with a mask, each row's values are in its scratch (walk_start)
        let masked = self.mask.is_some();
        std::array::from_fn(|g| if masked { w.sc[g].mask32[ic] } else { 0.0 })
    }

    /// The K dots of walk `w`'s rows at positions `ic..ic + 8` (`dk` a multiple of 32):
    /// `[row][position]`, each `dot_f16_wide_avx2`'s value.
    ///
    /// # Safety
    /// As [`Self::walk_rows`], `ic + 8 <= n_kv`, AVX2, FMA and F16C present.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn dots8<const G: usize>(&self, w: &Walk<'_, G>, ic: usize) -> [[f32; DOTS_AHEAD]; G] {
        use std::arch::x86_64::_mm256_storeu_ps;
        let q = std::array::from_fn(|g| w.sc[g].q32.as_ptr());
        let k = &self.k;
        // SAFETY: per this function's contract.
        let v = unsafe {
            super::dot_avx2::f16_wide_rows8::<G>(
                w.k_base.add(ic * k.nb[1]),
                k.nb[1],
                q,
                self.dk(),
                false,
            )
        };
        let mut out = [[0.0f32; DOTS_AHEAD]; G];
        for (o, v) in out.iter_mut().zip(v) {
            // SAFETY: eight floats.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), v) };
        }
        out
    }

    /// [`Self::walks_impl`] compiled for the detected ISA.
    ///
    /// # Safety
    /// As [`Self::walk_rows`], for each walk's rows.
    unsafe fn walks<const G: usize>(&self, walks: &mut [Walk<'_, G>], c0: usize, c1: usize) {
        #[cfg(target_arch = "x86_64")]
        if use_avx2() {
            // SAFETY: features detected; the rest per this function's contract.
            return unsafe { self.walks_avx2(walks, c0, c1) };
        }
        unsafe { self.walks_impl::<false, G>(walks, c0, c1) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn walks_avx2<const G: usize>(&self, walks: &mut [Walk<'_, G>], c0: usize, c1: usize) {
        unsafe { self.walks_impl::<true, G>(walks, c0, c1) }
    }

    /// A walk of rows `irs` (sharing their K and V rows) before its first position: q rows
    /// rounded to f16, accumulators cleared.
    ///
    /// # Safety
    /// As [`Self::walk_rows`].
    #[inline(always)]
    unsafe fn walk_start<'s, const G: usize>(
        &self,
        irs: [usize; G],
        mut sc: [&'s mut Scratch; G],
    ) -> Walk<'s, G> {
        let dk = self.dk();
        let q = &self.q;
        for (g, s) in sc.iter_mut().enumerate() {
            let (iq3, iq2, iq1) = self.head(irs[g]);
            // SAFETY (all raw reads below): in bounds per the caller's contract.
            let qrow = unsafe {
                std::slice::from_raw_parts(
                    q.ptr.add(iq1 * q.nb[1] + iq2 * q.nb[2] + iq3 * q.nb[3]) as *const f32,
                    dk,
                )
            };
            f32_row_to_f16(qrow, &mut s.q16);
            f16_row_to_f32(&s.q16, &mut s.q32);
            s.vkq16.fill(0);
            if let Some(m) = self.mask {
                let n_kv = self.n_kv();
                // SAFETY: the row lies inside the mask (the caller's contract).
                let at = unsafe {
                    m.ptr
                        .add(iq1 * m.nb[1] + (iq2 % m.ne[2]) * m.nb[2] + (iq3 % m.ne[3]) * m.nb[3])
                };
                s.mask32.resize(n_kv, 0.0);
                if (at as usize).is_multiple_of(2) {
                    // SAFETY: the mask row holds n_kv f16 values (the caller's contract), aligned.
                    let row = unsafe { std::slice::from_raw_parts(at as *const u16, n_kv) };
                    f16_row_to_f32(row, &mut s.mask32);
                } else {
                    for (i, v) in s.mask32.iter_mut().enumerate() {
                        // SAFETY: as above; read unaligned.
                        *v = fp16_to_f32(unsafe { (at.add(2 * i) as *const u16).read_unaligned() });
                    }
                }
                let slope = self.slope(iq2);
                s.mask32.iter_mut().for_each(|v| *v *= slope);
            }
        }
        let (k_base, v_base) = self.kv_bases(irs[0]);
        Walk {
            irs,
            scale: if self.softcap != 0.0 {
                self.scale / self.softcap
            } else {
                self.scale
            },
            k_base,
            v_base,
            s_sum: [0.0; G],
            m_max: [f32::NEG_INFINITY; G],
            sc,
        }
    }

    /// (i3, head, query position) of query row `ir`.
    fn head(&self, ir: usize) -> (usize, usize, usize) {
        let [_, n_q, n_head, _] = self.q.ne;
        let iq3 = ir / (n_head * n_q);
        let iq2 = (ir - iq3 * n_head * n_q) / n_q;
        (iq3, iq2, ir - iq3 * n_head * n_q - iq2 * n_q)
    }

    /// One KV position of a walk.
    ///
    /// # Safety
    /// As [`Self::walk_rows`]; `ic < n_kv`.
    #[inline(always)]
    unsafe fn walk_step<const SIMD: bool, const G: usize>(
        &self,
        w: &mut Walk<'_, G>,
        ic: usize,
        dots: Option<[f32; G]>,
    ) {
        let (dk, dv) = (self.dk(), self.dv());
        let (k, v) = (&self.k, &self.v);
        let mv = self.mask_values(w, ic);
        if mv.iter().all(|&m| m == f32::NEG_INFINITY) {
            return;
        }
        if SIMD {
            // the rows of a few positions ahead: K/V rows lie a cache row's stride apart,
            // a pattern the hardware prefetcher follows too late
            // (K rows whose dots came with the call were read a chunk earlier)
            let k_ahead = if dots.is_some() { DOTS_AHEAD } else { AHEAD };
            prefetch_rows(w.k_base.wrapping_add((ic + k_ahead) * k.nb[1]), dk * 2);
            prefetch_rows(w.v_base.wrapping_add((ic + AHEAD) * v.nb[1]), dv * 2);
        }
        // SAFETY (the raw reads): in bounds per the caller's contract.
        let krow =
            unsafe { std::slice::from_raw_parts(w.k_base.add(ic * k.nb[1]) as *const u16, dk) };
        let sc = &mut w.sc;
        let dots: [f32; G] = if let Some(dots) = dots {
            dots
        } else if SIMD {
            simd_dots(krow, std::array::from_fn(|g| &sc[g].q32[..]))
        } else {
            std::array::from_fn(|g| dot_f16_portable(krow, &sc[g].q16))
        };
        let vrow =
            unsafe { std::slice::from_raw_parts(w.v_base.add(ic * v.nb[1]) as *const u16, dv) };
        for g in 0..G {
            if mv[g] == f32::NEG_INFINITY {
                continue;
            }
            let mut s = dots[g] * w.scale;
            if self.softcap != 0.0 {
                s = self.softcap * tanhf(s);
            }
            s += mv[g];
            let m_old = w.m_max[g];
            let mut ms = 1.0f32;
            let mut vs = 1.0f32;
            if s > w.m_max[g] {
                w.m_max[g] = s;
                ms = if SIMD {
                    expf(m_old - s)
                } else {
                    (m_old - s).exp()
                };
                if SIMD {
                    simd_scale(&mut sc[g].vkq16, ms);
                } else {
                    scale_f16_portable(&mut sc[g].vkq16, ms);
                }
            } else {
                vs = if SIMD {
                    expf(s - w.m_max[g])
                } else {
                    (s - w.m_max[g]).exp()
                };
            }
            if SIMD {
                simd_mad(&mut sc[g].vkq16, vrow, vs);
            } else {
                mad_f16_portable(&mut sc[g].vkq16, vrow, vs);
            }
            w.s_sum[g] = w.s_sum[g].mul_add(ms, vs);
        }
    }

    /// The end of a walk: accumulators widened to f32 in `vkq32`, sinks merged when
    /// `with_sinks`; (M, S) per row.
    ///
    /// # Safety
    /// As [`Self::walk_rows`].
    unsafe fn walk_finish<const G: usize>(
        &self,
        w: Walk<'_, G>,
        with_sinks: bool,
    ) -> [(f32, f32); G] {
        let Walk {
            irs,
            mut sc,
            m_max,
            s_sum,
            ..
        } = w;
        std::array::from_fn(|g| {
            let s = &mut sc[g];
            for (o, h) in s.vkq32.iter_mut().zip(&s.vkq16) {
                *o = fp16_to_f32(*h);
            }
            let (mut m_max, mut s_sum) = (m_max[g], s_sum[g]);
            if let (Some(sinks), true) = (self.sinks, with_sinks) {
                // SAFETY: sinks holds one value per head, per the caller's contract.
                let sv = unsafe { sinks.add(self.head(irs[g]).1).read_unaligned() };
                let mut ms = 1.0f32;
                let mut vs = 1.0f32;
                if sv > m_max {
                    ms = (m_max - sv).exp();
                    m_max = sv;
                    s.vkq32.iter_mut().for_each(|x| *x *= ms);
                } else {
                    vs = (sv - m_max).exp();
                }
                s_sum = s_sum.mul_add(ms, vs);
            }
            (m_max, s_sum)
        })
    }

    /// # Safety
    /// Output row `r` must be valid for DV float32 writes and no other thread writes it.
    unsafe fn write_row(&self, r: usize, vals: &[f32], s: f32) {
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        let out = unsafe {
            std::slice::from_raw_parts_mut(self.out.add(r * self.out_row) as *mut f32, vals.len())
        };
        for (o, v) in out.iter_mut().zip(vals) {
            *o = v * inv;
        }
    }

    /// Destination row of query row `ir` (dst is q permuted (0, 2, 1, 3)).
    fn out_index(&self, ir: usize) -> usize {
        let [_, n_q, n_head, _] = self.q.ne;
        let iq3 = ir / (n_head * n_q);
        let iq2 = (ir - iq3 * n_head * n_q) / n_q;
        let iq1 = ir - iq3 * n_head * n_q - iq2 * n_q;
        (iq3 * n_q + iq1) * n_head + iq2
    }

    /// Threads worth starting: the split of the work (and so the numerics) follows `threads`,
    /// but a small node runs on the calling thread (starting threads costs ~50-200 µs).
    fn workers(&self, threads: usize) -> usize {
        let work = self.n_rows() * self.n_kv() * (self.dk() + self.dv());
        if work < MIN_PARALLEL_WORK {
            1
        } else {
            threads
        }
    }

    fn split_kv(&self, threads: usize) -> bool {
        threads > 1 && self.q.ne[1] == 1 && self.q.ne[3] == 1 && self.n_kv() >= SPLIT_KV_MIN
    }

    /// Run the whole node on up to `threads` threads.
    ///
    /// # Safety
    /// Every operand must be valid for its shape and strides for the duration of the call, the
    /// output must not overlap the inputs, and `check()` must have passed.
    pub unsafe fn run(&self, threads: usize) {
        let threads = threads.max(1);
        if self.q.ne[1] >= Q_TILE {
            return unsafe { self.run_tiled(threads) };
        }
        if self.split_kv(threads) {
            return unsafe { self.run_split(threads) };
        }
        let nr = self.n_rows();
        let (dk, dv, n_kv) = (self.dk(), self.dv(), self.n_kv());
        let work = |r0: usize, r1: usize| {
            let rows: Vec<usize> = (r0..r1).collect();
            let mut scratch: Vec<Scratch> = rows.iter().map(|_| Scratch::new(dk, dv)).collect();
            // SAFETY: per this function's contract; rows are disjoint between threads.
            unsafe {
                let results = self.walk_rows(&rows, 0, n_kv, true, &mut scratch);
                for ((ir, sc), (_, s)) in rows.iter().zip(&scratch).zip(results) {
                    self.write_row(self.out_index(*ir), &sc.vkq32, s);
                }
            }
        };
        let threads = self.workers(threads).min(nr).max(1);
        if threads == 1 {
            work(0, nr);
            return;
        }
        let per = nr.div_ceil(threads);
        super::pool::run(threads, threads, &|t| {
            let (r0, r1) = (t * per, ((t + 1) * per).min(nr));
            if r0 < r1 {
                work(r0, r1);
            }
        });
    }

    /// ggml's split-KV decode path: KV chunk `t` of `ceil(n_kv / threads)` positions per thread,
    /// partials (M, S, VKQ) merged chunk by chunk in order.
    unsafe fn run_split(&self, threads: usize) {
        let (dk, dv, n_kv) = (self.dk(), self.dv(), self.n_kv());
        let n_head = self.q.ne[2];
        let chunk = n_kv.div_ceil(threads);
        let stride = 2 + dv;
        // partials[(head * threads + chunk) * stride ..]: M, S, VKQ
        let mut partials = vec![0.0f32; n_head * threads * stride];
        let fill = |t: usize, mine: &mut [(usize, &mut [f32])]| {
            let (c0, c1) = (t * chunk, ((t + 1) * chunk).min(n_kv));
            if c0 >= n_kv {
                for (_, p) in mine.iter_mut() {
                    p[0] = f32::NEG_INFINITY;
                    p[1] = 0.0;
                }
                return;
            }
            let heads: Vec<usize> = mine.iter().map(|(h, _)| *h).collect();
            let mut scratch: Vec<Scratch> = heads.iter().map(|_| Scratch::new(dk, dv)).collect();
            // SAFETY: per run()'s contract.
            let results = unsafe { self.walk_rows(&heads, c0, c1, c0 == 0, &mut scratch) };
            for (((_, p), sc), (m, s)) in mine.iter_mut().zip(&scratch).zip(results) {
                p[0] = m;
                p[1] = s;
                p[2..].copy_from_slice(&sc.vkq32);
            }
        };
        {
            // partials grouped by KV chunk; chunk t runs on worker t % workers
            let mut by_chunk: Vec<Vec<(usize, &mut [f32])>> =
                (0..threads).map(|_| Vec::new()).collect();
            for (i, p) in partials.chunks_exact_mut(stride).enumerate() {
                by_chunk[i % threads].push((i / threads, p));
            }
            let workers = self.workers(threads);
            if workers == 1 {
                for (t, mut mine) in by_chunk.into_iter().enumerate() {
                    fill(t, &mut mine);
                }
            } else {
                let mut per_worker: Vec<Vec<ChunkJob<'_>>> =
                    (0..workers).map(|_| Vec::new()).collect();
                for (t, mine) in by_chunk.into_iter().enumerate() {
                    per_worker[t % workers].push((t, mine));
                }
                super::pool::for_each(workers, per_worker, |_, jobs| {
                    for (t, mut mine) in jobs {
                        fill(t, &mut mine);
                    }
                });
            }
        }
        let mut acc = vec![0.0f32; dv];
        for h in 0..n_head {
            let mut m_fin = f32::NEG_INFINITY;
            let mut s_fin = 0.0f32;
            acc.fill(0.0);
            for t in 0..threads {
                if t * chunk >= n_kv {
                    continue;
                }
                let p = &partials[(h * threads + t) * stride..][..stride];
                let (m_c, s_c) = (p[0], p[1]);
                if s_c == 0.0 {
                    continue;
                }
                let m_new = m_fin.max(m_c);
                let scale_old = (m_fin - m_new).exp();
                let scale_new = (m_c - m_new).exp();
                for (a, c) in acc.iter_mut().zip(&p[2..]) {
                    *a = a.mul_add(scale_old, c * scale_new);
                }
                s_fin = s_fin.mul_add(scale_old, s_c * scale_new);
                m_fin = m_new;
            }
            if s_fin != 0.0 {
                let inv = 1.0 / s_fin;
                acc.iter_mut().for_each(|a| *a *= inv);
            }
            // SAFETY: per run()'s contract (row h of the single query).
            let out = unsafe {
                std::slice::from_raw_parts_mut(self.out.add(h * self.out_row) as *mut f32, dv)
            };
            out.copy_from_slice(&acc);
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::super::f32_to_fp16;
    use super::super::test_util::noise;
    use super::*;

    fn f16s(seed: u64, len: usize, scale: f32) -> Vec<u16> {
        noise(seed, len)
            .iter()
            .map(|x| f32_to_fp16(x * scale))
            .collect()
    }

    /// Query rows walked together (GQA pairs on the AVX2 walk, or single rows), their K and
    /// V rows interleaved as in a KV cache, give the bits of each row walked alone on the
    /// portable path: running max, sum and the f16-rounded V sums; with a mask (holes), a
    /// softcap and a sink.
    #[test]
    fn walks_together_give_the_portable_bits() {
        if !use_avx2() {
            return;
        }
        for (dk, dv, n_kv, softcap) in [(64, 64, 300, 0.0), (128, 128, 77, 20.0), (96, 32, 40, 0.0)]
        {
            let (n_head, n_head_kv) = (6, 3);
            let q = noise(dk as u64, dk * n_head);
            // cache rows: position-major, the KV heads of one position side by side
            let k = f16s(3, dk * n_kv * n_head_kv, 1.5);
            let v = f16s(5, dv * n_kv * n_head_kv, 1.0);
            let mask: Vec<u16> = (0..n_kv)
                .map(|i| {
                    // scattered masked positions, and a masked end (a decode step's
                    // padding: whole eights of positions no row sees)
                    if i % 7 == 3 || i + 21 >= n_kv {
                        0xfc00
                    } else {
                        f32_to_fp16(0.25 * (i % 3) as f32)
                    }
                })
                .collect();
            let sinks = noise(11, n_head);
            let mut out = vec![0.0f32; dv * n_head];
            let cache = |p: *const u8, d: usize| Operand {
                ptr: p,
                ne: [d, n_kv, n_head_kv, 1],
                nb: [2, d * 2 * n_head_kv, d * 2, 0],
            };
            let fa = FlashAttn {
                q: Operand {
                    ptr: q.as_ptr() as *const u8,
                    ne: [dk, 1, n_head, 1],
                    nb: [4, dk * 4, dk * 4, 0],
                },
                k: cache(k.as_ptr() as *const u8, dk),
                v: cache(v.as_ptr() as *const u8, dv),
                mask: Some(Operand {
                    ptr: mask.as_ptr() as *const u8,
                    ne: [n_kv, 1, 1, 1],
                    nb: [2, 2 * n_kv, 2 * n_kv, 2 * n_kv],
                }),
                sinks: Some(sinks.as_ptr()),
                out: out.as_mut_ptr() as *mut u8,
                out_row: dv * 4,
                scale: 1.0 / (dk as f32).sqrt(),
                max_bias: 0.0,
                softcap,
                kv_f32: false,
            };
            let bits = |r: (f32, f32), s: &Scratch| {
                let mut b = vec![r.0.to_bits(), r.1.to_bits()];
                b.extend(s.vkq32.iter().map(|x| x.to_bits()));
                b
            };
            // all six rows (three GQA pairs), and three rows (odd: single walks)
            for rows in [&[0, 1, 2, 3, 4, 5][..], &[1, 2, 5][..]] {
                let mut fast_sc: Vec<Scratch> = rows.iter().map(|_| Scratch::new(dk, dv)).collect();
                // SAFETY: every pointer spans its operand.
                let fast = unsafe { fa.walk_rows(rows, 0, n_kv, true, &mut fast_sc) };
                for (i, &ir) in rows.iter().enumerate() {
                    let mut sc = Scratch::new(dk, dv);
                    // SAFETY: as above.
                    let slow = unsafe {
                        let mut walk = [fa.walk_start([ir], [&mut sc])];
                        fa.walks_impl::<false, 1>(&mut walk, 0, n_kv);
                        let [w] = walk;
                        fa.walk_finish(w, true)[0]
                    };
                    assert_eq!(
                        bits(fast[i], &fast_sc[i]),
                        bits(slow, &sc),
                        "dk {dk} rows {rows:?} row {ir}"
                    );
                }
            }
        }
    }
}
