//! f16 weights against one or a few activation rows (decode), in `ggml_vec_dot_f16`'s order,
//! with the activations widened to f32 once per call. ggml converts both operands
//! (`vcvtph2ps`) at every step of every weight row; the widened activation is the same value,
//! so every FMA and the final sum keep their bits, and a weight row costs one conversion per 8
//! values instead of two. On an AVX2-only Zen 3 VM, where one 8-lane conversion takes several
//! cycles, f16 decode was bound by the conversions rather than by memory.

use super::Dest;
use crate::kernels::cpu::simd_active;
use crate::kernels::operand::{Converted, DirectFn, RowsJob};

/// Whether the widened rows serve f16 vec_dot products on this CPU (the portable build keeps
/// the f16 rows and the row dots).
pub fn serves() -> bool {
    cfg!(target_arch = "x86_64") && simd_active()
}

/// Bytes of widened activation rows that stay in L1 next to the weight stream: beyond them
/// (one row of K = 11008 is 43 KiB) the rows converting both operands at every step, with
/// the activations half the size, read the weights faster.
const WIDE_MAX_BYTES: usize = 24 << 10;

/// Whether [`rows`] serves `n` activation rows of `k` values on this CPU.
pub fn serves_shape(k: usize, n: usize) -> bool {
    serves() && 4 * k * n <= WIDE_MAX_BYTES
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
    if n == 0 {
        return;
    }
    let dest = Dest::scratch(out, n);
    // SAFETY: `out` holds `out.len() / n` results for each of the n activation rows.
    unsafe { rows_into(w, stride, first, out.len() / n, k, act, dest) }
}

/// The [`direct`] function for `n` activation rows: decode (N <= 2), whose small chunks are
/// claimed in turn and which spent part of each chunk in the scratch and its scatter; larger
/// N keeps the scratch (the run splits direct calls into one part per thread).
pub(crate) fn direct_fn(n: usize) -> Option<DirectFn> {
    (n <= 2).then_some(direct as DirectFn)
}

/// [`rows`] for weight rows `first..first + rows` written straight into the `[n][m]` output at
/// `out` (column `first + i` of every activation row): no scratch or scatter, and whole
/// vectors of eight results per activation row.
///
/// # Safety
/// `out` is valid for `act.rows × m` floats and no one else writes columns
/// `first..first + rows` meanwhile.
#[allow(clippy::too_many_arguments)] // the shape of `DirectFn`
pub(crate) unsafe fn direct(
    w: &[u8],
    stride: usize,
    first: usize,
    rows: usize,
    k: usize,
    act: &Converted,
    out: *mut f32,
    m: usize,
) {
    assert!(first + rows <= m);
    // SAFETY: as asserted, within the caller's n × m floats
    let dest = unsafe { Dest::columns(out, first, m) };
    // SAFETY: the caller owns those columns of `out`.
    unsafe { rows_into(w, stride, first, rows, k, act, dest) }
}

/// Weight rows `first..first + count` against every activation row into `dest`.
///
/// # Safety
/// `dest` must be valid for the `count × act.rows` results.
unsafe fn rows_into(
    w: &[u8],
    stride: usize,
    first: usize,
    count: usize,
    k: usize,
    act: &Converted,
    dest: Dest,
) {
    let n = act.rows;
    assert!(act.row_bytes == k * 4 && act.data.len() >= n * k * 4);
    assert!(serves(), "f16_rows needs AVX2, FMA and F16C");
    assert!(count == 0 || w.len() >= (first + count - 1) * stride + 2 * k);
    if n == 0 || count == 0 {
        return;
    }
    // rows of whole 32-value steps in eights, their reductions side by side
    #[cfg(target_arch = "x86_64")]
    let done = if k.is_multiple_of(32) {
        // SAFETY: serves() checked the CPU; the sizes are asserted above.
        unsafe { rows8(w, stride, first, count, k, act, dest) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for i in done..count {
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
                // SAFETY: (i, r) and (i, r + 1) are results of this call.
                unsafe {
                    dest.put(i, r, pair[0]);
                    dest.put(i, r + 1, pair[1]);
                }
                r += 2;
            }
            if r < n {
                // SAFETY: as above.
                unsafe {
                    let v = crate::kernels::dot::avx2::f16_wide(wr, act.row(r), k);
                    dest.put(i, r, v);
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (wr, dest);
            unreachable!("f16_rows serves x86-64 only");
        }
    }
}

/// Weight rows `first..first + count` in whole eights (the number done is returned) for
/// [`rows_into`], `k` a multiple of 32: `dot::avx2::f16_wide_rows8`, activation rows in
/// pairs.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` must hold the rows and `dest` the results.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows8(
    w: &[u8],
    stride: usize,
    first: usize,
    count: usize,
    k: usize,
    act: &Converted,
    dest: Dest,
) -> usize {
    use crate::kernels::cpu::avx512_vnni_active;
    use crate::kernels::dot::avx2::float::prefetch_f16_rows;
    use crate::kernels::dot::{self, avx2::f16_wide_rows8};
    use std::arch::x86_64::{__m256, _mm256_storeu_ps};
    let n = act.rows;
    let done = count - count % 8;
    let x = |r: usize| act.row(r).as_ptr() as *const f32;
    // the eight results of rows i..i + 8 for activation row r: one store where they are
    // neighbours in the output
    let put = |i: usize, r: usize, v: __m256| {
        if dest.row_step == 1 {
            _mm256_storeu_ps(dest.ptr.add(i + r * dest.col_step), v);
        } else {
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), v);
            for (row, value) in lanes.into_iter().enumerate() {
                dest.put(i + row, r, value);
            }
        }
    };
    let wide = avx512_vnni_active();
    for i in (0..done).step_by(8) {
        let wp = w.as_ptr().add((first + i) * stride);
        let mut r = 0;
        while r + 2 <= n {
            let xs = [x(r), x(r + 1)];
            let [a, b] = if wide {
                dot::avx512::f16_wide_rows8::<2>(wp, stride, xs, k)
            } else {
                f16_wide_rows8::<2>(wp, stride, xs, k, prefetch_f16_rows())
            };
            put(i, r, a);
            put(i, r + 1, b);
            r += 2;
        }
        if r < n {
            let [a] = if wide {
                dot::avx512::f16_wide_rows8::<1>(wp, stride, [x(r)], k)
            } else {
                f16_wide_rows8::<1>(wp, stride, [x(r)], k, false)
            };
            put(i, r, a);
        }
    }
    done
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::kernels::blocks::half::{f32_to_fp16, fp16_to_f32};
    use crate::kernels::cpu::avx512_vnni_active;
    use crate::kernels::dot::{avx2, avx512};
    use crate::kernels::test_util::{noise, weights};
    use std::arch::x86_64::{__m256, _mm256_storeu_ps};

    /// The 16-lane f16 rows give the bits of the 8-lane ones, for one and two activation rows.
    #[test]
    fn f16_wide_rows8_keeps_the_avx2_bits() {
        if !avx512_vnni_active() {
            return;
        }
        for k in [32, 64, 1024, 2816] {
            let stride = 2 * k + 64;
            let dense = weights(1, 8, k, k as u64);
            let mut w = vec![0u8; 8 * stride];
            for (row, src) in dense.chunks_exact(2 * k).enumerate() {
                w[row * stride..row * stride + 2 * k].copy_from_slice(src);
            }
            // f16-exact activations, as the widened rows hold
            let x: Vec<f32> = noise(k as u64 + 1, 2 * k)
                .iter()
                .map(|&v| fp16_to_f32(f32_to_fp16(v)))
                .collect();
            let xs = [x.as_ptr(), x[k..].as_ptr()];
            let bits = |v: __m256| {
                let mut a = [0.0f32; 8];
                // SAFETY: eight floats.
                unsafe { _mm256_storeu_ps(a.as_mut_ptr(), v) };
                a.map(f32::to_bits)
            };
            // SAFETY: AVX-512 (and so AVX2, FMA, F16C) checked above; 8 rows of k values.
            unsafe {
                let want = avx2::f16_wide_rows8::<2>(w.as_ptr(), stride, xs, k, false);
                let got = avx512::f16_wide_rows8::<2>(w.as_ptr(), stride, xs, k);
                let one = avx512::f16_wide_rows8::<1>(w.as_ptr(), stride, [xs[1]], k);
                assert_eq!(bits(got[0]), bits(want[0]), "k={k}");
                assert_eq!(bits(got[1]), bits(want[1]), "k={k}");
                assert_eq!(bits(one[0]), bits(want[1]), "k={k}");
            }
        }
    }
}
