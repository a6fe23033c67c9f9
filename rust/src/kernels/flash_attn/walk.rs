//! The decode path of FLASH_ATTN_EXT: query rows walk the KV positions together with ggml's
//! online softmax, one row's operations in its order.

use super::params::{tanhf, FlashAttn};
use crate::kernels::blocks::half::fp16_to_f32;
use crate::kernels::cpu::use_avx2;
use crate::kernels::expf_libm::expf;
use crate::kernels::f16vec::{
    dot_f16_portable, f16_row_to_f32, f32_row_to_f16, mad_f16_portable, scale_f16_portable,
};
use crate::kernels::operand::Operand;

// The AVX2 primitives, callable from `row_impl::<true>` (compiled with the same features); on
// other targets the SIMD variant is never chosen.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn simd_dots<const G: usize>(x: &[u16], ys: [&[f32]; G]) -> [f32; G] {
    // SAFETY: only reached from row_avx2, after feature detection.
    unsafe { crate::kernels::f16vec::dot_f16_wide_avx2(x, ys) }
}
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn simd_mad(y: &mut [u16], x: &[u16], v: f32) {
    // SAFETY: as simd_dots.
    unsafe { crate::kernels::f16vec::mad_f16_avx2(y, x, v) }
}
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn simd_scale(y: &mut [u16], v: f32) {
    // SAFETY: as simd_dots.
    unsafe { crate::kernels::f16vec::scale_f16_avx2(y, v) }
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

/// Per-thread scratch for one row.
pub(super) struct Scratch {
    q16: Vec<u16>,
    /// `q16` widened back to f32 (exact), for the SIMD dots: K rows are the only operand
    /// converted per position.
    q32: Vec<f32>,
    vkq16: Vec<u16>,
    pub(super) vkq32: Vec<f32>,
    /// slope · mask of the row at every KV position (filled by `walk_start` when there is a
    /// mask): converted once per walk, where each position would convert its value again.
    mask32: Vec<f32>,
}

impl Scratch {
    pub(super) fn new(dk: usize, dv: usize) -> Self {
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
pub(super) struct Walk<'s, const G: usize> {
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
    pub(super) unsafe fn walk_rows(
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
    pub(super) unsafe fn walks_to_end<const G: usize>(
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
    pub(super) fn kv_bases(&self, ir: usize) -> (*const u8, *const u8) {
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
    pub(super) fn share_kv(&self, a: usize, b: usize) -> bool {
        self.kv_bases(a) == self.kv_bases(b)
    }

    /// Several walks over the same positions, position by position: at each position every
    /// walk takes its step, so the K and V rows of all KV heads (one cache row) are read
    /// together. Each walk's own operations and their order are those of a walk alone.
    #[inline(always)]
    pub(super) unsafe fn walks_impl<const SIMD: bool, const G: usize>(
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
    pub(super) fn all_masked<const G: usize>(&self, w: &Walk<'_, G>, ic: usize) -> bool {
        self.mask_values(w, ic)
            .iter()
            .all(|&m| m == f32::NEG_INFINITY)
    }

    /// slope · mask of each row of walk `w` at position `ic` (0 without a mask).
    #[inline(always)]
    pub(super) fn mask_values<const G: usize>(&self, w: &Walk<'_, G>, ic: usize) -> [f32; G] {
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
    pub(super) unsafe fn dots8<const G: usize>(
        &self,
        w: &Walk<'_, G>,
        ic: usize,
    ) -> [[f32; DOTS_AHEAD]; G] {
        use std::arch::x86_64::_mm256_storeu_ps;
        let q = std::array::from_fn(|g| w.sc[g].q32.as_ptr());
        let k = &self.k;
        // SAFETY: per this function's contract.
        let v = unsafe {
            crate::kernels::dot::avx2::f16_wide_rows8::<G>(
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
    pub(super) unsafe fn walks<const G: usize>(
        &self,
        walks: &mut [Walk<'_, G>],
        c0: usize,
        c1: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        if use_avx2() {
            // SAFETY: features detected; the rest per this function's contract.
            return unsafe { self.walks_avx2(walks, c0, c1) };
        }
        unsafe { self.walks_impl::<false, G>(walks, c0, c1) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn walks_avx2<const G: usize>(
        &self,
        walks: &mut [Walk<'_, G>],
        c0: usize,
        c1: usize,
    ) {
        unsafe { self.walks_impl::<true, G>(walks, c0, c1) }
    }

    /// A walk of rows `irs` (sharing their K and V rows) before its first position: q rows
    /// rounded to f16, accumulators cleared.
    ///
    /// # Safety
    /// As [`Self::walk_rows`].
    #[inline(always)]
    pub(super) unsafe fn walk_start<'s, const G: usize>(
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

    /// One KV position of a walk.
    ///
    /// # Safety
    /// As [`Self::walk_rows`]; `ic < n_kv`.
    #[inline(always)]
    pub(super) unsafe fn walk_step<const SIMD: bool, const G: usize>(
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
    pub(super) unsafe fn walk_finish<const G: usize>(
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
}
