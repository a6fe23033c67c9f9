//! Weight rows against activation rows by one row dot per pair (ggml's vec_dot), in tiles that
//! stay in cache: a portable build and one compiled for AVX2+FMA+F16C, the same float operations
//! in the same order (bit-identical).

use super::row_dot::RowDot;
use crate::kernels::cpu::simd_active;
use crate::kernels::operand::{RowsFn, RowsJob};

/// Most weight rows per tile.
pub const TILE_ROWS: usize = 16;
/// Activation rows per block (with a weight tile, a working set of L2 size).
const ACT_BLOCK: usize = 16;
/// Activation rows the multi-row kernels take per weight row (each weight block decoded once
/// for all of them; 64 q8_K rows of K = 4096 are 300 KB, L2-resident).
const GEMM_ACT_BLOCK: usize = 64;

/// Weight rows `first..first + out.len() / rows` against every activation row;
/// `out[(i - first) * rows + r]`.
#[inline(always)]
fn rows_impl<D: RowDot, const SIMD: bool>(job: RowsJob<'_>) {
    let (w, stride, first, k, act, out, gemm) = job.into_parts();
    let n = act.rows;
    let wrow_bytes = k / D::BLOCK * D::BLOCK_BYTES;
    let rows_total = out.len() / n.max(1);
    let dot1 = |i: usize, r: usize| -> f32 {
        let at = (first + i) * stride;
        let wr = &w[at..at + wrow_bytes];
        if SIMD {
            // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection.
            unsafe { D::dot_simd(wr, act.row(r), k) }
        } else {
            D::dot(wr, act.row(r), k)
        }
    };
    if gemm {
        // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection; the K-quant
        // activations were packed (`Layout::KquantLanes`, prepared by `matmul_converted`).
        if SIMD && unsafe { D::tiled_rows_simd(RowsJob::new(w, stride, first, k, act, out, gemm)) }
        {
            return;
        }
        // the multi-row kernels decode each weight block once for a block of activation rows
        for r0 in (0..n).step_by(GEMM_ACT_BLOCK) {
            let r1 = n.min(r0 + GEMM_ACT_BLOCK);
            let xs: Vec<&[u8]> = (r0..r1).map(|r| act.row(r)).collect();
            let mut i = 0;
            if SIMD {
                // four weight rows per pass: each activation block is loaded once for four
                while i + 4 <= rows_total {
                    let ws: [&[u8]; 4] = std::array::from_fn(|j| {
                        let at = (first + i + j) * stride;
                        &w[at..at + wrow_bytes]
                    });
                    let dst = &mut out[i * n + r0..(i + 3) * n + r1];
                    // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection.
                    unsafe { D::dot_gemm_rows4_simd(ws, &xs, k, dst, n) };
                    i += 4;
                }
            }
            for i in i..rows_total {
                let at = (first + i) * stride;
                let wr = &w[at..at + wrow_bytes];
                let dst = &mut out[i * n + r0..i * n + r1];
                if SIMD {
                    // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection.
                    unsafe { D::dot_gemm_rows_simd(wr, &xs, k, dst) }
                } else {
                    D::dot_gemm_rows(wr, &xs, k, dst)
                }
            }
        }
        return;
    }
    // Blocks of activation rows × tiles of weight rows, both cache-sized, so each weight tile is
    // reused by a block of activation rows and each block by every tile (read once for decode).
    for r0 in (0..n).step_by(ACT_BLOCK) {
        let r1 = n.min(r0 + ACT_BLOCK);
        for i0 in (0..rows_total).step_by(TILE_ROWS) {
            let i1 = rows_total.min(i0 + TILE_ROWS);
            let mut r = r0;
            if SIMD {
                // four activation rows per pass: each weight block decoded once for all four
                while r + 4 <= r1 {
                    let xs = [act.row(r), act.row(r + 1), act.row(r + 2), act.row(r + 3)];
                    for i in i0..i1 {
                        let at = (first + i) * stride;
                        // SAFETY: SIMD is only true inside `rows_avx2`, entered after detection.
                        let res = unsafe { D::dot_simd4(&w[at..at + wrow_bytes], xs, k) };
                        out[i * n + r..i * n + r + 4].copy_from_slice(&res);
                    }
                    r += 4;
                }
                // and a pair (GQA decode: two query heads per KV head)
                if r + 2 <= r1 {
                    let xs = [act.row(r), act.row(r + 1)];
                    for i in i0..i1 {
                        let at = (first + i) * stride;
                        // SAFETY: as above.
                        let res = unsafe { D::dot_simd2(&w[at..at + wrow_bytes], xs, k) };
                        out[i * n + r..i * n + r + 2].copy_from_slice(&res);
                    }
                    r += 2;
                }
            }
            for r in r..r1 {
                for i in i0..i1 {
                    out[i * n + r] = dot1(i, r);
                }
            }
        }
    }
}

pub(crate) fn rows_portable<D: RowDot>(job: RowsJob<'_>) {
    rows_impl::<D, false>(job)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_avx2<D: RowDot>(job: RowsJob<'_>) {
    rows_impl::<D, true>(job)
}

/// [`rows_avx2`] behind a safe signature, for the SIMD table.
#[cfg(target_arch = "x86_64")]
pub(crate) fn rows_simd<D: RowDot>(job: RowsJob<'_>) {
    // SAFETY: only the SIMD table and `rows_fn` hand this out, after simd_active() checked
    // AVX2, FMA and F16C on this CPU.
    unsafe { rows_avx2::<D>(job) }
}

/// The rows function of a type outside the table (a re-laid format) for the build this CPU
/// runs now.
pub fn rows_fn<D: RowDot>() -> RowsFn {
    #[cfg(target_arch = "x86_64")]
    {
        if simd_active() {
            return rows_simd::<D>;
        }
    }
    rows_portable::<D>
}
