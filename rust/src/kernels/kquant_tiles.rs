//! The summation order of ggml's tiled K-quant MUL_MAT (ggml-cpu `tiled/`), which the reference
//! CPU backend runs instead of `ggml_vec_dot_*_q8_K` for Q2_K…Q6_K and IQ4_XS weights once a
//! MUL_MAT has at least [`TILED_MIN_ROWS`] activation rows.
//!
//! Per (weight row, activation row) and per 256-element slab (one weight super-block and one
//! q8_K block), the tiled kernel forms two exact integers: `s1 = Σ_sub scale · Σ q_w · q_x`
//! (with the format's code bias removed through the activation block sums) and, for formats
//! with mins, `s2 = Σ_sub min · bsum`. Then, in float32 with FMA:
//! `res = d_w · s1` (then `res = res − dmin_w · s2`), and `acc = acc + d_x · res` over the
//! slabs in order, starting from 0. The integers are exact for every format (measured: IQ4_XS,
//! whose biased codes could saturate a `vpmaddubsw` pair, matches only without saturation).

/// The reference takes the tiled path from this many activation rows (src1 `ne[1]`) on.
pub const TILED_MIN_ROWS: usize = 8;

/// One slab's integer parts: (d_w, dmin_w, s1, s2).
pub struct Slab {
    pub d: f32,
    pub dmin: f32,
    pub s1: i32,
    pub s2: i32,
}

/// Combines the slabs of one row pair like the tiled kernel.
#[inline(always)]
pub fn accumulate(slabs: impl Iterator<Item = (f32, Slab)>, has_min: bool) -> f32 {
    let mut acc = 0.0f32;
    for (dx, s) in slabs {
        let mut res = s.d * s.s1 as f32;
        if has_min {
            res = (-s.dmin).mul_add(s.s2 as f32, res);
        }
        acc = dx.mul_add(res, acc);
    }
    acc
}
