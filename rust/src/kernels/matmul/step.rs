//! One whole MUL_MAT node over strided ggml tensors, for the native plan runner: activation
//! rows gathered, [`matmul::matmul_quant`] per weight matrix, results scattered to the output.
//! Batch dims follow ggml's broadcast of src0 (weight matrix `i12 / (ne12 / ne02)`); a single
//! weight matrix meets every activation row in one call (activations converted once).

use super::plan as matmul;
use crate::kernels::dot::kquant_tiles;
use crate::kernels::error::KernelError;
use crate::kernels::formats::type_info;
use crate::kernels::operand::Operand;
use crate::kernels::pool;

/// `w` in blocks (`ne[0]` = blocks per row, `nb[0]` = block bytes), `x` and `out` f32 with
/// contiguous rows; out[i1][i0] of batch (i2, i3) = Σ w[i0] · x[i1].
#[derive(Clone, Copy, Debug)]
pub struct MulMat {
    pub type_id: u32,
    pub w: Operand,
    pub x: Operand,
    pub out: *mut u8,
    pub out_nb: [usize; 4],
    pub llamafile: bool,
}

// SAFETY: inputs are only read; each batch writes its own output rows.
unsafe impl Send for MulMat {}
unsafe impl Sync for MulMat {}

/// Rows per src1 batch from which every multi-row kernel ggml may choose is chosen anyway.
const MERGE_MIN_ROWS: usize = kquant_tiles::TILED_MIN_ROWS;

/// Below this many weight bytes per matrix, batches run one per thread instead of splitting
/// each matrix's rows.
const SMALL_MATRIX: usize = 1 << 20;

/// Whether strides `nb` lay rows of `row_bytes` (and the batches of `ne[1]` rows) back to back.
fn dense(nb: &[usize; 4], ne: [usize; 4], row_bytes: usize) -> bool {
    nb[1] == row_bytes && nb[2] == ne[1] * row_bytes && nb[3] == ne[2] * ne[1] * row_bytes
}

impl MulMat {
    /// Checks the shapes (the caller checked every extent against its buffer).
    pub fn check(&self, out_ne: [usize; 4]) -> Result<(), KernelError> {
        let info = type_info(self.type_id).ok_or_else(|| {
            KernelError::new(format!("weight type {} is not supported", self.type_id))
        })?;
        let (w, x) = (&self.w, &self.x);
        if w.nb[0] != info.block_bytes || x.nb[0] != 4 || self.out_nb[0] != 4 {
            return Err(KernelError::new("rows must be contiguous blocks / floats"));
        }
        if w.ne[0] * info.block != x.ne[0] {
            return Err(KernelError::new("weights and activations differ in K"));
        }
        if x.ne[2] % w.ne[2] != 0 || x.ne[3] % w.ne[3] != 0 {
            return Err(KernelError::new(
                "activation batches do not broadcast the weights",
            ));
        }
        if out_ne != [w.ne[1], x.ne[1], x.ne[2], x.ne[3]] {
            return Err(KernelError::new(format!(
                "out shape {out_ne:?} is not [{}, {}, {}, {}]",
                w.ne[1], x.ne[1], x.ne[2], x.ne[3]
            )));
        }
        Ok(())
    }

    fn k(&self) -> usize {
        self.x.ne[0]
    }

    /// Weight matrix of batch (i2, i3) as bytes.
    ///
    /// # Safety
    /// Per [`Self::run`].
    unsafe fn weights(&self, i2: usize, i3: usize) -> &[u8] {
        let w = &self.w;
        let at =
            (i2 / (self.x.ne[2] / w.ne[2])) * w.nb[2] + (i3 / (self.x.ne[3] / w.ne[3])) * w.nb[3];
        let len = (w.ne[1] - 1) * w.nb[1] + w.ne[0] * w.nb[0];
        unsafe { std::slice::from_raw_parts(w.ptr.add(at), len) }
    }

    /// Activation rows (i1 in `rows`, batch (i2, i3)) appended to `xs`.
    unsafe fn gather(&self, i2: usize, i3: usize, xs: &mut Vec<f32>) {
        let (x, k) = (&self.x, self.k());
        for i1 in 0..x.ne[1] {
            let p = unsafe { x.ptr.add(i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]) };
            xs.extend_from_slice(unsafe { std::slice::from_raw_parts(p as *const f32, k) });
        }
    }

    /// The activation rows of batch (i2, i3) in place, when they lie back to back.
    ///
    /// # Safety
    /// Per [`Self::run`].
    unsafe fn dense_rows(&self, i2: usize, i3: usize) -> Option<&[f32]> {
        let (x, k) = (&self.x, self.k());
        if x.nb[1] != k * 4 {
            return None;
        }
        let p = unsafe { x.ptr.add(i2 * x.nb[2] + i3 * x.nb[3]) } as *const f32;
        Some(unsafe { std::slice::from_raw_parts(p, x.ne[1] * k) })
    }

    /// The output rows of batch (i2, i3) in place, when they lie back to back.
    ///
    /// # Safety
    /// Per [`Self::run`]; only the task of batch (i2, i3) may hold it.
    #[allow(clippy::mut_from_ref)]
    unsafe fn dense_out(&self, i2: usize, i3: usize) -> Option<&mut [f32]> {
        let (m, nb) = (self.w.ne[1], self.out_nb);
        // rows back to back, batches apart (disjoint between the tasks)
        if nb[1] != m * 4 || nb[2] < self.x.ne[1] * nb[1] || nb[3] < self.x.ne[2] * nb[2] {
            return None;
        }
        let p = unsafe { self.out.add(i2 * nb[2] + i3 * nb[3]) } as *mut f32;
        Some(unsafe { std::slice::from_raw_parts_mut(p, self.x.ne[1] * m) })
    }

    /// Result rows of batch (i2, i3) from `res` (`ne1` rows of M).
    unsafe fn scatter(&self, i2: usize, i3: usize, res: &[f32]) {
        let (m, nb) = (self.w.ne[1], self.out_nb);
        for (i1, row) in res.chunks_exact(m).enumerate() {
            let p = unsafe { self.out.add(i1 * nb[1] + i2 * nb[2] + i3 * nb[3]) };
            unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), p as *mut f32, m) };
        }
    }

    fn matmul(&self, w: &[u8], xs: &[f32], res: &mut [f32], threads: usize) {
        self.matmul_order(w, xs, res, threads, self.llamafile)
    }

    fn matmul_order(&self, w: &[u8], xs: &[f32], res: &mut [f32], threads: usize, lf: bool) {
        let r = matmul::matmul_quant(
            self.type_id,
            w,
            self.w.nb[1],
            self.w.ne[1],
            self.k(),
            xs,
            res,
            threads,
            matmul::Order::Ggml { llamafile: lf },
        );
        debug_assert!(r.is_ok(), "{r:?}");
    }

    /// # Safety
    /// Every operand must be valid for its shape and strides during the call, the output must
    /// not overlap the inputs, and [`Self::check`] must have passed.
    pub unsafe fn run(&self, threads: usize) {
        let (x, m) = (&self.x, self.w.ne[1]);
        let (n1, n2, n3) = (x.ne[1], x.ne[2], x.ne[3]);
        // one call for every batch only where that changes no kernel choice: ggml picks its
        // multi-row kernels (tinyBLAS from 2 rows, the K-quant tiles from 8) per src1 batch
        let merge = n1 >= MERGE_MIN_ROWS || n2 * n3 == 1;
        if self.w.ne[2] == 1 && self.w.ne[3] == 1 && merge {
            let rows = n1 * n2 * n3;
            // dense activations are read and a dense output written in place (no copies)
            let gathered;
            let xs: &[f32] = if dense(&x.nb, x.ne, self.k() * 4) {
                unsafe { std::slice::from_raw_parts(x.ptr as *const f32, rows * self.k()) }
            } else {
                let mut v = Vec::with_capacity(rows * self.k());
                for i3 in 0..n3 {
                    for i2 in 0..n2 {
                        unsafe { self.gather(i2, i3, &mut v) };
                    }
                }
                gathered = v;
                &gathered
            };
            let w = unsafe { self.weights(0, 0) };
            if dense(&self.out_nb, x.ne, m * 4) {
                // SAFETY: the output does not overlap the inputs (run's contract)
                let res = unsafe { std::slice::from_raw_parts_mut(self.out as *mut f32, rows * m) };
                self.matmul(w, xs, res, threads);
                return;
            }
            let mut res = vec![0.0f32; rows * m];
            self.matmul(w, xs, &mut res, threads);
            for (b, part) in res.chunks_exact(n1 * m).enumerate() {
                unsafe { self.scatter(b % n2, b / n2, part) };
            }
            return;
        }
        // single-row batches (decode) sharing a weight matrix (GQA: several query heads per
        // KV head) in one call per matrix, so each matrix is read once instead of once per
        // head; vec_dot order as ggml's per-batch N = 1 (no tinyBLAS, too few rows for tiles)
        let (r2, r3) = (n2 / self.w.ne[2], n3 / self.w.ne[3]);
        if n1 == 1 && r2 * r3 > 1 && r2 * r3 < MERGE_MIN_ROWS {
            let group = |g: usize, threads: usize| {
                let (g2, g3) = (g % self.w.ne[2], g / self.w.ne[2]);
                let members: Vec<(usize, usize)> = (0..r3)
                    .flat_map(|j3| (0..r2).map(move |j2| (g2 * r2 + j2, g3 * r3 + j3)))
                    .collect();
                let mut xs = Vec::with_capacity(members.len() * self.k());
                for &(i2, i3) in &members {
                    unsafe { self.gather(i2, i3, &mut xs) };
                }
                let mut res = vec![0.0f32; members.len() * m];
                let w = unsafe { self.weights(g2 * r2, g3 * r3) };
                self.matmul_order(w, &xs, &mut res, threads, false);
                for (&(i2, i3), part) in members.iter().zip(res.chunks_exact(m)) {
                    unsafe { self.scatter(i2, i3, part) };
                }
            };
            self.spread(self.w.ne[2] * self.w.ne[3], threads, group);
            return;
        }
        let batch = |b: usize, threads: usize| {
            let (i2, i3) = (b % n2, b / n2);
            let gathered;
            let xs = match unsafe { self.dense_rows(i2, i3) } {
                Some(rows) => rows,
                None => {
                    let mut v = Vec::with_capacity(n1 * self.k());
                    unsafe { self.gather(i2, i3, &mut v) };
                    gathered = v;
                    &gathered[..]
                }
            };
            let w = unsafe { self.weights(i2, i3) };
            if let Some(res) = unsafe { self.dense_out(i2, i3) } {
                self.matmul(w, xs, res, threads);
                return;
            }
            let mut res = vec![0.0f32; n1 * m];
            self.matmul(w, xs, &mut res, threads);
            unsafe { self.scatter(i2, i3, &res) };
        };
        self.spread(n2 * n3, threads, batch);
    }

    /// Whether this is a decode-shaped product (one weight matrix, one activation row) that
    /// [`run_joint`] may compute together with others of the same layout.
    pub fn single_row(&self) -> bool {
        let (w, x) = (&self.w, &self.x);
        w.ne[2] == 1 && w.ne[3] == 1 && x.ne[1] == 1 && x.ne[2] == 1 && x.ne[3] == 1
    }

    /// Same weight type, shape and strides as `other` (the bytes are the caller's business).
    pub fn same_layout(&self, other: &MulMat) -> bool {
        self.type_id == other.type_id && self.w.ne == other.w.ne && self.w.nb == other.w.nb
    }

    /// The bytes of the weight matrix.
    ///
    /// # Safety
    /// Per [`Self::run`].
    pub unsafe fn weight_bytes(&self) -> &[u8] {
        unsafe { self.weights(0, 0) }
    }
}

/// Activation rows computed together meet their weights in one call of at most this many rows:
/// under [`MERGE_MIN_ROWS`] every supported type keeps each row's vec_dot order, so each row's
/// result has the bits it has alone.
pub const JOINT_MAX_ROWS: usize = MERGE_MIN_ROWS - 1;

/// Several single-row products whose weight matrices hold the same bytes (clients that loaded
/// the same model), computed with one read of the first one's weights: each output row gets the
/// bits its own [`MulMat::run`] gives it.
///
/// # Safety
/// Every step as per [`MulMat::run`], all [`MulMat::single_row`] and of the same layout, and
/// their weight matrices equal byte for byte.
pub unsafe fn run_joint(mms: &[&MulMat], threads: usize) {
    let Some(first) = mms.first() else { return };
    let (k, m) = (first.k(), first.w.ne[1]);
    let w = unsafe { first.weights(0, 0) };
    let mut xs = Vec::with_capacity(mms.len() * k);
    for mm in mms {
        unsafe { mm.gather(0, 0, &mut xs) };
    }
    let mut res = vec![0.0f32; mms.len() * m];
    for (x, out) in xs
        .chunks(JOINT_MAX_ROWS * k)
        .zip(res.chunks_mut(JOINT_MAX_ROWS * m))
    {
        let order = matmul::Order::EachRow;
        let r = matmul::matmul_quant(
            first.type_id,
            w,
            first.w.nb[1],
            m,
            k,
            x,
            out,
            threads,
            order,
        );
        debug_assert!(r.is_ok(), "{r:?}");
    }
    for (mm, row) in mms.iter().zip(res.chunks_exact(m)) {
        unsafe { mm.scatter(0, 0, row) };
    }
}

impl MulMat {
    /// `part(p, threads)` for each of `parts` independent parts: attention-sized matrices take
    /// whole parts per thread (each one's result is the same whichever thread computes it),
    /// larger ones one part after another, each split over the threads.
    fn spread(&self, parts: usize, threads: usize, part: impl Fn(usize, usize) + Sync) {
        let w_bytes = self.w.ne[1] * self.w.ne[0] * self.w.nb[0];
        if w_bytes < SMALL_MATRIX {
            pool::run(threads, parts, &|p| part(p, 1));
        } else {
            (0..parts).for_each(|p| part(p, threads));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_util::{noise, weights};

    const TYPES: [u32; 16] = [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30, 39];

    fn step(
        type_id: u32,
        w: &[u8],
        row: usize,
        m: usize,
        k: usize,
        x: &[f32],
        out: &mut [f32],
    ) -> MulMat {
        let info = type_info(type_id).unwrap();
        let blocks = k / info.block;
        MulMat {
            type_id,
            w: Operand {
                ptr: w.as_ptr(),
                ne: [blocks, m, 1, 1],
                nb: [info.block_bytes, row, row * m, row * m],
            },
            x: Operand {
                ptr: x.as_ptr() as *const u8,
                ne: [k, 1, 1, 1],
                nb: [4, 4 * k, 4 * k, 4 * k],
            },
            out: out.as_mut_ptr() as *mut u8,
            out_nb: [4, 4 * m, 4 * m, 4 * m],
            llamafile: true,
        }
    }

    /// Clients' single-row products over equal weights computed together give each client the
    /// bits its own step gives, for every type, at any number of clients (more than one call's
    /// worth of rows included) and thread count.
    #[test]
    fn joint_rows_keep_each_steps_bits() {
        for &t in &TYPES {
            let (m, k) = (36, 512);
            let info = type_info(t).unwrap();
            let row = k / info.block * info.block_bytes;
            let w = weights(t, m, k, 40 + t as u64);
            for n in [2usize, 3, 7, 9] {
                let copies: Vec<Vec<u8>> = (0..n).map(|_| w.clone()).collect();
                let xs: Vec<Vec<f32>> = (0..n).map(|c| noise(90 + c as u64, k)).collect();
                let mut alone = vec![vec![0.0f32; m]; n];
                let mut joint = vec![vec![0.0f32; m]; n];
                for c in 0..n {
                    let s = step(t, &copies[c], row, m, k, &xs[c], &mut alone[c]);
                    assert!(s.single_row());
                    unsafe { s.run(2) };
                }
                for threads in [1, 2] {
                    let steps: Vec<MulMat> = joint
                        .iter_mut()
                        .enumerate()
                        .map(|(c, out)| step(t, &copies[c], row, m, k, &xs[c], out))
                        .collect();
                    assert!(steps.iter().all(|s| s.same_layout(&steps[0])));
                    let refs: Vec<&MulMat> = steps.iter().collect();
                    unsafe { run_joint(&refs, threads) };
                    for c in 0..n {
                        let (a, b): (Vec<u32>, Vec<u32>) = (
                            alone[c].iter().map(|v| v.to_bits()).collect(),
                            joint[c].iter().map(|v| v.to_bits()).collect(),
                        );
                        assert_eq!(a, b, "type {t}, {n} clients, client {c}, {threads} threads");
                    }
                }
            }
        }
    }
}
