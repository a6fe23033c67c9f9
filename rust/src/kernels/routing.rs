//! The small row ops of a mixture-of-experts router, so that a MoE layer runs in the native
//! plan from its router product to its weighted sum: ARGSORT (the top-k experts), SUM_ROWS
//! (the selected weights' sum) and CLAMP (that sum kept above a floor), with ggml's arithmetic.

use crate::kernels::operand::Operand;
use crate::kernels::pool;

/// Elements from which a routing op splits its rows over threads (a decode step's router rows
/// are far below: the pool's wake-up would cost more than the op).
const MIN_PARALLEL: usize = 1 << 16;

/// One router op over f32 rows (`x`, `out` with contiguous rows, any other strides).
#[derive(Clone, Copy, Debug)]
pub enum Routing {
    /// i32 `out`: each row's indices ordered by value, ascending or descending; ties keep index
    /// order (a stable sort, as rpcnet's NumPy kernel; std::sort leaves ties unspecified) and
    /// NaNs come last.
    ArgSort {
        x: Operand,
        out: Operand,
        descending: bool,
    },
    /// `out[row][0]` = the row's sum, accumulated in f64 in order (ggml_vec_sum_f32).
    SumRows { x: Operand, out: Operand },
    /// `out = MAX(MIN(x, max), min)` with ggml's comparison macros (a NaN becomes `max`).
    Clamp {
        x: Operand,
        out: Operand,
        min: f32,
        max: f32,
    },
}

// SAFETY: inputs are only read; each task writes its own output rows.
unsafe impl Send for Routing {}
unsafe impl Sync for Routing {}

/// The sort key that orders like NumPy's stable argsort: -0.0 equal to 0.0, NaN last.
fn key(v: f32, descending: bool) -> (bool, f32) {
    let v = v + 0.0; // -0.0 + 0.0 = 0.0: equal keys, index order kept
    (v.is_nan(), if descending { -v } else { v })
}

impl Routing {
    fn x(&self) -> &Operand {
        match self {
            Self::ArgSort { x, .. } | Self::SumRows { x, .. } | Self::Clamp { x, .. } => x,
        }
    }

    fn out(&self) -> &Operand {
        match self {
            Self::ArgSort { out, .. } | Self::SumRows { out, .. } | Self::Clamp { out, .. } => out,
        }
    }

    /// Checks the shapes (the caller checked every extent against its buffer).
    pub fn check(&self) -> Result<(), String> {
        let (x, out) = (self.x(), self.out());
        if x.nb[0] != 4 || out.nb[0] != 4 {
            return Err("rows must be contiguous 4-byte elements".into());
        }
        let want = match self {
            Self::SumRows { .. } => [1, x.ne[1], x.ne[2], x.ne[3]],
            _ => x.ne,
        };
        if out.ne != want {
            return Err(format!("out shape {:?} is not {want:?}", out.ne));
        }
        Ok(())
    }

    /// # Safety
    /// Operands valid for their shapes and strides during the call ([`Self::check`] passed);
    /// `out` overlaps `x` only exactly (CLAMP in place) or not at all.
    pub unsafe fn run(&self, threads: usize) {
        let x = self.x();
        let rows = x.ne[1] * x.ne[2] * x.ne[3];
        let threads = if rows * x.ne[0] < MIN_PARALLEL {
            1
        } else {
            threads.clamp(1, rows)
        };
        let per = rows.div_ceil(threads);
        let task = |t: usize| {
            for r in t * per..((t + 1) * per).min(rows) {
                // SAFETY: run's contract; each task writes its own rows
                unsafe { self.row(r) };
            }
        };
        pool::run(threads, threads, &task);
    }

    /// # Safety
    /// Per [`Self::run`].
    unsafe fn row(&self, r: usize) {
        let (x, out) = (self.x(), self.out());
        let n = x.ne[0];
        let src = unsafe { std::slice::from_raw_parts(x.row_start(r) as *const f32, n) };
        match *self {
            Self::ArgSort { descending, .. } => {
                let dst = out.row_start(r) as *mut i32;
                let mut order: Vec<i32> = (0..n as i32).collect();
                order.sort_by(|&a, &b| {
                    let (ka, kb) = (
                        key(src[a as usize], descending),
                        key(src[b as usize], descending),
                    );
                    ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
                });
                unsafe { std::ptr::copy_nonoverlapping(order.as_ptr(), dst, n) };
            }
            Self::SumRows { .. } => {
                let sum: f64 = src.iter().fold(0.0, |s, &v| s + v as f64);
                unsafe { (out.row_start(r) as *mut f32).write(sum as f32) };
            }
            Self::Clamp { min, max, .. } => {
                let dst = out.row_start(r) as *mut f32;
                for (i, &v) in src.iter().enumerate() {
                    let lo = if v < max { v } else { max };
                    let c = if lo > min { lo } else { min };
                    // in place writes element i after reading it
                    unsafe { dst.add(i).write(c) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(v: &mut [f32], ne: [usize; 4]) -> Operand {
        Operand {
            ptr: v.as_mut_ptr() as *const u8,
            ne,
            nb: [4, 4 * ne[0], 4 * ne[0] * ne[1], 4 * ne[0] * ne[1] * ne[2]],
        }
    }

    #[test]
    fn argsort_is_stable_with_nans_last() {
        let mut x = [0.5f32, -0.0, 2.0, f32::NAN, 0.0, 2.0, -1.0, 0.5];
        for (descending, want) in [
            (true, [2, 5, 0, 7, 1, 4, 6, 3]),
            (false, [6, 1, 4, 0, 7, 2, 5, 3]),
        ] {
            let mut out = [0i32; 8];
            let step = Routing::ArgSort {
                x: op(&mut x, [8, 1, 1, 1]),
                out: Operand {
                    ptr: out.as_mut_ptr() as *const u8,
                    ne: [8, 1, 1, 1],
                    nb: [4, 32, 32, 32],
                },
                descending,
            };
            step.check().unwrap();
            unsafe { step.run(2) };
            assert_eq!(out, want, "descending {descending}");
        }
    }

    #[test]
    fn sum_rows_accumulates_in_f64() {
        // 1 + 4e-8 + 4e-8 rounds back to 1 in f32 steps, not in f64
        let mut x = [1.0f32, 4e-8, 4e-8, 0.0, 3.0, 4.0, 0.0, 0.0];
        let mut out = [0.0f32; 2];
        let step = Routing::SumRows {
            x: op(&mut x, [4, 2, 1, 1]),
            out: op(&mut out, [1, 2, 1, 1]),
        };
        step.check().unwrap();
        unsafe { step.run(1) };
        assert_eq!(out, [(1.0f64 + 4e-8f32 as f64 * 2.0) as f32, 7.0]);
        assert_ne!(out[0], 1.0);
    }

    #[test]
    fn clamp_follows_ggml_macros_in_place() {
        let mut x = [-5.0f32, 0.25, 9.0, f32::NAN];
        let step = Routing::Clamp {
            x: op(&mut x, [4, 1, 1, 1]),
            out: op(&mut x, [4, 1, 1, 1]),
            min: 0.0,
            max: 1.0,
        };
        unsafe { step.run(2) };
        assert_eq!(x, [0.0, 0.25, 1.0, 1.0]);
    }

    #[test]
    fn check_rejects_wrong_shapes() {
        let mut x = [0.0f32; 8];
        let bad = Routing::SumRows {
            x: op(&mut x, [4, 2, 1, 1]),
            out: op(&mut x, [2, 2, 1, 1]),
        };
        assert!(bad.check().is_err());
    }
}
