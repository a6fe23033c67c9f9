//! One whole MUL_MAT_ID node (mixture-of-experts products) in one call: tokens routed to their
//! experts, every activation row converted once to the experts' vec_dot type (a token's row is
//! shared by all the experts it selects), each selected expert's weights read once, and the
//! work of all experts split over the threads as (expert, chunk of weight rows) tasks, so two
//! threads stay busy when a decode step selects a few small experts.
//!
//! Per expert the rows routed to it are one product in ggml's MUL_MAT_ID order (vec_dot, and
//! the tiled K-quant kernel from 8 rows on): [`super::plan::rows_for`] without llamafile, the
//! same choice a call of [`super::plan::matmul_converted`] per expert makes, so the results are
//! those bits whatever the threads.

use super::plan::{prepare, rows_for};
use super::run::{RowsPlan, MIN_BYTES_PER_THREAD, SCRATCH_KEEP, STREAM_CHUNK_ROWS};
use crate::kernels::dot::rows::TILE_ROWS;
use crate::kernels::error::KernelError;
use crate::kernels::formats::{type_info, TypeInfo};
use crate::kernels::operand::{Converted, Operand, RowsJob};
use crate::kernels::pool;

/// `w` the experts in blocks (`ne` = [blocks per row, M, experts, 1]), `x` f32 activations
/// ([K, rows per token, tokens, 1]: one row shared by every slot, or one per slot), `ids` i32
/// ([slots, tokens, 1, 1]); `out` f32 [M, slots, tokens, 1] with contiguous rows:
/// out[t][s] = w[ids[t][s]] · x[t][s % rows per token].
#[derive(Clone, Copy, Debug)]
pub struct MulMatId {
    pub type_id: u32,
    pub w: Operand,
    pub x: Operand,
    pub ids: Operand,
    pub out: *mut u8,
    pub out_nb: [usize; 4],
}

// SAFETY: inputs are only read; each task writes its own output columns of its own rows.
unsafe impl Send for MulMatId {}
unsafe impl Sync for MulMatId {}

/// The rows one expert meets: (slot, token) of each, in ggml's order (token, then slot).
struct Routed {
    expert: usize,
    rows: Vec<(usize, usize)>,
}

/// One expert's product, ready to run: its plan and its activations in the plan's layout.
struct Prepared {
    plan: RowsPlan,
    act: Converted,
}

/// Output pointer shared by the tasks of one call (each writes disjoint columns of its rows).
struct SharedPtr(*mut u8);

// SAFETY: see `MulMatId::run`: tasks write disjoint (row, column range) pieces.
unsafe impl Sync for SharedPtr {}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl MulMatId {
    fn info(&self) -> Result<TypeInfo, KernelError> {
        type_info(self.type_id).ok_or_else(|| {
            KernelError::new(format!("expert type {} is not supported", self.type_id))
        })
    }

    fn k(&self) -> usize {
        self.x.ne[0]
    }

    /// Checks the shapes (the caller checked every extent against its buffer).
    pub fn check(&self, out_ne: [usize; 4]) -> Result<(), KernelError> {
        let info = self.info()?;
        let (w, x, ids) = (&self.w, &self.x, &self.ids);
        if w.nb[0] != info.block_bytes || x.nb[0] != 4 || ids.nb[0] != 4 || self.out_nb[0] != 4 {
            return Err(KernelError::new("rows must be contiguous blocks / values"));
        }
        let k = w.ne[0] * info.block;
        if k != x.ne[0] || !k.is_multiple_of(info.act.block()) {
            return Err(KernelError::new(
                "experts and activations differ in K, or K is not whole blocks",
            ));
        }
        let (m, slots, tokens) = (w.ne[1], ids.ne[0], ids.ne[1]);
        if w.ne[3] != 1 || x.ne[3] != 1 || ids.ne[2] != 1 || ids.ne[3] != 1 {
            return Err(KernelError::new("MUL_MAT_ID takes no fourth dimension"));
        }
        if x.ne[2] != tokens || !slots.is_multiple_of(x.ne[1]) {
            return Err(KernelError::new("activation rows do not match the ids"));
        }
        if m > 1 && w.nb[1] < w.ne[0] * w.nb[0] {
            return Err(KernelError::new("expert rows overlap"));
        }
        if out_ne != [m, slots, tokens, 1] {
            return Err(KernelError::new(format!(
                "out shape {out_ne:?} is not [{m}, {slots}, {tokens}, 1]"
            )));
        }
        Ok(())
    }

    /// The experts the ids select, each with its rows; `None` when an id is out of range.
    ///
    /// # Safety
    /// Per [`Self::run`].
    unsafe fn route(&self) -> Option<Vec<Routed>> {
        let (ids, n_exp) = (&self.ids, self.w.ne[2]);
        let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_exp];
        for t in 0..ids.ne[1] {
            for s in 0..ids.ne[0] {
                let p = unsafe { ids.ptr.add(s * ids.nb[0] + t * ids.nb[1]) } as *const i32;
                let e = usize::try_from(unsafe { p.read_unaligned() }).ok()?;
                by_expert.get_mut(e)?.push((s, t));
            }
        }
        Some(
            by_expert
                .into_iter()
                .enumerate()
                .filter(|(_, rows)| !rows.is_empty())
                .map(|(expert, rows)| Routed { expert, rows })
                .collect(),
        )
    }

    /// Every activation row converted once, row `t * rows_per_token + j`.
    ///
    /// # Safety
    /// Per [`Self::run`].
    unsafe fn convert(&self, info: TypeInfo, threads: usize) -> Converted {
        let (x, k) = (&self.x, self.k());
        let rows = x.ne[1] * x.ne[2];
        if x.nb[1] == 4 * k && x.nb[2] == x.ne[1] * 4 * k {
            let xs = unsafe { std::slice::from_raw_parts(x.ptr as *const f32, rows * k) };
            return Converted::new_par(info.act, xs, k, threads);
        }
        let mut xs = Vec::with_capacity(rows * k);
        for t in 0..x.ne[2] {
            for j in 0..x.ne[1] {
                let p = unsafe { x.ptr.add(j * x.nb[1] + t * x.nb[2]) } as *const f32;
                xs.extend_from_slice(unsafe { std::slice::from_raw_parts(p, k) });
            }
        }
        Converted::new_par(info.act, &xs, k, threads)
    }

    /// One expert's converted rows gathered in its order, laid out for its plan.
    fn prepare(&self, info: TypeInfo, all: &Converted, routed: &Routed) -> Prepared {
        let per_token = self.x.ne[1];
        let n = routed.rows.len();
        let mut data = Vec::with_capacity(n * all.row_bytes);
        for &(s, t) in &routed.rows {
            data.extend_from_slice(all.row(t * per_token + s % per_token));
        }
        let act = Converted {
            data,
            row_bytes: all.row_bytes,
            rows: n,
        };
        let plan = rows_for(self.type_id, self.w.ne[1], self.k(), n, false);
        let act = prepare(plan.layout, &act, self.type_id, info, self.k()).unwrap_or(act);
        Prepared { plan, act }
    }

    /// The bytes of expert `e`'s weight rows.
    ///
    /// # Safety
    /// Per [`Self::run`].
    unsafe fn weights(&self, e: usize) -> &[u8] {
        let w = &self.w;
        let len = (w.ne[1] - 1) * w.nb[1] + w.ne[0] * w.nb[0];
        unsafe { std::slice::from_raw_parts(w.ptr.add(e * w.nb[2]), len) }
    }

    /// Computes the node; false (nothing written) when an id is out of range.
    ///
    /// # Safety
    /// Every operand must be valid for its shape and strides during the call, the output must
    /// not overlap the inputs, and [`Self::check`] must have passed.
    pub unsafe fn run(&self, threads: usize) -> bool {
        let Ok(info) = self.info() else { return false };
        let Some(routed) = (unsafe { self.route() }) else {
            return false;
        };
        let threads = threads.max(1);
        let all = unsafe { self.convert(info, threads) };
        let mut prepared: Vec<Option<Prepared>> = routed.iter().map(|_| None).collect();
        let slots: Vec<(&Routed, &mut Option<Prepared>)> =
            routed.iter().zip(prepared.iter_mut()).collect();
        let prep_threads = if all.data.len() * 2 < MIN_BYTES_PER_THREAD {
            1
        } else {
            threads
        };
        pool::for_each(prep_threads, slots, |_, (r, slot)| {
            *slot = Some(self.prepare(info, &all, r));
        });
        let prepared: Vec<Prepared> = prepared.into_iter().flatten().collect();
        let (m, k) = (self.w.ne[1], self.k());
        let row_bytes = k / info.block * info.block_bytes;
        // chunks of weight rows per expert: whole tiles, results within the kept scratch
        let tasks: Vec<(usize, usize, usize)> = prepared
            .iter()
            .enumerate()
            .flat_map(|(g, p)| {
                let per = STREAM_CHUNK_ROWS
                    .min((SCRATCH_KEEP / p.act.rows).max(1))
                    .next_multiple_of(TILE_ROWS);
                (0..m)
                    .step_by(per)
                    .map(move |first| (g, first, per.min(m - first)))
            })
            .collect();
        let bytes: usize = prepared
            .iter()
            .map(|p| m * row_bytes * p.act.rows.min(8))
            .sum();
        let threads = threads.clamp(1, (bytes / MIN_BYTES_PER_THREAD).max(1));
        let out = SharedPtr(self.out);
        let task = |i: usize| {
            let (g, first, rows) = tasks[i];
            let (r, p) = (&routed[g], &prepared[g]);
            let n = p.act.rows;
            // SAFETY: run's contract
            let w = unsafe { self.weights(r.expert) };
            SCRATCH.with(|cell| {
                let mut scratch = cell.borrow_mut();
                // grown, never cleared: the rows function writes every result
                if scratch.len() < rows * n {
                    scratch.resize(rows * n, 0.0);
                }
                let results = &mut scratch[..rows * n];
                let job = RowsJob::new(w, self.w.nb[1], first, k, &p.act, results, p.plan.gemm);
                (p.plan.f)(job);
                // SAFETY: this task alone writes columns first..first + rows of these rows
                unsafe { self.scatter(&out, &r.rows, first, rows, results) };
                if scratch.capacity() > SCRATCH_KEEP {
                    *scratch = Vec::new();
                }
            });
        };
        pool::run(threads, tasks.len(), &task);
        true
    }

    /// `results` (`[rows][n]`, weight row-major) into columns `first..first + rows` of the
    /// output rows of `at` ((slot, token) of each of the n activation rows).
    ///
    /// # Safety
    /// The output is valid per [`Self::run`]; no other task writes these columns meanwhile.
    unsafe fn scatter(
        &self,
        out: &SharedPtr,
        at: &[(usize, usize)],
        first: usize,
        rows: usize,
        results: &[f32],
    ) {
        let n = at.len();
        for (j, &(s, t)) in at.iter().enumerate() {
            let off = s * self.out_nb[1] + t * self.out_nb[2] + first * 4;
            let dst = unsafe { out.0.add(off) } as *mut f32;
            if n == 1 {
                unsafe { std::ptr::copy_nonoverlapping(results.as_ptr(), dst, rows) };
                continue;
            }
            for i in 0..rows {
                unsafe { dst.add(i).write(results[i * n + j]) };
            }
        }
    }
}

#[cfg(test)]
#[path = "experts_tests.rs"]
mod tests;
