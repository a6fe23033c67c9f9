//! A FLASH_ATTN_EXT node's operands and the facts every path derives from them: shapes, ALiBi
//! slopes, where each query row's output goes.

use crate::kernels::error::KernelError;
use crate::kernels::operand::Operand;

/// Multiply-adds (rows × KV × (DK + DV)) below which a node runs on one thread.
const MIN_PARALLEL_WORK: usize = 1 << 20;

/// KV positions from which ggml splits one decode row over threads.
pub const SPLIT_KV_MIN: usize = 512;

/// ggml's `GGML_FA_TILE_Q`: from this many query rows ggml takes the tiled path.
pub const Q_TILE: usize = 64;

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

impl FlashAttn {
    pub(super) fn dk(&self) -> usize {
        self.k.ne[0]
    }
    pub(super) fn dv(&self) -> usize {
        self.v.ne[0]
    }
    pub(super) fn n_kv(&self) -> usize {
        self.k.ne[1]
    }
    pub(super) fn n_rows(&self) -> usize {
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

    pub(super) fn slope(&self, h: usize) -> f32 {
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

    /// (i3, head, query position) of query row `ir`.
    pub(super) fn head(&self, ir: usize) -> (usize, usize, usize) {
        let [_, n_q, n_head, _] = self.q.ne;
        let iq3 = ir / (n_head * n_q);
        let iq2 = (ir - iq3 * n_head * n_q) / n_q;
        (iq3, iq2, ir - iq3 * n_head * n_q - iq2 * n_q)
    }

    /// # Safety
    /// Output row `r` must be valid for DV float32 writes and no other thread writes it.
    pub(super) unsafe fn write_row(&self, r: usize, vals: &[f32], s: f32) {
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        let out = unsafe {
            std::slice::from_raw_parts_mut(self.out.add(r * self.out_row) as *mut f32, vals.len())
        };
        for (o, v) in out.iter_mut().zip(vals) {
            *o = v * inv;
        }
    }

    /// Destination row of query row `ir` (dst is q permuted (0, 2, 1, 3)).
    pub(super) fn out_index(&self, ir: usize) -> usize {
        let [_, n_q, n_head, _] = self.q.ne;
        let iq3 = ir / (n_head * n_q);
        let iq2 = (ir - iq3 * n_head * n_q) / n_q;
        let iq1 = ir - iq3 * n_head * n_q - iq2 * n_q;
        (iq3 * n_q + iq1) * n_head + iq2
    }

    /// Threads worth starting: the split of the work (and so the numerics) follows `threads`,
    /// but a small node runs on the calling thread (starting threads costs ~50-200 µs).
    pub(super) fn workers(&self, threads: usize) -> usize {
        let work = self.n_rows() * self.n_kv() * (self.dk() + self.dv());
        if work < MIN_PARALLEL_WORK {
            1
        } else {
            threads
        }
    }
}
