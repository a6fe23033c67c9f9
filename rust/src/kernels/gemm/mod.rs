//! Many-row kernels (and the decode layouts) that replace the row dots where they give the
//! same bits faster: float weights in tinyBLAS's order, q8_0-family tiles, one-row Q4_K with
//! AVX-512, f16 rows against widened activations.

pub mod f16_rows;
pub mod float;
#[cfg(target_arch = "x86_64")]
mod float_avx2;
#[cfg(target_arch = "x86_64")]
mod float_avx512;
#[cfg(target_arch = "x86_64")]
mod float_blocked;
#[cfg(target_arch = "x86_64")]
mod float_few;
pub mod float_tiles;
pub mod q4k_paired;
pub mod q8;
mod widened;

/// Where a kernel's results go: (weight row i, activation row r), rows relative to the call's
/// first, at `ptr + i * row_step + r * col_step` (the `[n][m]` output, or a `[rows][n]`
/// scratch).
#[derive(Clone, Copy)]
pub(crate) struct Dest {
    pub(crate) ptr: *mut f32,
    pub(crate) row_step: usize,
    pub(crate) col_step: usize,
}

impl Dest {
    /// A `[rows][n]` scratch (or output) at `out`: weight row i's results side by side.
    pub(crate) fn scratch(out: &mut [f32], n: usize) -> Dest {
        Dest {
            ptr: out.as_mut_ptr(),
            row_step: n,
            col_step: 1,
        }
    }

    /// Columns `first..` of the `[n][m]` output at `out`, for a call that computes weight rows
    /// from `first` (whose results land in place: no scratch, no scatter).
    ///
    /// # Safety
    /// `out` is valid for `n × m` floats and `first <= m`.
    pub(crate) unsafe fn columns(out: *mut f32, first: usize, m: usize) -> Dest {
        Dest {
            // SAFETY: first <= m, within the caller's n × m floats
            ptr: unsafe { out.add(first) },
            row_step: 1,
            col_step: m,
        }
    }

    /// # Safety
    /// (i, r) must be one of the caller's results.
    #[inline(always)]
    pub(crate) unsafe fn put(self, i: usize, r: usize, v: f32) {
        unsafe { *self.ptr.add(i * self.row_step + r * self.col_step) = v };
    }
}
