//! Row-wise ops of a decode step, computed like ggml's CPU backend (`ops.cpp`, `vec.h`):
//!
//! * RMS_NORM — `Σ x²` in double, `mean` rounded to float, `y = x · (1 / sqrtf(mean + eps))`;
//! * ROPE (normal, neox; f32) — ggml's running `theta *= theta_scale` in float32, YaRN ramp,
//!   the C library's cosf/sinf (as ggml), rotation with fused multiply-adds;
//! * SWIGLU (f32) — `silu(x)·g` with ggml's AVX2 `ggml_v_expf` on 8-lane chunks and libm's
//!   `expf` on the tail;
//! * SET_ROWS / GET_ROWS / CPY between f32 and f16 (round to nearest even) or f32 and f32.

use super::cpu::use_avx2;
use super::error::KernelError;
use super::expf8::v_expf;
use super::operand::Operand;
use crate::kernels::f16vec::{f16_row_to_f32, f32_row_to_f16};

/// Below this many elements an op runs on the calling thread (spawning costs more).
const MIN_PARALLEL: usize = 1 << 16;
/// The same for SOFT_MAX, ~6 cycles per element (the vector expf and its double sum): a
/// decode step's 16 heads × 256 positions took 7 µs on one thread.
const MIN_PARALLEL_SOFT_MAX: usize = 1 << 12;

/// Element type of a row copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
}

impl Elem {
    pub fn size(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::F16 => 2,
        }
    }
}

/// Precomputed ROPE constants of one node.
#[derive(Clone, Debug)]
pub struct Rope {
    pub n_dims: usize,
    pub neox: bool,
    pub n_offs: usize,
    pub theta_scale: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub mscale: f32,
    /// `rope_yarn_ramp(..) · ext_factor` per rotated pair
    pub ramp_mix: Vec<f32>,
}

/// ggml_rope_yarn_corr_dims in float32, logs correctly rounded.
fn corr_dims(
    n_dims: usize,
    n_ctx_orig: i32,
    freq_base: f32,
    beta_fast: f32,
    beta_slow: f32,
) -> (f32, f32) {
    let corr_dim = |n_rot: f32| -> f32 {
        let denom = (n_rot * 2.0) * std::f32::consts::PI;
        let inner = n_ctx_orig as f32 / denom;
        let num = n_dims as f32 * ((inner as f64).ln() as f32);
        num / (2.0 * ((freq_base as f64).ln() as f32))
    };
    let start = corr_dim(beta_fast).floor();
    let end = corr_dim(beta_slow).ceil();
    (start.max(0.0), end.min(n_dims as f32 - 1.0))
}

impl Rope {
    /// From ROPE's op params (modes NORMAL = 0 and NEOX = 2 only).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        n_dims: usize,
        mode: i32,
        n_ctx_orig: i32,
        n_offs: usize,
        freq_base: f32,
        freq_scale: f32,
        ext_factor: f32,
        attn_factor: f32,
        beta_fast: f32,
        beta_slow: f32,
    ) -> Result<Self, KernelError> {
        if mode != 0 && mode != 2 {
            return Err(KernelError::new(format!(
                "rope mode {mode} is not normal/neox"
            )));
        }
        if n_dims == 0 || !n_dims.is_multiple_of(2) || !n_offs.is_multiple_of(2) {
            return Err(KernelError::new("rope: n_dims and n_offs must be even"));
        }
        let theta_scale = (freq_base as f64).powf((-2.0f32 / n_dims as f32) as f64) as f32;
        let (lo, hi) = corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow);
        let ramp_mix = (0..n_dims / 2)
            .map(|k| {
                let y = (k as f32 - lo) / 0.001f32.max(hi - lo);
                (1.0 - 1.0f32.min(0.0f32.max(y))) * ext_factor
            })
            .collect();
        let mut mscale = attn_factor;
        if ext_factor != 0.0 {
            let l = ((1.0f32 / freq_scale) as f64).ln() as f32;
            mscale *= 1.0 + 0.1 * l;
        }
        Ok(Self {
            n_dims,
            neox: mode == 2,
            n_offs,
            theta_scale,
            freq_scale,
            ext_factor,
            mscale,
            ramp_mix,
        })
    }

    /// cos, sin interleaved per pair for position `p` (ggml_rope_cache_init).
    #[inline(always)]
    fn cache(&self, p: i32, freq_factors: Option<*const f32>, out: &mut [f32]) {
        let mut theta = p as f32;
        for (i, pair) in out.chunks_exact_mut(2).enumerate() {
            // SAFETY: freq_factors holds >= n_dims / 2 values (checked at build time).
            let ff = freq_factors.map_or(1.0, |f| unsafe { f.add(i).read_unaligned() });
            let extrap = theta / ff;
            let interp = self.freq_scale * extrap;
            let t = if self.ext_factor != 0.0 {
                let mix = self.ramp_mix[i];
                interp.mul_add(1.0 - mix, extrap * mix)
            } else {
                interp
            };
            // the C library's cosf/sinf, as ggml calls them (glibc's are not correctly
            // rounded; the reference's and the host's give the same bits)
            pair[0] = t.cos() * self.mscale;
            pair[1] = t.sin() * self.mscale;
            theta *= self.theta_scale;
        }
    }

    #[inline(always)]
    fn rotate(&self, cache: &[f32], src: &[f32], dst: &mut [f32]) {
        let half = self.n_dims / 2;
        let off = self.n_offs;
        for i in 0..half {
            let (c, s) = (cache[2 * i], cache[2 * i + 1]);
            let (a, b) = if self.neox {
                (off + i, off + i + half)
            } else {
                (off + 2 * i, off + 2 * i + 1)
            };
            let (x0, x1) = (src[a], src[b]);
            dst[a] = x0.mul_add(c, -(x1 * s));
            dst[b] = x0.mul_add(s, x1 * c);
        }
    }
}

/// Element-wise binary op of ADD / SUB / MUL / DIV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinOp {
    #[inline(always)]
    fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            BinOp::Add => a + b,
            BinOp::Sub => a - b,
            BinOp::Mul => a * b,
            BinOp::Div => a / b,
        }
    }
}

/// One prepared row-wise node.
#[derive(Clone, Debug)]
pub enum RowOp {
    RmsNorm {
        x: Operand,
        out: Operand,
        eps: f32,
    },
    Rope {
        x: Operand,
        out: Operand,
        pos: *const i32,
        freq_factors: Option<*const f32>,
        rope: Box<Rope>,
    },
    /// `out = silu(x) · g`, rows of `out.ne[0]`.
    Swiglu {
        x: Operand,
        g: Operand,
        out: Operand,
    },
    /// `dst[idx[i1, i2 % ne11, i3 % ne12], i2, i3] = src[i1, i2, i3]` (ggml SET_ROWS).
    SetRows {
        src: Operand,
        idx: Operand,
        idx_i64: bool,
        dst: Operand,
        dst_elem: Elem,
    },
    /// `out[i1, i2, i3] = src[idx[i1, i2, i3 % ..], i2, i3]` (ggml GET_ROWS, index ne = out ne1..3).
    GetRows {
        src: Operand,
        src_elem: Elem,
        idx: Operand,
        out: Operand,
    },
    /// `out = a op b`, f32, `b` repeated over `a` by modulo in every dim (ggml's broadcast).
    Binary {
        a: Operand,
        b: Operand,
        out: Operand,
        op: BinOp,
    },
    /// SOFT_MAX of f32 rows: `x·scale (+ slope·mask)`, optional sinks per head (ne2).
    SoftMax {
        x: Operand,
        out: Operand,
        mask: Option<(Operand, Elem)>,
        sinks: Option<*const f32>,
        scale: f32,
        max_bias: f32,
    },
    /// Same-shape copy with conversion.
    Copy {
        src: Operand,
        src_elem: Elem,
        dst: Operand,
        dst_elem: Elem,
    },
}

// SAFETY: see NativeStep; the pointers are only used by the threads of one call, which write
// disjoint rows.
unsafe impl Send for RowOp {}
unsafe impl Sync for RowOp {}

/// Rows of a 4-D operand as (i1, i2, i3) in ggml order.
fn row_index(ne: &[usize; 4], r: usize) -> (usize, usize, usize) {
    let i1 = r % ne[1];
    let i2 = (r / ne[1]) % ne[2];
    let i3 = r / (ne[1] * ne[2]);
    (i1, i2, i3)
}

#[inline]
unsafe fn row_ptr(op: &Operand, i1: usize, i2: usize, i3: usize) -> *const u8 {
    unsafe { op.ptr.add(i1 * op.nb[1] + i2 * op.nb[2] + i3 * op.nb[3]) }
}

/// Element (i0, i1, i2) of an index tensor (ggml's rows index `[n, ne11, ne12]`).
#[inline]
unsafe fn elem_ptr(op: &Operand, i0: usize, i1: usize, i2: usize) -> *const u8 {
    unsafe { op.ptr.add(i0 * op.nb[0] + i1 * op.nb[1] + i2 * op.nb[2]) }
}

/// The row id at element (i0, i1, i2) of an index tensor (i64 or i32 ids), if it is below
/// `rows`.
#[inline]
unsafe fn row_id(
    idx: &Operand,
    (i0, i1, i2): (usize, usize, usize),
    i64_ids: bool,
    rows: usize,
) -> Option<usize> {
    let ip = unsafe { elem_ptr(idx, i0, i1, i2) };
    let id = if i64_ids {
        unsafe { (ip as *const i64).read_unaligned() }
    } else {
        i64::from(unsafe { (ip as *const i32).read_unaligned() })
    };
    (id >= 0 && (id as u64) < rows as u64).then_some(id as usize)
}

#[inline]
unsafe fn f32_row<'a>(op: &Operand, i1: usize, i2: usize, i3: usize, n: usize) -> &'a [f32] {
    unsafe { std::slice::from_raw_parts(row_ptr(op, i1, i2, i3) as *const f32, n) }
}

#[inline]
unsafe fn f32_row_mut<'a>(
    op: &Operand,
    i1: usize,
    i2: usize,
    i3: usize,
    n: usize,
) -> &'a mut [f32] {
    unsafe { std::slice::from_raw_parts_mut(row_ptr(op, i1, i2, i3) as *mut f32, n) }
}

/// ggml_vec_swiglu_f32 (AVX2 build): 8-lane chunks with `ggml_v_silu`, the tail with expf.
/// Raw pointers: the output may be one of the inputs (in place).
///
/// # Safety
/// `x`, `g` readable and `y` writable for `n` floats.
#[inline(always)]
unsafe fn swiglu_row(x: *const f32, g: *const f32, y: *mut f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: features detected; pointers per this function's contract.
        return unsafe { super::expf8::swiglu_row(x, g, y, n) };
    }
    let np = n & !7;
    for i in 0..n {
        // SAFETY: i < n.
        unsafe {
            let xi = x.add(i).read();
            let e = if i < np {
                v_expf(0.0 - xi)
            } else {
                (-xi).exp()
            };
            y.add(i).write((xi / (1.0 + e)) * g.add(i).read());
        }
    }
}

/// ggml's `ggml_vec_max_f32`: `max = max > v ? max : v` left to right from −inf.
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: features detected. Lane-wise maxima equal the left-to-right one unless a
        // NaN is present (then the scalar order decides).
        if let Some(m) = unsafe { super::expf8::max_row_no_nan(x) } {
            return m;
        }
    }
    x.iter()
        .fold(f32::NEG_INFINITY, |m, &v| if m > v { m } else { v })
}

/// ggml_vec_soft_max_f32 (AVX2 build): `y = exp(x - max)` with the vector expf on 8-lane
/// chunks (each chunk summed in float32 in the SSE order, then added in double), expf on the tail.
#[inline(always)]
pub(crate) fn soft_max_row(x: &[f32], y: &mut [f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if use_avx2() {
        // SAFETY: features detected.
        return unsafe { super::expf8::soft_max_row(x, y, max) };
    }
    let n = x.len();
    let np = n & !7;
    let mut sum = 0.0f64;
    for i in (0..np).step_by(8) {
        let mut v = [0.0f32; 8];
        for l in 0..8 {
            v[l] = v_expf(x[i + l] - max);
            y[i + l] = v[l];
        }
        let h: [f32; 4] = std::array::from_fn(|l| v[l + 4] + v[l]);
        sum += f64::from((h[0] + h[2]) + (h[1] + h[3]));
    }
    for i in np..n {
        let v = (x[i] - max).exp();
        sum += f64::from(v);
        y[i] = v;
    }
    sum
}

/// ALiBi slope of head `h` (ggml's m0/m1 powers); 1 without max_bias.
fn alibi_slope(h: usize, n_head: usize, max_bias: f32) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1u32 << (n_head as f64).log2().floor() as u32;
    let m0 = 2.0f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2.0f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    let h = h as u32;
    if h < n_head_log2 {
        m0.powf((h + 1) as f32)
    } else {
        m1.powf((2 * (h - n_head_log2) + 1) as f32)
    }
}

impl RowOp {
    /// (rows, elements) of the work, for threading.
    fn shape(&self) -> (usize, usize) {
        let ne = match self {
            RowOp::RmsNorm { out, .. } | RowOp::Rope { out, .. } | RowOp::Swiglu { out, .. } => {
                out.ne
            }
            RowOp::GetRows { out, .. } | RowOp::Binary { out, .. } | RowOp::SoftMax { out, .. } => {
                out.ne
            }
            RowOp::SetRows { src, .. } | RowOp::Copy { src, .. } => src.ne,
        };
        let rows = ne[1] * ne[2] * ne[3];
        (rows, rows * ne[0])
    }

    /// # Safety
    /// Operands must be valid for their shapes and strides during the call (checked when the
    /// step was built); outputs must not overlap inputs except exactly (in place).
    /// Returns false when some row index (SET_ROWS / GET_ROWS data) was out of range; those
    /// rows are left untouched.
    pub unsafe fn run(&self, threads: usize) -> bool {
        let (rows, elems) = self.shape();
        let min_parallel = match self {
            RowOp::SoftMax { .. } => MIN_PARALLEL_SOFT_MAX,
            _ => MIN_PARALLEL,
        };
        let threads = if elems < min_parallel {
            1
        } else {
            threads.clamp(1, rows.max(1))
        };
        if threads == 1 {
            return unsafe { self.rows(0, rows) };
        }
        let per = rows.div_ceil(threads);
        crate::kernels::pool::all(threads, threads, |t| {
            let (r0, r1) = (t * per, ((t + 1) * per).min(rows));
            // SAFETY: disjoint output rows per task.
            r0 >= r1 || unsafe { self.rows(r0, r1) }
        })
    }

    /// Rows `r0..r1`, compiled for FMA where the CPU has it (the scalar `mul_add`s of rope,
    /// SiLU's vector expf ... become single instructions; the results are the same bits).
    unsafe fn rows(&self, r0: usize, r1: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        if use_avx2() {
            // SAFETY: the features were detected; the rest per run()'s contract.
            return unsafe { self.rows_fma(r0, r1) };
        }
        unsafe { self.rows_any(r0, r1) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn rows_fma(&self, r0: usize, r1: usize) -> bool {
        unsafe { self.rows_any(r0, r1) }
    }

    #[inline(always)]
    unsafe fn rows_any(&self, r0: usize, r1: usize) -> bool {
        let mut ok = true;
        match self {
            RowOp::RmsNorm { x, out, eps } => {
                let n = x.ne[0];
                for r in r0..r1 {
                    let (i1, i2, i3) = row_index(&x.ne, r);
                    // raw pointers: out may be x (in place)
                    let xp = unsafe { row_ptr(x, i1, i2, i3) } as *const f32;
                    let yp = unsafe { row_ptr(out, i1, i2, i3) } as *mut f32;
                    let mut sum = 0.0f64;
                    for i in 0..n {
                        let v = unsafe { xp.add(i).read() };
                        sum += f64::from(v * v);
                    }
                    let mean = (sum / n as f64) as f32;
                    let scale = 1.0f32 / (mean + eps).sqrt();
                    for i in 0..n {
                        unsafe { yp.add(i).write(xp.add(i).read() * scale) };
                    }
                }
            }
            RowOp::Rope {
                x,
                out,
                pos,
                freq_factors,
                rope,
            } => {
                let n = x.ne[0];
                let mut cache = vec![0.0f32; rope.n_dims];
                let mut last_i2 = usize::MAX;
                let in_place = x.ptr == out.ptr && x.nb == out.nb;
                for r in r0..r1 {
                    let (i1, i2, i3) = row_index(&x.ne, r);
                    if i2 != last_i2 {
                        let p = unsafe { pos.add(i2).read_unaligned() };
                        rope.cache(p, *freq_factors, &mut cache);
                        last_i2 = i2;
                    }
                    if in_place {
                        let dst = unsafe { f32_row_mut(out, i1, i2, i3, n) };
                        let copy: Vec<f32> = dst.to_vec();
                        rope.rotate(&cache, &copy, dst);
                    } else {
                        let src = unsafe { f32_row(x, i1, i2, i3, n) };
                        let dst = unsafe { f32_row_mut(out, i1, i2, i3, n) };
                        dst.copy_from_slice(src);
                        rope.rotate(&cache, src, dst);
                    }
                }
            }
            RowOp::Swiglu { x, g, out } => {
                let n = out.ne[0];
                for r in r0..r1 {
                    let (i1, i2, i3) = row_index(&out.ne, r);
                    unsafe {
                        swiglu_row(
                            row_ptr(x, i1, i2, i3) as *const f32,
                            row_ptr(g, i1, i2, i3) as *const f32,
                            row_ptr(out, i1, i2, i3) as *mut f32,
                            n,
                        )
                    };
                }
            }
            RowOp::SetRows {
                src,
                idx,
                idx_i64,
                dst,
                dst_elem,
            } => {
                let n = src.ne[0];
                for r in r0..r1 {
                    let (i1, i2, i3) = row_index(&src.ne, r);
                    let at = (i1, i2 % idx.ne[1], i3 % idx.ne[2]);
                    let Some(t) = (unsafe { row_id(idx, at, *idx_i64, dst.ne[1]) }) else {
                        ok = false;
                        continue;
                    };
                    let xs = unsafe { f32_row(src, i1, i2, i3, n) };
                    let dp = unsafe { row_ptr(dst, t, i2, i3) };
                    unsafe { store_row(xs, dp as *mut u8, *dst_elem) };
                }
            }
            RowOp::GetRows {
                src,
                src_elem,
                idx,
                out,
            } => {
                let n = out.ne[0];
                for r in r0..r1 {
                    let (i1, i2, i3) = row_index(&out.ne, r);
                    let Some(s) = (unsafe { row_id(idx, (i1, i2, i3), false, src.ne[1]) }) else {
                        ok = false;
                        continue;
                    };
                    let sp = unsafe { row_ptr(src, s, i2, i3) };
                    let ys = unsafe { f32_row_mut(out, i1, i2, i3, n) };
                    unsafe { load_row(sp, *src_elem, ys) };
                }
            }
            RowOp::SoftMax {
                x,
                out,
                mask,
                sinks,
                scale,
                max_bias,
            } => {
                let n = x.ne[0];
                let mut w = vec![0.0f32; n];
                let mut mv = vec![0.0f32; if mask.is_some() { n } else { 0 }];
                for r in r0..r1 {
                    let (i1, i2, i3) = row_index(&x.ne, r);
                    let slope = alibi_slope(i2, x.ne[2], *max_bias);
                    let xs = unsafe { f32_row(x, i1, i2, i3, n) };
                    for (wi, xi) in w.iter_mut().zip(xs) {
                        *wi = xi * scale;
                    }
                    if let Some((m, elem)) = mask {
                        let mp = unsafe { row_ptr(m, i1, i2 % m.ne[2], i3 % m.ne[3]) };
                        unsafe { load_row(mp, *elem, &mut mv) };
                        for (wi, mi) in w.iter_mut().zip(&mv) {
                            // ggml's `wp[i] += slope*mask[i]`, contracted to an fma
                            *wi = slope.mul_add(*mi, *wi);
                        }
                    }
                    let mut max = row_max(&w);
                    let sink = sinks.map(|sk| unsafe { sk.add(i2).read_unaligned() });
                    if let Some(sk) = sink {
                        max = if max > sk { max } else { sk };
                    }
                    let ys = unsafe { f32_row_mut(out, i1, i2, i3, n) };
                    let mut sum = soft_max_row(&w, ys, max);
                    if let Some(sk) = sink {
                        sum += f64::from((sk - max).exp());
                    }
                    let inv = (1.0 / sum) as f32;
                    ys.iter_mut().for_each(|y| *y *= inv);
                }
            }
            RowOp::Binary { a, b, out, op } => {
                let n = out.ne[0];
                let nb0 = b.ne[0];
                for r in r0..r1 {
                    let (i1, i2, i3) = row_index(&out.ne, r);
                    // raw pointers: out may be a or b (in place)
                    let ap = unsafe { row_ptr(a, i1, i2, i3) } as *const f32;
                    let bp = unsafe { row_ptr(b, i1 % b.ne[1], i2 % b.ne[2], i3 % b.ne[3]) }
                        as *const f32;
                    let yp = unsafe { row_ptr(out, i1, i2, i3) } as *mut f32;
                    if nb0 == n {
                        for i in 0..n {
                            unsafe {
                                yp.add(i)
                                    .write(op.apply(ap.add(i).read(), bp.add(i).read()))
                            };
                        }
                    } else {
                        for i in 0..n {
                            let v = unsafe { op.apply(ap.add(i).read(), bp.add(i % nb0).read()) };
                            unsafe { yp.add(i).write(v) };
                        }
                    }
                }
            }
            RowOp::Copy {
                src,
                src_elem,
                dst,
                dst_elem,
            } => {
                let n = src.ne[0];
                let mut tmp = vec![0.0f32; n];
                for r in r0..r1 {
                    let (i1, i2, i3) = row_index(&src.ne, r);
                    let sp = unsafe { row_ptr(src, i1, i2, i3) };
                    let dp = unsafe { row_ptr(dst, i1, i2, i3) } as *mut u8;
                    match (src_elem, dst_elem) {
                        (Elem::F32, _) => {
                            let xs = unsafe { std::slice::from_raw_parts(sp as *const f32, n) };
                            unsafe { store_row(xs, dp, *dst_elem) };
                        }
                        (Elem::F16, Elem::F32) => {
                            let ys = unsafe { std::slice::from_raw_parts_mut(dp as *mut f32, n) };
                            unsafe { load_row(sp, Elem::F16, ys) };
                        }
                        (Elem::F16, Elem::F16) => unsafe {
                            load_row(sp, Elem::F16, &mut tmp);
                            store_row(&tmp, dp, Elem::F16);
                        },
                    }
                }
            }
        }
        ok
    }
}

/// float32 values into a row of `elem` at `dst` (f16: round to nearest even).
unsafe fn store_row(xs: &[f32], dst: *mut u8, elem: Elem) {
    match elem {
        Elem::F32 => unsafe { std::ptr::copy(xs.as_ptr(), dst as *mut f32, xs.len()) },
        Elem::F16 => {
            let out = unsafe { std::slice::from_raw_parts_mut(dst as *mut u16, xs.len()) };
            f32_row_to_f16(xs, out);
        }
    }
}

/// A row of `elem` at `src` as float32 values.
unsafe fn load_row(src: *const u8, elem: Elem, out: &mut [f32]) {
    match elem {
        Elem::F32 => unsafe { std::ptr::copy(src as *const f32, out.as_mut_ptr(), out.len()) },
        Elem::F16 => {
            let xs = unsafe { std::slice::from_raw_parts(src as *const u16, out.len()) };
            f16_row_to_f32(xs, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v_expf_is_close_to_exp() {
        for i in -1700..1700 {
            let x = i as f32 * 0.05; // |x| < 85: finite results
            let (a, b) = (v_expf(x), x.exp());
            assert!(
                (a - b).abs() <= b * 4e-7 + f32::MIN_POSITIVE,
                "x={x} {a} {b}"
            );
        }
        assert_eq!(v_expf(-200.0), 0.0);
        assert!(v_expf(100.0).is_infinite());
    }
}
