//! The operands kernels take: activation rows converted to a vec_dot type ([`Converted`]), the
//! signatures of the per-thread rows functions over them, and strided ggml tensors ([`Operand`]).

use super::formats::ActFormat;
use super::pool;

/// Activation values from which their conversion is split over threads.
pub(crate) const PARALLEL_CONVERT_MIN: usize = 1 << 15;

/// The whole rows of `x` (`k` values each) converted by `work` (a run of rows into as many
/// `row_bytes` rows) into a zeroed buffer, split over up to `threads` threads for large batches;
/// with the row count.
pub fn convert_rows(
    x: &[f32],
    k: usize,
    row_bytes: usize,
    threads: usize,
    work: impl Fn(&[f32], &mut [u8]) + Sync,
) -> (Vec<u8>, usize) {
    let rows = x.len() / k.max(1);
    let mut data = vec![0u8; rows * row_bytes];
    if threads < 2 || rows < 2 || x.len() < PARALLEL_CONVERT_MIN {
        work(&x[..rows * k], &mut data);
    } else {
        let per = rows.div_ceil(threads);
        let parts: Vec<(&[f32], &mut [u8])> = x[..rows * k]
            .chunks(per * k)
            .zip(data.chunks_mut(per * row_bytes))
            .collect();
        pool::for_each(threads, parts, |_, (xs, out)| work(xs, out));
    }
    (data, rows)
}

/// Activation rows converted to a vec_dot type, `row_bytes` apart.
pub struct Converted {
    pub data: Vec<u8>,
    pub row_bytes: usize,
    pub rows: usize,
}

impl Converted {
    pub fn new(fmt: ActFormat, x: &[f32], k: usize) -> Self {
        Self::new_par(fmt, x, k, 1)
    }

    /// [`Self::new`] with the rows split over up to `threads` threads (large batches only).
    pub fn new_par(fmt: ActFormat, x: &[f32], k: usize, threads: usize) -> Self {
        let row_bytes = fmt.row_bytes(k);
        let (data, rows) = convert_rows(x, k, row_bytes, threads, |xs, out| {
            for (xr, or) in xs.chunks_exact(k).zip(out.chunks_exact_mut(row_bytes)) {
                fmt.convert_row(xr, or);
            }
        });
        Self {
            data,
            row_bytes,
            rows,
        }
    }

    pub(crate) fn row(&self, r: usize) -> &[u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }
}

/// One call of a rows function: weight rows `first..first + out.len() / act.rows` of `w`
/// (`stride` bytes apart, `k` values each) against every activation row of `act`, into
/// `out[(i - first) * act.rows + r]`; `gemm`: in the order ggml's MUL_MAT takes for N >= 2.
pub struct RowsJob<'a> {
    pub w: &'a [u8],
    pub stride: usize,
    pub first: usize,
    pub k: usize,
    pub act: &'a Converted,
    pub out: &'a mut [f32],
    pub gemm: bool,
}

impl<'a> RowsJob<'a> {
    pub fn new(
        w: &'a [u8],
        stride: usize,
        first: usize,
        k: usize,
        act: &'a Converted,
        out: &'a mut [f32],
        gemm: bool,
    ) -> Self {
        Self {
            w,
            stride,
            first,
            k,
            act,
            out,
            gemm,
        }
    }

    /// The fields: `(w, stride, first, k, act, out, gemm)`.
    #[allow(clippy::type_complexity)]
    pub fn into_parts(
        self,
    ) -> (
        &'a [u8],
        usize,
        usize,
        usize,
        &'a Converted,
        &'a mut [f32],
        bool,
    ) {
        (
            self.w,
            self.stride,
            self.first,
            self.k,
            self.act,
            self.out,
            self.gemm,
        )
    }
}

pub type RowsFn = fn(RowsJob<'_>);

/// A rows function that writes weight rows `first..first + rows` straight into the `[n][m]`
/// output (w, stride, first, rows, k, act, out, m).
///
/// # Safety
/// `out` is valid for `n × m` floats and the caller alone writes those columns.
pub(crate) type DirectFn =
    unsafe fn(&[u8], usize, usize, usize, usize, &Converted, *mut f32, usize);

/// A strided 4-D operand: base pointer of element 0 and byte strides (ggml's `nb`).
#[derive(Clone, Copy, Debug)]
pub struct Operand {
    pub ptr: *const u8,
    pub ne: [usize; 4],
    pub nb: [usize; 4],
}

impl Operand {
    /// The start of row `r` of the rows of `ne[1..]` in ggml order (a pointer computed with
    /// wrapping arithmetic: callers keep `r` within the operand, checked when it was built).
    #[inline]
    pub fn row_start(&self, r: usize) -> *const u8 {
        let (i1, rest) = (r % self.ne[1], r / self.ne[1]);
        let (i2, i3) = (rest % self.ne[2], rest / self.ne[2]);
        self.ptr
            .wrapping_add(i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3])
    }
}
