//! The portable register tiles of the float-weight matmul ([`super::float`]) in tinyBLAS's
//! order, the horizontal sum the SIMD tiles share (same additions in the same order), and the
//! tile store the other many-row kernels share.

use super::widened::element;
use crate::kernels::dot::lanes::hsum8;
use crate::kernels::formats::ActFormat;
use crate::kernels::operand::RowsJob;

/// Weight rows per micro-tile and activation rows per micro-tile.
pub(crate) const MR: usize = 4;
pub(crate) const NR: usize = 3;
/// Bytes of widened weight rows kept at once (half of a 512 KiB L2).
pub(crate) const PANEL_BYTES: usize = 192 * 1024;
/// Bytes of activation rows walked per panel (the rest of L2).
pub(crate) const XBLOCK_BYTES: usize = 256 * 1024;

/// Weight rows `first..first + out.len() / n` (type `fmt`, `stride` bytes apart) against every
/// widened activation row; `out[(i - first) * n + r]`. The portable build; the SIMD ones are
/// [`super::float_avx2`] and [`super::float_avx512`].
pub(crate) fn rows(fmt: ActFormat, job: RowsJob<'_>) {
    let (w, stride, first, k, act, out, _) = job.into_parts();
    let n = act.rows;
    if n == 0 {
        return;
    }
    let kp = k.next_multiple_of(8);
    assert!(act.row_bytes == super::widened::widened_row_bytes(k));
    // the rows packed kp apart
    let x: Vec<f32> = super::widened::widened(act)
        .chunks_exact(act.row_bytes)
        .flat_map(|row| row[..kp * 4].chunks_exact(4))
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let rows_total = out.len() / n;
    let panel_rows = (PANEL_BYTES / (kp * 4)).clamp(MR, 16) / MR * MR;
    let xblock = ((XBLOCK_BYTES / (kp * 4)).max(NR) / NR * NR).min(n.next_multiple_of(NR));
    let mut panel = vec![0.0f32; panel_rows * kp];
    let elem = fmt.block_bytes();
    for t0 in (0..rows_total).step_by(panel_rows) {
        let t1 = rows_total.min(t0 + panel_rows);
        for (j, dst) in panel.chunks_exact_mut(kp).enumerate() {
            dst.fill(0.0);
            if t0 + j < t1 {
                let at = (first + t0 + j) * stride;
                let src = &w[at..at + k * elem];
                for (i, d) in dst[..k].iter_mut().enumerate() {
                    *d = element(fmt, src, i);
                }
            }
        }
        for r0 in (0..n).step_by(xblock) {
            let r1 = n.min(r0 + xblock);
            for q in (0..t1 - t0).step_by(MR) {
                let p = &panel[q * kp..(q + MR) * kp];
                for r in (r0..r1).step_by(NR) {
                    // rows past the block repeat its last row; their results are dropped
                    let xr: [usize; NR] = std::array::from_fn(|j| (r + j).min(r1 - 1));
                    let res = tile_portable(p, &x, xr, kp);
                    store_tile(out, &res, t0 + q, t1, n, r, r1);
                }
            }
        }
    }
}

/// A register tile's results (`res[i][j]`: weight row `row0 + i`, activation row `r + j`) into
/// `out[row][col]`, leaving out the rows from `row_end` and the columns from `col_end` that the
/// tile only computed to stay whole.
#[inline(always)]
pub(crate) fn store_tile<const M: usize, const N: usize>(
    out: &mut [f32],
    res: &[[f32; N]; M],
    row0: usize,
    row_end: usize,
    n: usize,
    r: usize,
    col_end: usize,
) {
    let cols = (col_end - r).min(N);
    for (i, vals) in res.iter().enumerate().take(row_end.saturating_sub(row0)) {
        let dst = &mut out[(row0 + i) * n + r..];
        if cols == N {
            // a fixed-size copy: inline stores (a variable one became a memcpy call per row,
            // a sixth of a short-K call)
            dst[..N].copy_from_slice(vals);
        } else {
            for (o, v) in dst.iter_mut().zip(vals).take(cols) {
                *o = *v;
            }
        }
    }
}

/// `[row][col]` results of an MR × NR tile: each output one 8-lane FMA chain over K, then hsum.
pub(crate) fn tile_portable(p: &[f32], x: &[f32], xr: [usize; NR], kp: usize) -> [[f32; NR]; MR] {
    std::array::from_fn(|i| {
        let wr = &p[i * kp..(i + 1) * kp];
        xr.map(|r| {
            let mut acc = [0.0f32; 8];
            for (wc, xc) in wr
                .chunks_exact(8)
                .zip(x[r * kp..(r + 1) * kp].chunks_exact(8))
            {
                for l in 0..8 {
                    acc[l] = wc[l].mul_add(xc[l], acc[l]);
                }
            }
            hsum8(&acc)
        })
    })
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use std::arch::x86_64::*;

    /// [`super::hsum8`] of four registers at once, the same additions in the same order:
    /// q = lo + hi (a0+a4, a1+a5, a2+a6, a3+a7), t = (q0 + q2, q1 + q3), t0 + t1.
    #[inline(always)]
    pub(crate) unsafe fn hsum4(v: [__m256; 4]) -> [f32; 4] {
        // [q_a | q_b] and [q_c | q_d]: each 128-bit half is one register's lo + hi
        let ab = _mm256_add_ps(
            _mm256_permute2f128_ps(v[0], v[1], 0x20),
            _mm256_permute2f128_ps(v[0], v[1], 0x31),
        );
        let cd = _mm256_add_ps(
            _mm256_permute2f128_ps(v[2], v[3], 0x20),
            _mm256_permute2f128_ps(v[2], v[3], 0x31),
        );
        // per 128-bit half: (q0 + q2, q1 + q3) of a and c, then of b and d
        let t = _mm256_add_ps(
            _mm256_shuffle_ps(ab, cd, 0b01_00_01_00),
            _mm256_shuffle_ps(ab, cd, 0b11_10_11_10),
        );
        // t0 + t1 per register: lanes [a, c, a, c | b, d, b, d]
        let h = _mm256_hadd_ps(t, t);
        let mut out = [0.0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), h);
        [out[0], out[4], out[1], out[5]]
    }
}
