//! Every supported weight type's rows function, one table per build: the portable one and the
//! SIMD one, each filled at compile time. [`table`] picks one per call from the detected CPU
//! ([`crate::kernels::cpu`], read once) and the run-time switches, so a call pays one flag check
//! and an array index, as a single `match` on the type did before.

use super::by_type as dot;
use super::row_dot::RowDot;
use super::rows::rows_portable;
#[cfg(target_arch = "x86_64")]
use super::rows::rows_simd;
use crate::kernels::cpu::simd_active;
use crate::kernels::operand::RowsFn;

macro_rules! for_type {
    ($type_id:expr, $d:ident => $body:expr, $none:expr) => {
        match $type_id {
            0 => {
                type $d = dot::F32;
                $body
            }
            1 => {
                type $d = dot::F16;
                $body
            }
            2 => {
                type $d = dot::Q4_0;
                $body
            }
            3 => {
                type $d = dot::Q4_1;
                $body
            }
            6 => {
                type $d = dot::Q5_0;
                $body
            }
            7 => {
                type $d = dot::Q5_1;
                $body
            }
            8 => {
                type $d = dot::Q8_0;
                $body
            }
            10 => {
                type $d = dot::Q2K;
                $body
            }
            11 => {
                type $d = dot::Q3K;
                $body
            }
            12 => {
                type $d = dot::Q4K;
                $body
            }
            13 => {
                type $d = dot::Q5K;
                $body
            }
            14 => {
                type $d = dot::Q6K;
                $body
            }
            20 => {
                type $d = dot::IQ4NL;
                $body
            }
            23 => {
                type $d = dot::IQ4XS;
                $body
            }
            30 => {
                type $d = dot::BF16;
                $body
            }
            39 => {
                type $d = dot::MXFP4;
                $body
            }
            _ => $none,
        }
    };
}

/// Slots of a table: one per ggml type id up to the largest supported (MXFP4, 39).
const TYPE_SLOTS: usize = 40;

/// One rows function per supported weight type (indexed by ggml type id) for one build.
pub struct DotTable {
    rows: [Option<RowsFn>; TYPE_SLOTS],
}

impl DotTable {
    const fn build(simd: bool) -> Self {
        let mut rows: [Option<RowsFn>; TYPE_SLOTS] = [None; TYPE_SLOTS];
        let mut t = 0;
        while t < TYPE_SLOTS {
            rows[t] = for_type!(t as u32, D => Some(entry::<D>(simd)), None);
            t += 1;
        }
        Self { rows }
    }

    /// The rows function of weight type `type_id`; `None` when unsupported.
    #[inline]
    pub fn rows(&self, type_id: u32) -> Option<RowsFn> {
        match self.rows.get(type_id as usize) {
            Some(f) => *f,
            None => None,
        }
    }
}

const fn entry<D: RowDot>(simd: bool) -> RowsFn {
    #[cfg(target_arch = "x86_64")]
    if simd {
        return rows_simd::<D>;
    }
    let _ = simd;
    rows_portable::<D>
}

/// The portable build of every type.
pub static PORTABLE: DotTable = DotTable::build(false);
/// The AVX2+FMA+F16C build of every type (the AVX-512 VNNI kernels sit inside it, taken where
/// the CPU has them).
#[cfg(target_arch = "x86_64")]
static SIMD: DotTable = DotTable::build(true);

/// The table this CPU runs now: the SIMD one where the features were detected and the
/// portable build is not forced.
#[inline]
pub fn table() -> &'static DotTable {
    #[cfg(target_arch = "x86_64")]
    if simd_active() {
        return &SIMD;
    }
    &PORTABLE
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::dot::kquant_gemm;
    use crate::kernels::dot::rows::rows_fn;
    use crate::kernels::formats::{type_info, ActFormat};
    use crate::kernels::operand::{Converted, RowsJob};
    use crate::kernels::test_util::{noise, weights};

    const TYPES: [u32; 16] = [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30, 39];

    /// The type table and each type's row dot agree on the block facts, and the tables hold
    /// exactly the supported types.
    #[test]
    fn type_table_matches_the_row_dots() {
        for t in 0..TYPE_SLOTS as u32 {
            let facts = for_type!(t, D => Some((D::BLOCK, D::BLOCK_BYTES, D::ACT)), None);
            let info = type_info(t).map(|i| (i.block, i.block_bytes, i.act));
            assert_eq!(facts, info, "type {t}");
            assert_eq!(PORTABLE.rows(t).is_some(), info.is_some(), "type {t}");
            assert_eq!(table().rows(t).is_some(), info.is_some(), "type {t}");
        }
        assert!(TYPES.iter().all(|&t| type_info(t).is_some()));
        assert!(type_info(TYPE_SLOTS as u32).is_none() && table().rows(99).is_none());
    }

    #[test]
    fn portable_and_simd_agree_bitwise() {
        for &t in &TYPES {
            let (m, k, n) = (37, 512, 3);
            let w = weights(t, m, k, 5 + t as u64);
            let x = noise(7, n * k);
            let info = type_info(t).unwrap();
            let row = k / info.block * info.block_bytes;
            let mut a = vec![0.0f32; n * m];
            let mut b = vec![0.0f32; n * m];
            let act = Converted::new(info.act, &x, k);
            PORTABLE.rows(t).unwrap()(RowsJob::new(&w, row, 0, k, &act, &mut a, false));
            table().rows(t).unwrap()(RowsJob::new(&w, row, 0, k, &act, &mut b, false));
            assert_eq!(a, b, "type {t}");
            assert!(a.iter().all(|v| v.is_finite()), "type {t}");
        }
    }

    /// The f16 kernels that share each weight vector among two or four activation rows keep
    /// each row's sum (leftover elements past a multiple of 32 included).
    #[test]
    fn f16_multi_row_dots_keep_each_rows_bits() {
        for n in [2usize, 3, 5, 6] {
            let (m, k) = (9, 200);
            let w = weights(1, m, k, 21);
            let x = noise(23, n * k);
            let act = Converted::new(ActFormat::F16, &x, k);
            let (mut a, mut b) = (vec![0.0f32; n * m], vec![0.0f32; n * m]);
            rows_portable::<dot::F16>(RowsJob::new(&w, 2 * k, 0, k, &act, &mut a, false));
            rows_fn::<dot::F16>()(RowsJob::new(&w, 2 * k, 0, k, &act, &mut b, false));
            assert_eq!(a, b, "n {n}");
        }
    }

    #[test]
    fn tiled_kquant_rows_agree_across_builds_and_row_counts() {
        for t in [10u32, 11, 12, 13, 14, 23] {
            let (m, k, n) = (21, 768, 70);
            let w = weights(t, m, k, 3 + t as u64);
            let x = noise(9, n * k);
            let info = type_info(t).unwrap();
            let row = k / info.block * info.block_bytes;
            let act = Converted::new(info.act, &x, k);
            let mut a = vec![0.0f32; n * m];
            let mut b = vec![0.0f32; n * m];
            for_type!(t, D => {
                rows_portable::<D>(RowsJob::new(&w, row, 0, k, &act, &mut a, true));
                // the AVX2 rows take the packed activations (as `matmul_converted` gives them)
                let packed = kquant_gemm::serves(t).then(|| kquant_gemm::pack(&act, k));
                rows_fn::<D>()(RowsJob::new(&w, row, 0, k, packed.as_ref().unwrap_or(&act), &mut b, true));
                // one row at a time (`dot_gemm`) gives the same bits as the row blocks
                for i in [0, m - 1] {
                    for r in [0, 63, 64, n - 1] {
                        let single = D::dot_gemm(&w[i * row..(i + 1) * row], act.row(r), k);
                        assert_eq!(single.to_bits(), a[i * n + r].to_bits(), "type {t}");
                    }
                }
            }, unreachable!());
            assert_eq!(a, b, "type {t}");
            assert!(a.iter().all(|v| v.is_finite()), "type {t}");
        }
    }

    /// The AVX-512 Q6_K dot gives the bits of ggml's AVX2 registers and of the portable code.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn q6_k_wide_keeps_the_bits() {
        use crate::kernels::cpu::avx512_vnni_active;
        use crate::kernels::dot::avx2::q6_k_avx2;
        use crate::kernels::dot::avx512::q6_k_wide;
        use crate::kernels::dot::row_dot::RowDot;

        if !avx512_vnni_active() {
            return;
        }
        for k in [256usize, 1024, 2816] {
            let m = 5;
            let w = weights(14, m, k, 3 + k as u64);
            let act = Converted::new(ActFormat::Q8K, &noise(11 + k as u64, k), k);
            let row = k / 256 * 210;
            for i in 0..m {
                let wr = &w[i * row..(i + 1) * row];
                // SAFETY: AVX-512 VNNI (and so AVX2, FMA, F16C) checked above.
                let (wide, avx2) = unsafe {
                    (
                        q6_k_wide(wr, act.row(0), k / 256),
                        q6_k_avx2(wr, act.row(0), k),
                    )
                };
                assert_eq!(wide.to_bits(), avx2.to_bits(), "k {k} row {i}");
                let portable = dot::Q6K::dot(wr, act.row(0), k);
                assert_eq!(wide.to_bits(), portable.to_bits(), "k {k} row {i}");
            }
        }
    }
}
