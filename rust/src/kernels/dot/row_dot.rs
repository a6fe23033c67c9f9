//! The row dot product every weight type implements, with its portable and SIMD builds.

use crate::kernels::formats::ActFormat;
#[cfg(target_arch = "x86_64")]
use crate::kernels::operand::RowsJob;

/// A weight type's row dot product against activations in its `vec_dot_type`.
pub trait RowDot {
    /// Elements per weight block.
    const BLOCK: usize;
    /// Bytes per weight block.
    const BLOCK_BYTES: usize;
    /// The activation format ggml's CPU backend converts to.
    const ACT: ActFormat;
    /// `Σ w·x` over `k` elements (`w`, `x` hold exactly one row each).
    fn dot(w: &[u8], x: &[u8], k: usize) -> f32;

    /// [`Self::dot`] with AVX2 intrinsics where a type has them (same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_simd(w: &[u8], x: &[u8], k: usize) -> f32 {
        Self::dot(w, x, k)
    }

    /// The order of ggml's multi-row MUL_MAT path for this type: llamafile's tinyBLAS (f32,
    /// f16, bf16 when N >= 2 and M % 4 == 0; IQ4_NL): one 8-lane FMA accumulator over K (a
    /// zero-padded last step), then `hsum`; ggml's tiled kernel for the K-quants and IQ4_XS
    /// (N >= 8, [`super::kquant_tiles`]). Other types: [`Self::dot`].
    #[inline(always)]
    fn dot_gemm(w: &[u8], x: &[u8], k: usize) -> f32 {
        Self::dot(w, x, k)
    }

    /// [`Self::dot_gemm`] with AVX2 intrinsics where a type has them (same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_gemm_simd(w: &[u8], x: &[u8], k: usize) -> f32 {
        Self::dot_gemm(w, x, k)
    }

    /// `out[r] =` [`Self::dot_gemm`] of `w` and `xs[r]`; types with a multi-row kernel decode
    /// each weight block once for all rows.
    #[inline(always)]
    fn dot_gemm_rows(w: &[u8], xs: &[&[u8]], k: usize, out: &mut [f32]) {
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            *o = Self::dot_gemm(w, x, k);
        }
    }

    /// [`Self::dot_gemm_rows`] with AVX2 intrinsics where a type has them (same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_gemm_rows_simd(w: &[u8], xs: &[&[u8]], k: usize, out: &mut [f32]) {
        for (x, o) in xs.iter().zip(out.iter_mut()) {
            // SAFETY: forwarded from the caller.
            *o = unsafe { Self::dot_gemm_simd(w, x, k) };
        }
    }

    /// [`Self::dot_gemm_rows_simd`] for four weight rows: `out[i · out_stride + r]` for weight
    /// row `ws[i]` and activation row `xs[r]`; types with a four-row kernel share each
    /// activation block among the rows.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_gemm_rows4_simd(
        ws: [&[u8]; 4],
        xs: &[&[u8]],
        k: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        for (i, w) in ws.iter().enumerate() {
            let dst = &mut out[i * out_stride..i * out_stride + xs.len()];
            // SAFETY: forwarded from the caller.
            unsafe { Self::dot_gemm_rows_simd(w, xs, k, dst) };
        }
    }

    /// The many-row path of the K-quant formats ([`super::kquant_gemm::rows`]) over activations
    /// packed by [`crate::kernels::dot::kquant_gemm::pack`]; `false` (nothing done) for other types.
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; for the K-quant formats `act` is packed.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn tiled_rows_simd(_job: RowsJob<'_>) -> bool {
        false
    }

    /// [`Self::dot_simd`] for four activation rows at once (each result the same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_simd4(w: &[u8], xs: [&[u8]; 4], k: usize) -> [f32; 4] {
        // SAFETY: forwarded from the caller.
        xs.map(|x| unsafe { Self::dot_simd(w, x, k) })
    }

    /// [`Self::dot_simd`] for two activation rows at once (each result the same bits).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[inline(always)]
    unsafe fn dot_simd2(w: &[u8], xs: [&[u8]; 2], k: usize) -> [f32; 2] {
        // SAFETY: forwarded from the caller.
        xs.map(|x| unsafe { Self::dot_simd(w, x, k) })
    }
}
