//! Running a FLASH_ATTN_EXT node over threads: the tiled path for prompts, ggml's split-KV
//! path for one long decode row, otherwise query rows split over threads.

use super::params::{FlashAttn, Q_TILE, SPLIT_KV_MIN};
use super::walk::Scratch;
use crate::kernels::pool;

/// One KV chunk's work: (chunk index, [(head, its partial slot)]).
type ChunkJob<'a> = (usize, Vec<(usize, &'a mut [f32])>);

impl FlashAttn {
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
        pool::run(threads, threads, &|t| {
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
                pool::for_each(workers, per_worker, |_, jobs| {
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
    use super::*;
    use crate::kernels::blocks::half::f32_to_fp16;
    use crate::kernels::cpu::use_avx2;
    use crate::kernels::operand::Operand;
    use crate::kernels::test_util::noise;

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
