//! FLASH_ATTN_EXT for prompts (>= [`Q_TILE`] query rows), computed like ggml's CPU backend
//! (`ggml_compute_forward_flash_attn_ext_tiled`), K and V f16 or f32:
//!
//! * Q stays f32; K is widened to f32 and transposed a [`KV_TILE`] of positions at a time;
//! * `KQ = Q·Kᵀ`, each score one fused multiply-add chain over DK in order (ggml's
//!   `simd_gemm` keeps one accumulator lane per output, so the blocking does not change bits);
//!   `·scale`, softcap (`tanhf`, `·softcap`), `+ slope·mask`;
//! * per row and tile: the tile's maximum; on a new maximum the f32 accumulator and the sum are
//!   scaled by `expf(M_old − M)`; `P = v_expf(KQ − M)` with the sum of ggml's
//!   `ggml_vec_soft_max_f32` added in double; rows whose tile is all −inf are left alone;
//! * `VKQ += P·V` (again one FMA chain per output over the tile's positions), sinks merged at
//!   the end, `· 1/S`.
//!
//! Every query row's numbers depend only on its own scores and the 64-aligned KV tiles, so the
//! rows can be grouped freely: one task is a block of query rows of every head that shares a
//! K/V head (GQA), so each K/V tile is widened once for all of them. Tiles whose mask is −inf
//! for every row of the task are skipped, as ggml skips them (the causal half of a prompt).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::params::FlashAttn;
use crate::kernels::cpu::use_avx2;
use crate::kernels::f16vec::f16_row_to_f32;
use crate::kernels::mathf::tanhf;
use crate::kernels::operand::Operand;
use crate::kernels::pool;
use crate::kernels::rowops::soft_max_row;
/// ggml's `GGML_FA_TILE_KV`: KV positions per tile (the online softmax steps by tiles).
pub const KV_TILE: usize = 64;
/// Query rows per head in one task.
const Q_BLOCK: usize = 64;

/// One task's buffers, reused across its tiles.
struct Scratch {
    q: Vec<f32>,
    kt: Vec<f32>,
    kq: Vec<f32>,
    mask: Vec<f32>,
    p: Vec<f32>,
    v: Vec<f32>,
    vkq: Vec<f32>,
    m: Vec<f32>,
    s: Vec<f32>,
    wide: Vec<f32>,
}

impl Scratch {
    fn new(rows: usize, dk: usize, dv: usize) -> Self {
        Self {
            q: vec![0.0; rows * dk],
            kt: vec![0.0; dk * KV_TILE],
            kq: vec![0.0; rows * KV_TILE],
            mask: vec![0.0; rows * KV_TILE],
            p: vec![0.0; rows * KV_TILE],
            v: vec![0.0; KV_TILE * dv],
            vkq: vec![0.0; rows * dv],
            m: vec![0.0; rows],
            s: vec![0.0; rows],
            wide: vec![0.0; dk.max(dv)],
        }
    }
}

/// Which query rows a task covers.
#[derive(Clone, Copy)]
struct Task {
    i3: usize,
    head0: usize,
    heads: usize,
    q0: usize,
    nq: usize,
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl FlashAttn {
    /// Heads that read the same K head and the same V head.
    fn head_group(&self) -> usize {
        let n_head = self.q.ne[2];
        gcd(n_head / self.k.ne[2], n_head / self.v.ne[2]).max(1)
    }

    fn tasks(&self) -> Vec<Task> {
        let [_, n_q, n_head, n3] = self.q.ne;
        let heads = self.head_group();
        let mut tasks = Vec::new();
        // the last query blocks (longest causal range) first, so the threads finish together
        for q0 in (0..n_q).step_by(Q_BLOCK).rev() {
            for i3 in 0..n3 {
                for head0 in (0..n_head).step_by(heads) {
                    let nq = Q_BLOCK.min(n_q - q0);
                    tasks.push(Task {
                        i3,
                        head0,
                        heads,
                        q0,
                        nq,
                    });
                }
            }
        }
        tasks
    }

    /// Bytes of K or V row `pos` of the head used by query head `h` at sequence `i3`.
    ///
    /// # Safety
    /// In bounds per [`Self::run`]'s contract.
    unsafe fn kv_row(&self, t: &Operand, h: usize, i3: usize, pos: usize) -> *const u8 {
        let [_, _, n_head, n3] = self.q.ne;
        unsafe {
            t.ptr.add(
                pos * t.nb[1]
                    + (h / (n_head / t.ne[2])) * t.nb[2]
                    + (i3 / (n3 / t.ne[3])) * t.nb[3],
            )
        }
    }

    /// One K or V row widened to f32 into `out` (`n` values).
    ///
    /// # Safety
    /// `src` readable for `n` elements of the K/V type.
    unsafe fn widen(&self, src: *const u8, out: &mut [f32]) {
        let n = out.len();
        if self.kv_f32 {
            unsafe { std::ptr::copy_nonoverlapping(src as *const f32, out.as_mut_ptr(), n) };
        } else {
            let row = unsafe { std::slice::from_raw_parts(src as *const u16, n) };
            f16_row_to_f32(row, out);
        }
    }

    /// The tiled path over every query row, on up to `threads` threads.
    ///
    /// # Safety
    /// As [`Self::run`].
    pub(super) unsafe fn run_tiled(&self, threads: usize) {
        let tasks = self.tasks();
        let rows = self.head_group() * Q_BLOCK;
        let (dk, dv) = (self.dk(), self.dv());
        let threads = self.workers(threads).min(tasks.len()).max(1);
        let next = AtomicUsize::new(0);
        pool::run(threads, threads, &|_| {
            let mut sc = Scratch::new(rows, dk, dv);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(task) = tasks.get(i) else { break };
                // SAFETY: per this function's contract; tasks write disjoint output rows.
                unsafe { self.tile_task(task, &mut sc) };
            }
        });
    }

    /// # Safety
    /// As [`Self::run`]; no other thread writes this task's output rows.
    unsafe fn tile_task(&self, t: &Task, sc: &mut Scratch) {
        let (dk, dv, n_kv) = (self.dk(), self.dv(), self.n_kv());
        let rows = t.heads * t.nq;
        // row r: head t.head0 + r / nq, query t.q0 + r % nq
        let head_of = |r: usize| t.head0 + r / t.nq;
        let query_of = |r: usize| t.q0 + r % t.nq;
        let q = &self.q;
        for r in 0..rows {
            let src = unsafe {
                q.ptr
                    .add(query_of(r) * q.nb[1] + head_of(r) * q.nb[2] + t.i3 * q.nb[3])
                    as *const f32
            };
            unsafe { std::ptr::copy_nonoverlapping(src, sc.q[r * dk..].as_mut_ptr(), dk) };
        }
        sc.m[..rows].fill(f32::NEG_INFINITY);
        sc.s[..rows].fill(0.0);
        sc.vkq[..rows * dv].fill(0.0);
        let scale = if self.softcap != 0.0 {
            self.scale / self.softcap
        } else {
            self.scale
        };
        // Mask rows converted once per tile: task rows of different heads share one when the
        // mask has a single head and every slope is 1 (no ALiBi), the usual case.
        let slopes: Vec<f32> = (0..t.heads).map(|j| self.slope(t.head0 + j)).collect();
        let shared_mask =
            self.mask.is_some_and(|m| m.ne[2] == 1) && slopes.iter().all(|&x| x == 1.0);
        let mask_count = if shared_mask { t.nq } else { rows };
        let mask_rows: Vec<*const u16> = match &self.mask {
            Some(m) => (0..mask_count)
                .map(|r| unsafe {
                    m.ptr.add(
                        query_of(r) * m.nb[1]
                            + (head_of(r) % m.ne[2]) * m.nb[2]
                            + (t.i3 % m.ne[3]) * m.nb[3],
                    ) as *const u16
                })
                .collect(),
            None => Vec::new(),
        };
        for ic in (0..n_kv).step_by(KV_TILE) {
            let kv = KV_TILE.min(n_kv - ic);
            if !mask_rows.is_empty() {
                let mut all_masked = true;
                for (r, &mrow) in mask_rows.iter().enumerate() {
                    let out = &mut sc.mask[r * KV_TILE..][..KV_TILE];
                    let src = unsafe { std::slice::from_raw_parts(mrow.add(ic), kv) };
                    f16_row_to_f32(src, &mut out[..kv]);
                    out[kv..].fill(f32::NEG_INFINITY);
                    let slope = slopes[(r / t.nq).min(t.heads - 1)];
                    if slope != 1.0 {
                        out[..kv].iter_mut().for_each(|x| *x *= slope);
                    }
                    all_masked &= out[..kv].iter().all(|&x| x == f32::NEG_INFINITY);
                }
                if all_masked {
                    continue;
                }
            }
            // Kᵀ: kt[d * KV_TILE + tk]
            for tk in 0..kv {
                let src = unsafe { self.kv_row(&self.k, t.head0, t.i3, ic + tk) };
                unsafe { self.widen(src, &mut sc.wide[..dk]) };
                for (d, &x) in sc.wide[..dk].iter().enumerate() {
                    sc.kt[d * KV_TILE + tk] = x;
                }
            }
            let kq = &mut sc.kq[..rows * KV_TILE];
            kq.fill(0.0);
            gemm_acc(kq, &sc.q[..rows * dk], dk, &sc.kt, rows, dk, KV_TILE);
            if self.softcap != 0.0 {
                for x in kq.iter_mut() {
                    *x = tanhf(*x * scale) * self.softcap;
                }
            }
            // softmax over whole 8-lane chunks (ggml's vector expf; the pads give 0)
            let width = kv.next_multiple_of(8);
            for r in 0..rows {
                let row = &mut kq[r * KV_TILE..][..KV_TILE];
                let mask = if mask_rows.is_empty() {
                    None
                } else {
                    let mr = if shared_mask { r % t.nq } else { r };
                    Some(&sc.mask[mr * KV_TILE..][..KV_TILE])
                };
                // the softcap path was scaled above
                let row_scale = if self.softcap != 0.0 { 1.0 } else { scale };
                let tile_max = scale_mask_max(&mut row[..width], mask, row_scale, kv);
                let p_row = &mut sc.p[r * KV_TILE..][..KV_TILE];
                if tile_max == f32::NEG_INFINITY {
                    p_row[..kv].fill(0.0); // no weight from this tile
                    continue;
                }
                let m_old = sc.m[r];
                let m_new = m_old.max(tile_max);
                if m_new > m_old {
                    let ms = (m_old - m_new).exp();
                    for x in &mut sc.vkq[r * dv..][..dv] {
                        *x *= ms;
                    }
                    sc.s[r] *= ms;
                }
                sc.m[r] = m_new;
                let sum = soft_max_row(&row[..width], &mut p_row[..width], m_new);
                sc.s[r] = (f64::from(sc.s[r]) + sum) as f32;
            }
            for tk in 0..kv {
                let src = unsafe { self.kv_row(&self.v, t.head0, t.i3, ic + tk) };
                unsafe { self.widen(src, &mut sc.v[tk * dv..][..dv]) };
            }
            // P·V over the tile's positions
            let vkq = &mut sc.vkq[..rows * dv];
            gemm_acc(
                vkq,
                &sc.p[..rows * KV_TILE],
                KV_TILE,
                &sc.v[..kv * dv],
                rows,
                kv,
                dv,
            );
        }
        for r in 0..rows {
            let vkq = &mut sc.vkq[r * dv..][..dv];
            let mut s_sum = sc.s[r];
            if let Some(sinks) = self.sinks {
                let s = unsafe { sinks.add(head_of(r)).read_unaligned() };
                let m = sc.m[r];
                let mut ms = 1.0f32;
                let mut vs = 1.0f32;
                if s > m {
                    ms = (m - s).exp();
                    vkq.iter_mut().for_each(|x| *x *= ms);
                } else {
                    vs = (s - m).exp();
                }
                s_sum = s_sum.mul_add(ms, vs);
            }
            // SAFETY: the task's own rows (per this function's contract).
            unsafe { self.write_row(self.out_index(self.row_index(t, r)), vkq, s_sum) };
        }
    }

    /// `ir` (ggml's flattened query row: `(i3·n_head + head)·n_q + query`) of task row `r`.
    fn row_index(&self, t: &Task, r: usize) -> usize {
        let [_, n_q, n_head, _] = self.q.ne;
        (t.i3 * n_head + t.head0 + r / t.nq) * n_q + t.q0 + r % t.nq
    }
}

/// `c[m×n] += a[m×k] · b[k×n]` (row-major; `a`'s rows `lda` apart, `b` and `c` dense), each
/// output one fused multiply-add chain over `k` in order — ggml's `simd_gemm` numbers whatever
/// the blocking.
pub fn gemm_acc(c: &mut [f32], a: &[f32], lda: usize, b: &[f32], m: usize, k: usize, n: usize) {
    assert!(lda >= k && c.len() >= m * n && b.len() >= k * n);
    assert!(m == 0 || a.len() >= (m - 1) * lda + k);
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: features detected; sizes asserted above.
        return unsafe { avx2::gemm_acc(c.as_mut_ptr(), a.as_ptr(), lda, b.as_ptr(), m, k, n) };
    }
    gemm_acc_portable(c, a, lda, b, m, k, n);
}

pub fn gemm_acc_portable(
    c: &mut [f32],
    a: &[f32],
    lda: usize,
    b: &[f32],
    m: usize,
    k: usize,
    n: usize,
) {
    for i in 0..m {
        for j in 0..n {
            let mut acc = c[i * n + j];
            for kk in 0..k {
                acc = a[i * lda + kk].mul_add(b[kk * n + j], acc);
            }
            c[i * n + j] = acc;
        }
    }
}

/// One score row of a tile (a multiple of 8 wide): `x·scale`, −inf past `kv`, `+ mask`; returns
/// the maximum. The same float operations as ggml's separate passes.
fn scale_mask_max(row: &mut [f32], mask: Option<&[f32]>, scale: f32, kv: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: features detected.
        return unsafe { avx2::scale_mask_max(row, mask, scale, kv) };
    }
    scale_mask_max_portable(row, mask, scale, kv)
}

fn scale_mask_max_portable(row: &mut [f32], mask: Option<&[f32]>, scale: f32, kv: usize) -> f32 {
    let mut max = f32::NEG_INFINITY;
    for (j, x) in row.iter_mut().enumerate() {
        let mut y = if j < kv {
            *x * scale
        } else {
            f32::NEG_INFINITY
        };
        if let Some(m) = mask {
            y += m[j];
        }
        *x = y;
        max = max.max(y);
    }
    max
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Rows per micro-tile and 8-float vectors per micro-tile row (12 accumulators).
    const RM: usize = 6;
    const RN: usize = 2;

    /// Rows of C (`n` floats apart, from `c`) += the same rows of A (`lda` apart, `k` values
    /// each, from `a`) · B (`k × n`, from `b`).
    #[derive(Clone, Copy)]
    struct Rows {
        c: *mut f32,
        a: *const f32,
        lda: usize,
        b: *const f32,
        k: usize,
        n: usize,
    }

    impl Rows {
        /// The rows after the first `i`.
        #[inline(always)]
        unsafe fn skip_rows(self, i: usize) -> Self {
            unsafe {
                Self {
                    c: self.c.add(i * self.n),
                    a: self.a.add(i * self.lda),
                    ..self
                }
            }
        }

        /// The columns after the first `j`.
        #[inline(always)]
        unsafe fn skip_cols(self, j: usize) -> Self {
            unsafe {
                Self {
                    c: self.c.add(j),
                    b: self.b.add(j),
                    ..self
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn tile<const R: usize, const V: usize>(t: Rows) {
        let (c, a, lda, b, k, n) = (t.c, t.a, t.lda, t.b, t.k, t.n);
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); V]; R];
            for (i, row) in acc.iter_mut().enumerate() {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm256_loadu_ps(c.add(i * n + v * 8));
                }
            }
            for kk in 0..k {
                let mut bv = [_mm256_setzero_ps(); V];
                for (v, x) in bv.iter_mut().enumerate() {
                    *x = _mm256_loadu_ps(b.add(kk * n + v * 8));
                }
                for (i, row) in acc.iter_mut().enumerate() {
                    let p = _mm256_set1_ps(*a.add(i * lda + kk));
                    for (x, bb) in row.iter_mut().zip(&bv) {
                        *x = _mm256_fmadd_ps(*bb, p, *x);
                    }
                }
            }
            for (i, row) in acc.iter().enumerate() {
                for (v, x) in row.iter().enumerate() {
                    _mm256_storeu_ps(c.add(i * n + v * 8), *x);
                }
            }
        }
    }

    /// Rows `R` of one row block: 16-, then 8-wide column tiles, then scalar FMAs.
    #[inline(always)]
    unsafe fn row_block<const R: usize>(t: Rows) {
        let (c, a, lda, b, k, n) = (t.c, t.a, t.lda, t.b, t.k, t.n);
        unsafe {
            let mut j = 0;
            while j + RN * 8 <= n {
                tile::<R, RN>(t.skip_cols(j));
                j += RN * 8;
            }
            while j + 8 <= n {
                tile::<R, 1>(t.skip_cols(j));
                j += 8;
            }
            for jj in j..n {
                for i in 0..R {
                    let mut acc = *c.add(i * n + jj);
                    for kk in 0..k {
                        acc = (*a.add(i * lda + kk)).mul_add(*b.add(kk * n + jj), acc);
                    }
                    *c.add(i * n + jj) = acc;
                }
            }
        }
    }

    /// # Safety
    /// AVX2 and FMA present; `c` holds `m·n` floats, `a` `m` rows `lda` apart of `k`, `b`
    /// `k·n`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gemm_acc(
        c: *mut f32,
        a: *const f32,
        lda: usize,
        b: *const f32,
        m: usize,
        k: usize,
        n: usize,
    ) {
        let t = Rows { c, a, lda, b, k, n };
        unsafe {
            let mut i = 0;
            while i + RM <= m {
                row_block::<RM>(t.skip_rows(i));
                i += RM;
            }
            while i < m {
                row_block::<1>(t.skip_rows(i));
                i += 1;
            }
        }
    }

    /// [`super::scale_mask_max`] on 8 lanes at a time.
    ///
    /// # Safety
    /// AVX2 present; `row.len()` a multiple of 8, `mask` (if any) at least as long.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn scale_mask_max(
        row: &mut [f32],
        mask: Option<&[f32]>,
        scale: f32,
        kv: usize,
    ) -> f32 {
        unsafe {
            let s = _mm256_set1_ps(scale);
            let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mut max = ninf;
            for j in (0..row.len()).step_by(8) {
                let p = row.as_mut_ptr().add(j);
                let mut y = _mm256_mul_ps(_mm256_loadu_ps(p), s);
                if j + 8 > kv {
                    let live = _mm256_cmpgt_epi32(_mm256_set1_epi32((kv - j) as i32), lane);
                    y = _mm256_blendv_ps(ninf, y, _mm256_castsi256_ps(live));
                }
                if let Some(m) = mask {
                    y = _mm256_add_ps(y, _mm256_loadu_ps(m.as_ptr().add(j)));
                }
                _mm256_storeu_ps(p, y);
                max = _mm256_max_ps(max, y);
            }
            let h = _mm_max_ps(_mm256_extractf128_ps(max, 1), _mm256_castps256_ps128(max));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)))
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::kernels::test_util::noise;
    use use_avx2;

    #[test]
    fn gemm_blocks_give_the_portable_bits() {
        if !use_avx2() {
            return;
        }
        // odd sizes: row tails (m % 6), 8- and scalar column tails, a strided `a`
        for (m, k, n, lda) in [
            (13, 37, 29, 40),
            (6, 64, 64, 64),
            (1, 5, 8, 5),
            (7, 64, 17, 70),
        ] {
            let a = noise(m as u64, m * lda);
            let b = noise(99 + k as u64, k * n);
            let c0 = noise(7, m * n);
            let (mut fast, mut slow) = (c0.clone(), c0);
            unsafe { avx2::gemm_acc(fast.as_mut_ptr(), a.as_ptr(), lda, b.as_ptr(), m, k, n) };
            gemm_acc_portable(&mut slow, &a, lda, &b, m, k, n);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&slow), "{m}x{k}x{n}");
        }
    }

    #[test]
    fn score_pass_gives_the_portable_bits() {
        if !use_avx2() {
            return;
        }
        let mut mask = noise(3, KV_TILE);
        for (j, m) in mask.iter_mut().enumerate() {
            if j % 5 == 0 {
                *m = f32::NEG_INFINITY;
            }
        }
        for kv in [1usize, 7, 8, 33, 64] {
            for m in [None, Some(&mask[..])] {
                let width = kv.next_multiple_of(8);
                let row = noise(kv as u64, width);
                let (mut fast, mut slow) = (row.clone(), row);
                let a = unsafe { avx2::scale_mask_max(&mut fast, m, 0.37, kv) };
                let b = scale_mask_max_portable(&mut slow, m, 0.37, kv);
                assert_eq!(a.to_bits(), b.to_bits());
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&slow), "kv {kv}");
            }
        }
    }
}
