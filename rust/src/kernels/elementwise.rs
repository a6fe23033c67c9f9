//! Element-wise maps of f32 rows, computed like ggml's CPU backend (`vec.h`, `ops.cpp`):
//!
//! * SCALE — `x·s` (`ggml_vec_scale_f32`), or `fma(x, s, b)` with a bias (`ggml_vec_mad1_f32`);
//! * TANH — `tanhf` per element (`ggml_vec_tanh_f32`), correctly rounded as the reference's C
//!   library computes it ([`super::mathf`]);
//! * GELU and GEGLU with `GGML_GELU_FP16` — 0 at or below −10, `x` at or above 10, otherwise
//!   ggml's f16 GELU table at `x` rounded to f16; GEGLU multiplies by the gate.
//!
//! The GELU table (65536 values, the f16 results as f32) comes from the caller, which builds
//! it once with the reference's arithmetic.

use super::blocks::half::f32_to_fp16;
use super::mathf::tanhf;
use super::operand::Operand;
use super::pool;

/// Entries of the GELU table: one per f16 bit pattern.
pub const GELU_TABLE_LEN: usize = 1 << 16;

/// Below this many elements a map runs on the calling thread; `tanhf` costs ~20 ns an element,
/// the others ~1.
const MIN_PARALLEL: usize = 1 << 16;
const MIN_PARALLEL_TANH: usize = 1 << 11;

/// What is applied to each element.
#[derive(Clone, Copy, Debug)]
pub enum MapOp {
    Scale {
        s: f32,
        b: f32,
    },
    Tanh,
    /// `table` holds [`GELU_TABLE_LEN`] floats.
    Gelu {
        table: *const f32,
    },
    /// GELU of `x` times the gate `g` (same shape as `out`).
    Geglu {
        table: *const f32,
        g: Operand,
    },
}

/// One element-wise node: `out = op(x)`, all f32 with contiguous rows and the same shape.
pub struct ElementMap {
    pub x: Operand,
    pub out: Operand,
    pub op: MapOp,
}

// SAFETY: inputs are only read; each task writes its own output rows (in place: the same
// element it read).
unsafe impl Send for ElementMap {}
unsafe impl Sync for ElementMap {}

#[inline(always)]
fn gelu(table: *const f32, x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        // SAFETY: the table has an entry for every u16 (checked when the step was built).
        unsafe { table.add(usize::from(f32_to_fp16(x))).read() }
    }
}

#[inline(always)]
fn geglu(table: *const f32, x: f32, g: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x * g
    } else {
        // SAFETY: as in gelu.
        unsafe { table.add(usize::from(f32_to_fp16(x))).read() * g }
    }
}

#[inline]
fn row_ptr(t: &Operand, r: usize) -> *const u8 {
    let (i1, rest) = (r % t.ne[1], r / t.ne[1]);
    let (i2, i3) = (rest % t.ne[2], rest / t.ne[2]);
    t.ptr
        .wrapping_add(i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3])
}

impl ElementMap {
    /// Checks the shapes (the caller checked every extent against its buffer).
    pub fn check(&self) -> Result<(), String> {
        let mut operands = vec![&self.x, &self.out];
        if let MapOp::Geglu { g, .. } = &self.op {
            operands.push(g);
        }
        if operands.iter().any(|t| t.nb[0] != 4) {
            return Err("rows must be contiguous f32".into());
        }
        if operands.iter().any(|t| t.ne != self.out.ne) {
            return Err("operands must have the output's shape".into());
        }
        Ok(())
    }

    /// # Safety
    /// Operands valid for their shapes and strides during the call ([`Self::check`] passed);
    /// `out` overlaps an input only exactly (in place) or not at all.
    pub unsafe fn run(&self, threads: usize) {
        let ne = self.out.ne;
        let rows = ne[1] * ne[2] * ne[3];
        let min = match self.op {
            MapOp::Tanh => MIN_PARALLEL_TANH,
            _ => MIN_PARALLEL,
        };
        let threads = if rows * ne[0] < min {
            1
        } else {
            threads.clamp(1, rows.max(1))
        };
        let per = rows.div_ceil(threads);
        pool::run(threads, rows.div_ceil(per), &|t| {
            for r in t * per..((t + 1) * per).min(rows) {
                // SAFETY: per this function's contract; task t alone writes rows of its range.
                unsafe { self.row(r) };
            }
        });
    }

    /// Row `r`. Raw pointers: `out` may be `x` (or the gate), each element written after its
    /// inputs are read.
    unsafe fn row(&self, r: usize) {
        let n = self.out.ne[0];
        let x = row_ptr(&self.x, r) as *const f32;
        let y = row_ptr(&self.out, r) as *mut f32;
        // SAFETY (all reads and writes): i < n, within rows checked at build time.
        match self.op {
            MapOp::Scale { s, b: 0.0 } => {
                for i in 0..n {
                    unsafe { y.add(i).write(x.add(i).read() * s) };
                }
            }
            MapOp::Scale { s, b } => {
                for i in 0..n {
                    unsafe { y.add(i).write(x.add(i).read().mul_add(s, b)) };
                }
            }
            MapOp::Tanh => {
                for i in 0..n {
                    unsafe { y.add(i).write(tanhf(x.add(i).read())) };
                }
            }
            MapOp::Gelu { table } => {
                for i in 0..n {
                    unsafe { y.add(i).write(gelu(table, x.add(i).read())) };
                }
            }
            MapOp::Geglu { table, g } => {
                let gp = row_ptr(&g, r) as *const f32;
                for i in 0..n {
                    unsafe {
                        y.add(i)
                            .write(geglu(table, x.add(i).read(), gp.add(i).read()))
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operand(v: &[f32]) -> Operand {
        Operand {
            ptr: v.as_ptr() as *const u8,
            ne: [v.len(), 1, 1, 1],
            nb: [4, 4 * v.len(), 4 * v.len(), 4 * v.len()],
        }
    }

    fn run(op: MapOp, x: &[f32]) -> Vec<f32> {
        let out = vec![0.0f32; x.len()];
        let map = ElementMap {
            x: operand(x),
            out: operand(&out),
            op,
        };
        map.check().unwrap();
        // SAFETY: operands are live vectors of the shape given.
        unsafe { map.run(2) };
        out
    }

    #[test]
    fn scale_with_bias_rounds_once() {
        let x = [1.0f32 + f32::EPSILON, 3.0, -2.5];
        let s = 1.0f32 - f32::EPSILON;
        let y = run(MapOp::Scale { s, b: -1.0 }, &x);
        // the exact product minus one, rounded once (a separate product would round to 0)
        let exact = f64::from(x[0]) * f64::from(s) - 1.0;
        assert_eq!(y[0], exact as f32);
        assert_ne!(y[0], x[0] * s - 1.0);
        assert_eq!(run(MapOp::Scale { s: 0.5, b: 0.0 }, &x)[2], -1.25);
    }

    #[test]
    fn gelu_uses_the_table_inside_the_clamps() {
        // a table whose entry is its own index makes the lookup visible
        let table: Vec<f32> = (0..GELU_TABLE_LEN).map(|i| i as f32).collect();
        let t = table.as_ptr();
        let x = [-10.0f32, 10.0, 12.5, 1.0, -11.0];
        let y = run(MapOp::Gelu { table: t }, &x);
        assert_eq!(y, [0.0, 10.0, 12.5, f32::from(0x3c00u16), 0.0]);
    }

    #[test]
    fn tanh_runs_over_threads_like_one() {
        let x: Vec<f32> = (0..5000).map(|i| (i as f32 - 2500.0) * 1e-3).collect();
        let y = run(MapOp::Tanh, &x);
        for (a, b) in x.iter().zip(&y) {
            assert_eq!(((*a as f64).tanh() as f32).to_bits(), b.to_bits());
        }
    }
}
