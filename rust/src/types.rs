//! ggml type table (spec Appendix A) and the size arithmetic built on it (spec §5.1).

use crate::errors::TensorError;

/// Number of ggml type ids, including the removed ones (spec Appendix A).
pub const GGML_TYPE_COUNT: u32 = 43;

/// One row of the ggml type table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeInfo {
    pub name: &'static str,
    /// Elements per block; 0 marks a removed id.
    pub block_size: u64,
    /// Bytes per block.
    pub type_size: u64,
    pub quantized: bool,
}

const fn plain(name: &'static str, type_size: u64) -> TypeInfo {
    TypeInfo {
        name,
        block_size: 1,
        type_size,
        quantized: false,
    }
}

const fn quant(name: &'static str, block_size: u64, type_size: u64) -> TypeInfo {
    TypeInfo {
        name,
        block_size,
        type_size,
        quantized: true,
    }
}

const fn removed(name: &'static str) -> TypeInfo {
    TypeInfo {
        name,
        block_size: 0,
        type_size: 0,
        quantized: false,
    }
}

/// Indexed by ggml type id.
pub const TYPES: [TypeInfo; GGML_TYPE_COUNT as usize] = [
    plain("f32", 4),
    plain("f16", 2),
    quant("q4_0", 32, 18),
    quant("q4_1", 32, 20),
    removed("q4_2"),
    removed("q4_3"),
    quant("q5_0", 32, 22),
    quant("q5_1", 32, 24),
    quant("q8_0", 32, 34),
    quant("q8_1", 32, 36),
    quant("q2_K", 256, 84),
    quant("q3_K", 256, 110),
    quant("q4_K", 256, 144),
    quant("q5_K", 256, 176),
    quant("q6_K", 256, 210),
    quant("q8_K", 256, 292),
    quant("iq2_xxs", 256, 66),
    quant("iq2_xs", 256, 74),
    quant("iq3_xxs", 256, 98),
    quant("iq1_s", 256, 50),
    quant("iq4_nl", 32, 18),
    quant("iq3_s", 256, 110),
    quant("iq2_s", 256, 82),
    quant("iq4_xs", 256, 136),
    plain("i8", 1),
    plain("i16", 2),
    plain("i32", 4),
    plain("i64", 8),
    plain("f64", 8),
    quant("iq1_m", 256, 56),
    plain("bf16", 2),
    removed("q4_0_4_4"),
    removed("q4_0_4_8"),
    removed("q4_0_8_8"),
    quant("tq1_0", 256, 54),
    quant("tq2_0", 256, 66),
    removed("iq4_nl_4_4"),
    removed("iq4_nl_4_8"),
    removed("iq4_nl_8_8"),
    quant("mxfp4", 32, 17),
    quant("nvfp4", 64, 36),
    quant("q1_0", 128, 18),
    quant("q2_0", 64, 18),
];

/// The table row of a type the server accepts (spec §5.1 rules 1 and 2).
pub fn type_info(type_id: u64) -> Result<&'static TypeInfo, TensorError> {
    let info = usize::try_from(type_id)
        .ok()
        .and_then(|i| TYPES.get(i))
        .ok_or_else(|| {
            TensorError::new(format!(
                "invalid tensor type {type_id} (>= GGML_TYPE_COUNT {GGML_TYPE_COUNT})"
            ))
        })?;
    if info.block_size == 0 {
        return Err(TensorError::new(format!(
            "invalid tensor type {type_id} (removed type {})",
            info.name
        )));
    }
    Ok(info)
}

fn overflow(what: &str) -> TensorError {
    TensorError::new(format!("{what} overflows u64"))
}

/// `ggml_nbytes` (spec §5.1) in checked u64 arithmetic. Validates the type first.
pub fn nbytes(type_id: u64, ne: [u64; 4], nb: [u64; 4]) -> Result<u64, TensorError> {
    let info = type_info(type_id)?;
    if ne.contains(&0) {
        return Ok(0);
    }
    // Block size 1: last element's offset + one element. Otherwise row 0 is ne0/bs whole blocks.
    let first = if info.block_size == 1 {
        info.type_size
    } else {
        ne[0]
            .checked_mul(nb[0])
            .ok_or_else(|| overflow("tensor size"))?
            / info.block_size
    };
    let start = if info.block_size == 1 { 0 } else { 1 };
    (start..4).try_fold(first, |acc, i| {
        (ne[i] - 1)
            .checked_mul(nb[i])
            .and_then(|span| acc.checked_add(span))
            .ok_or_else(|| overflow("tensor size"))
    })
}

/// Element count `ne0·ne1·ne2·ne3`, refused where ggml_new_tensor_impl asserts (spec §5.3):
/// from ne0 on, each dim > 1 needs `INT64_MAX / ne[i] > running product` (strict; dims of 0
/// and 1 are skipped), so a later 0 does not rescue an overflowing prefix.
pub fn nelements(ne: &[u64]) -> Result<u64, TensorError> {
    const MAX: u64 = i64::MAX as u64;
    let err = || TensorError::new("element count overflows int64");
    let Some((&first, rest)) = ne.split_first() else {
        return Ok(1);
    };
    if first > MAX {
        return Err(err());
    }
    let mut running = first;
    for &n in rest {
        if n > 1 {
            if n > MAX || MAX / n <= running {
                return Err(err());
            }
            running *= n;
        }
    }
    Ok(if rest.contains(&0) { 0 } else { running })
}

/// Strides of a contiguous tensor: nb0 = type_size, nb1 = nb0·ne0/block_size, nb[i] = nb[i-1]·ne[i-1].
pub fn contiguous_strides(type_id: u64, ne: [u64; 4]) -> Result<[u64; 4], TensorError> {
    let info = type_info(type_id)?;
    let nb0 = info.type_size;
    let nb1 = nb0
        .checked_mul(ne[0])
        .map(|v| v / info.block_size)
        .ok_or_else(|| overflow("contiguous stride"))?;
    let nb2 = nb1
        .checked_mul(ne[1])
        .ok_or_else(|| overflow("contiguous stride"))?;
    let nb3 = nb2
        .checked_mul(ne[2])
        .ok_or_else(|| overflow("contiguous stride"))?;
    Ok([nb0, nb1, nb2, nb3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shape() {
        assert_eq!(TYPES.len(), 43);
        let removed: Vec<usize> = (0..TYPES.len())
            .filter(|&i| TYPES[i].block_size == 0)
            .collect();
        assert_eq!(removed, vec![4, 5, 31, 32, 33, 36, 37, 38]);
        assert_eq!(TYPES[8], quant("q8_0", 32, 34));
        assert_eq!(TYPES[30], plain("bf16", 2));
        assert_eq!(TYPES[42], quant("q2_0", 64, 18));
    }

    #[test]
    fn type_validation() {
        assert!(type_info(0).is_ok());
        assert!(type_info(42).is_ok());
        assert!(type_info(43).is_err());
        assert!(type_info(u64::MAX).is_err());
        assert!(type_info(4).unwrap_err().reason.contains("removed"));
    }

    #[test]
    fn nbytes_contiguous_f32() {
        // 4 x f32 -> 16 bytes (spec §7.9 example).
        assert_eq!(nbytes(0, [4, 1, 1, 1], [4, 16, 16, 16]).unwrap(), 16);
        assert_eq!(nbytes(0, [4, 3, 2, 1], [4, 16, 48, 96]).unwrap(), 96);
    }

    #[test]
    fn nbytes_quantized() {
        // q8_0: 64 elements = 2 blocks of 34 bytes; 3 rows.
        assert_eq!(nbytes(8, [64, 3, 1, 1], [34, 68, 204, 204]).unwrap(), 204);
    }

    #[test]
    fn nbytes_zero_dim_and_strided() {
        assert_eq!(nbytes(0, [4, 0, 1, 1], [4, 16, 0, 0]).unwrap(), 0);
        // Transposed view: bs==1 rule is ts + Σ (ne-1)·nb.
        assert_eq!(
            nbytes(0, [3, 4, 1, 1], [16, 4, 48, 48]).unwrap(),
            4 + 2 * 16 + 3 * 4
        );
        // Zero-dim short-circuit still validates the type first.
        assert!(nbytes(43, [0, 1, 1, 1], [0; 4]).is_err());
    }

    #[test]
    fn nbytes_overflow() {
        assert!(nbytes(0, [3, 1, 1, 1], [u64::MAX, 0, 0, 0]).is_err());
        assert_eq!(
            nbytes(0, [2, 1, 1, 1], [u64::MAX - 4, 0, 0, 0]).unwrap(),
            u64::MAX
        );
        assert!(nbytes(0, [2, 1, 1, 1], [u64::MAX - 3, 0, 0, 0]).is_err());
        assert!(nbytes(8, [u64::MAX, 1, 1, 1], [2, 0, 0, 0]).is_err());
        let big = u32::MAX as u64;
        assert_eq!(
            nbytes(0, [big, 1, 1, 1], [big; 4]).unwrap(),
            4 + (big - 1) * big
        );
        assert!(nbytes(0, [big, big, big, big], [big; 4]).is_err());
        assert!(nbytes(0, [2, 2, 2, 2], [u64::MAX / 2, u64::MAX / 2, 1, 1]).is_err());
    }

    #[test]
    fn nelements_overflow() {
        assert_eq!(nelements(&[2, 3, 4, 5]).unwrap(), 120);
        assert_eq!(nelements(&[]).unwrap(), 1);
        let big = u32::MAX as u64;
        // Two dims near 2^32 exceed int64 (the reference asserts, spec §5.3).
        assert!(nelements(&[big, big, 1, 1]).is_err());
        assert!(nelements(&[big, big, big, big]).is_err()); // also wraps u64
        assert_eq!(nelements(&[1 << 31, 1 << 31, 1, 1]).unwrap(), 1 << 62);
        assert_eq!(nelements(&[i64::MAX as u64]).unwrap(), i64::MAX as u64);
        assert!(nelements(&[i64::MAX as u64 + 1]).is_err());
    }

    /// ggml_new_tensor_impl's rule (docs/fuzzing.md): dims <= 1 after ne0 are skipped, and each
    /// other dim needs INT64_MAX / ne[i] > the running product (strict), whatever comes later.
    #[test]
    fn nelements_follows_ggml_int64_rule() {
        let big = u32::MAX as u64;
        assert!(nelements(&[big, big, big, 0]).is_err()); // ggml asserts before reaching the 0
        assert!(nelements(&[big, big, 0, big]).is_err());
        assert_eq!(nelements(&[0, big, big, big]).unwrap(), 0); // 0 * ... never overflows
        assert!(nelements(&[1 << 31, big, 1, 1]).is_err()); // 2^63 - 2^31 fits, but not strictly
        assert_eq!(
            nelements(&[(1 << 31) - 1, big, 1, 1]).unwrap(),
            ((1u64 << 31) - 1) * big
        );
        assert_eq!(nelements(&[5, 0, 1, 1]).unwrap(), 0);
        assert_eq!(nelements(&[7, 1, 1, 3]).unwrap(), 21);
        // The order of dims matters exactly as in ggml: a 0 early stops nothing either.
        assert!(nelements(&[big, 0, big, big]).is_err());
        assert_eq!(nelements(&[0, 0, 0, 0]).unwrap(), 0);
    }

    #[test]
    fn contiguous() {
        assert_eq!(
            contiguous_strides(0, [4, 3, 2, 1]).unwrap(),
            [4, 16, 48, 96]
        );
        assert_eq!(
            contiguous_strides(8, [64, 3, 1, 1]).unwrap(),
            [34, 68, 204, 204]
        );
        assert!(contiguous_strides(4, [1, 1, 1, 1]).is_err());
        assert!(contiguous_strides(0, [u64::MAX, 2, 1, 1]).is_err());
    }
}
