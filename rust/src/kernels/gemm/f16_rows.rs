//! f16 weights against one or a few activation rows (decode), in `ggml_vec_dot_f16`'s order,
//! with the activations widened to f32 once per call. ggml converts both operands
//! (`vcvtph2ps`) at every step of every weight row; the widened activation is the same value,
//! so every FMA and the final sum keep their bits, and a weight row costs one conversion per 8
//! values instead of two. On an AVX2-only Zen 3 VM, where one 8-lane conversion takes several
//! cycles, f16 decode was bound by the conversions rather than by memory.

use crate::kernels::cpu::simd_active;
use crate::kernels::operand::{Converted, RowsJob};

/// Whether the widened rows serve f16 vec_dot products on this CPU (the portable build keeps
/// the f16 rows and the row dots).
pub fn serves() -> bool {
    cfg!(target_arch = "x86_64") && simd_active()
}

/// The f16 activation rows of `act` (`k` values each) widened to f32 rows (exact).
pub fn widen(act: &Converted, k: usize) -> Converted {
    let mut data = vec![0u8; act.rows * k * 4];
    let mut half = vec![0u16; k];
    let mut wide = vec![0.0f32; k];
    for (r, dst) in data.chunks_exact_mut(k * 4).enumerate() {
        for (h, b) in half.iter_mut().zip(act.row(r).chunks_exact(2)) {
            *h = u16::from_le_bytes([b[0], b[1]]);
        }
        crate::kernels::f16vec::f16_row_to_f32(&half, &mut wide);
        for (d, v) in dst.chunks_exact_mut(4).zip(&wide) {
            d.copy_from_slice(&v.to_le_bytes());
        }
    }
    Converted {
        data,
        row_bytes: k * 4,
        rows: act.rows,
    }
}

/// The rows function (`RowsFn`) over [`widen`]ed activations: weight rows
/// `first..first + out.len() / n`, `out[(i - first) * n + r]`; each weight row is met by every
/// activation row while it is in L1.
pub fn rows(job: RowsJob<'_>) {
    let (w, stride, first, k, act, out, _) = job.into_parts();
    let n = act.rows;
    assert!(act.row_bytes == k * 4 && act.data.len() >= n * k * 4);
    assert!(serves(), "f16_rows needs AVX2, FMA and F16C");
    if n == 0 {
        return;
    }
    let count = out.len() / n;
    // rows of whole 32-value steps in eights, their reductions side by side
    #[cfg(target_arch = "x86_64")]
    let done = if k.is_multiple_of(32) {
        // SAFETY: serves() checked the CPU; rows8 checks the sizes.
        unsafe { rows8(w, stride, first, count, k, act, out) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (i, dst) in out.chunks_exact_mut(n).enumerate().skip(done) {
        let at = (first + i) * stride;
        let wr = &w[at..at + 2 * k];
        #[cfg(target_arch = "x86_64")]
        {
            // activation rows in pairs: each weight vector converted once for both
            let mut r = 0;
            while r + 2 <= n {
                let xs = [act.row(r), act.row(r + 1)];
                // SAFETY: AVX2, FMA and F16C checked above; the sizes are asserted inside.
                let pair = unsafe { crate::kernels::dot::avx2::f16_wide_x2(wr, xs, k) };
                dst[r..r + 2].copy_from_slice(&pair);
                r += 2;
            }
            if r < n {
                // SAFETY: as above.
                dst[r] = unsafe { crate::kernels::dot::avx2::f16_wide(wr, act.row(r), k) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (wr, dst);
            unreachable!("f16_rows serves x86-64 only");
        }
    }
}

/// Weight rows `first..first + count` in whole eights (the number done is returned) for
/// [`rows`], `k` a multiple of 32: `dot::avx2::f16_wide_rows8`, activation rows in
/// pairs.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8(
    w: &[u8],
    stride: usize,
    first: usize,
    count: usize,
    k: usize,
    act: &Converted,
    out: &mut [f32],
) -> usize {
    use crate::kernels::dot::avx2::{f16_wide_rows8, prefetch_f16_rows};
    use std::arch::x86_64::{__m256, _mm256_storeu_ps};
    let n = act.rows;
    let done = count - count % 8;
    if done == 0 {
        return 0;
    }
    assert!(w.len() >= (first + done - 1) * stride + 2 * k && out.len() >= done * n);
    let pf = prefetch_f16_rows();
    let x = |r: usize| act.row(r).as_ptr() as *const f32;
    let put = |out: &mut [f32], i: usize, r: usize, v: __m256| {
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        for (row, value) in lanes.into_iter().enumerate() {
            out[(i + row) * n + r] = value;
        }
    };
    for i in (0..done).step_by(8) {
        let wp = w.as_ptr().add((first + i) * stride);
        let mut r = 0;
        while r + 2 <= n {
            let [a, b] = f16_wide_rows8::<2>(wp, stride, [x(r), x(r + 1)], k, pf);
            put(out, i, r, a);
            put(out, i, r + 1, b);
            r += 2;
        }
        if r < n {
            let [a] = f16_wide_rows8::<1>(wp, stride, [x(r)], k, pf);
            put(out, i, r, a);
        }
    }
    done
}
