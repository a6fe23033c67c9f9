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
use super::cpu::use_avx2;
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

/// GELU of `x` whose f16 bits are `bits`: 0 at or below −10, `x` at or above 10, else the
/// table's entry.
#[inline(always)]
fn gelu(table: *const f32, x: f32, bits: u16) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        // SAFETY: the table has an entry for every u16 (checked when the step was built).
        unsafe { table.add(usize::from(bits)).read() }
    }
}

/// The GELU table's runs over `n` values at `x`: `put(i, gelu(x[i]))` in chunks whose f16
/// bits are converted at once.
///
/// # Safety
/// `x` readable for `n` floats.
#[inline(always)]
unsafe fn gelu_span(table: *const f32, x: *const f32, n: usize, mut put: impl FnMut(usize, f32)) {
    let mut bits = [0u16; CHUNK];
    for c in (0..n).step_by(CHUNK) {
        let len = CHUNK.min(n - c);
        // SAFETY: values c..c + len of x.
        unsafe { f16_bits(x.add(c), len, &mut bits) };
        for (j, &b) in bits[..len].iter().enumerate() {
            // SAFETY: c + j < n.
            put(c + j, gelu(table, unsafe { x.add(c + j).read() }, b));
        }
    }
}

/// The f16 bits of `n` values at `x` (ggml's FP32_TO_FP16: nearest even), eight at a time with
/// F16C where the CPU has it.
///
/// # Safety
/// `x` readable for `n` floats, `n <= out.len()`.
#[inline(always)]
unsafe fn f16_bits(x: *const f32, n: usize, out: &mut [u16]) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        while i + 8 <= n {
            // SAFETY: F16C comes with the AVX2 kernels (use_avx2); 8 values from i.
            unsafe { f16_bits8(x.add(i), out[i..i + 8].as_mut_ptr()) };
            i += 8;
        }
    }
    for (j, bits) in out.iter_mut().enumerate().take(n).skip(i) {
        // SAFETY: j < n.
        *bits = f32_to_fp16(unsafe { x.add(j).read() });
    }
}

/// # Safety
/// The CPU must support F16C; `x` readable and `out` writable for 8 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_bits8(x: *const f32, out: *mut u16) {
    use std::arch::x86_64::*;
    unsafe {
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x));
        _mm_storeu_si128(out as *mut __m128i, h);
    }
}

/// Elements converted to table indices per pass.
const CHUNK: usize = 256;

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
        let (n, rows) = (ne[0], ne[1] * ne[2] * ne[3]);
        let total = rows * n;
        let min = match self.op {
            MapOp::Tanh => MIN_PARALLEL_TANH,
            _ => MIN_PARALLEL,
        };
        let threads = if total < min { 1 } else { threads.max(1) };
        // the elements in row order, split evenly: a decode step's logits are one long row
        let per = total.div_ceil(threads).max(1);
        pool::run(threads, total.div_ceil(per), &|t| {
            let (a, b) = (t * per, ((t + 1) * per).min(total));
            for r in a / n..b.div_ceil(n) {
                let (lo, hi) = (a.max(r * n) - r * n, b.min(r * n + n) - r * n);
                // SAFETY: per this function's contract; task t alone writes its elements.
                unsafe { self.span(r, lo, hi) };
            }
        });
    }

    /// Elements `lo..hi` of row `r`. Raw pointers: `out` may be `x` (or the gate), each
    /// element written after its inputs are read.
    unsafe fn span(&self, r: usize, lo: usize, hi: usize) {
        let x = (self.x.row_start(r) as *const f32).wrapping_add(lo);
        let y = (self.out.row_start(r) as *mut f32).wrapping_add(lo);
        let n = hi - lo;
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
            MapOp::Gelu { table } => unsafe {
                gelu_span(table, x, n, |i, v| y.add(i).write(v));
            },
            MapOp::Geglu { table, g } => {
                // ggml's geglu: 0 at or below −10 (not 0 · g), else the gelu value times g
                let gp = (g.row_start(r) as *const f32).wrapping_add(lo);
                unsafe {
                    gelu_span(table, x, n, |i, v| {
                        let zero = x.add(i).read() <= -10.0;
                        y.add(i)
                            .write(if zero { 0.0 } else { v * gp.add(i).read() });
                    })
                };
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
    fn a_long_row_splits_over_threads_like_one() {
        let x: Vec<f32> = (0..70001).map(|i| (i as f32 - 35000.0) * 1e-4).collect();
        let y = run(MapOp::Scale { s: 0.5, b: 0.25 }, &x);
        for (a, b) in x.iter().zip(&y) {
            assert_eq!(a.mul_add(0.5, 0.25).to_bits(), b.to_bits());
        }
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
