//! Bounds checks for tensor data regions inside a server buffer `[base, base + size)`
//! (spec §5.1 rule 5, §5.2, §7.14, §7.16, §7.17, §10). All arithmetic is checked u64, so a
//! hostile client cannot wrap an address back into range.

use crate::errors::{ensure, TensorError};

fn buffer_end(base: u64, size: u64) -> Result<u64, TensorError> {
    base.checked_add(size).ok_or_else(|| {
        TensorError::new(format!(
            "buffer end overflows (base {base:#x}, size {size})"
        ))
    })
}

fn check_above_base(data: u64, base: u64) -> Result<(), TensorError> {
    ensure(data >= base, || {
        format!("tensor data {data:#x} below buffer base {base:#x}")
    })
}

/// `offset`, then `len` more bytes (`what`: "region", "span"), within the `room` bytes from the
/// tensor data to the buffer end.
fn check_fits_buffer(room: u64, offset: u64, len: u64, what: &str) -> Result<(), TensorError> {
    ensure(offset <= room, || {
        format!("offset {offset} beyond buffer end")
    })?;
    ensure(len <= room - offset, || {
        format!("{what} of {len} bytes at offset {offset} exceeds buffer end")
    })
}

/// `offset`, then `len` more bytes (`detail` says how when they do not fit), within the tensor.
fn check_fits_tensor(
    tensor_nbytes: u64,
    offset: u64,
    len: u64,
    detail: impl FnOnce() -> String,
) -> Result<(), TensorError> {
    ensure(offset <= tensor_nbytes, || {
        format!("offset {offset} beyond tensor size {tensor_nbytes}")
    })?;
    ensure(len <= tensor_nbytes - offset, || {
        format!("{} exceeds tensor size {tensor_nbytes}", detail())
    })
}

/// Spec §5.1 rule 5: the whole tensor `[data, data + nbytes)` lies inside the buffer.
pub fn check_tensor_in_buffer(
    data: u64,
    nbytes: u64,
    base: u64,
    size: u64,
) -> Result<(), TensorError> {
    let end = buffer_end(base, size)?;
    check_above_base(data, base)?;
    let tensor_end = data.checked_add(nbytes).ok_or_else(|| {
        TensorError::new(format!(
            "tensor end overflows (data {data:#x}, nbytes {nbytes})"
        ))
    })?;
    ensure(tensor_end <= end, || {
        format!("tensor [{data:#x}, +{nbytes}) exceeds buffer end {end:#x}")
    })
}

/// SET_TENSOR / GET_TENSOR / SET_TENSOR_HASH (spec §5.2) plus the tensor-bounds rule of §10
/// that replaces the reference server's assertion.
pub fn check_region(
    base: u64,
    size: u64,
    data: u64,
    offset: u64,
    length: u64,
    tensor_nbytes: u64,
) -> Result<(), TensorError> {
    let end = buffer_end(base, size)?;
    let start = data.checked_add(offset).ok_or_else(|| {
        TensorError::new(format!("data + offset overflows ({data:#x} + {offset})"))
    })?;
    ensure(start >= base, || {
        format!("region start {start:#x} below buffer base {base:#x}")
    })?;
    // `start == end` fails even for length 0, like the reference.
    ensure(start < end, || {
        format!("region start {start:#x} not below buffer end {end:#x}")
    })?;
    ensure(length <= end - start, || {
        format!("region [{start:#x}, +{length}) exceeds buffer end {end:#x}")
    })?;
    let rel_end = offset.checked_add(length);
    ensure(rel_end.is_some_and(|e| e <= tensor_nbytes), || {
        format!("offset {offset} + length {length} exceeds tensor size {tensor_nbytes}")
    })
}

/// MEMSET_TENSOR (spec §7.14), in the order the reference applies its checks.
pub fn check_memset(
    base: u64,
    size: u64,
    data: u64,
    offset: u64,
    length: u64,
    tensor_nbytes: u64,
) -> Result<(), TensorError> {
    check_fits_tensor(tensor_nbytes, offset, length, || {
        format!("offset {offset} + size {length}")
    })?;
    check_above_base(data, base)?;
    let rel = data - base;
    ensure(rel <= size, || {
        format!("tensor data {data:#x} beyond buffer of {size} bytes at {base:#x}")
    })?;
    check_fits_buffer(size - rel, offset, length, "region")
}

/// SET_TENSOR_2D (`payload = Some(bytes after the 328-byte header)`, spec §7.16 items 2, 4–6)
/// and GET_TENSOR_2D (`payload = None`, §7.17). Item 1 is the header check, item 3 the caller's
/// tensor validation.
#[allow(clippy::too_many_arguments)] // mirrors the wire fields one to one
pub fn check_region_2d(
    base: u64,
    size: u64,
    data: u64,
    tensor_nbytes: u64,
    offset: u64,
    row: u64,
    n_copies: u64,
    stride: u64,
    payload: Option<u64>,
) -> Result<(), TensorError> {
    ensure(n_copies != 0, || "n_copies is 0".to_owned())?;
    ensure(row != 0, || "row size is 0".to_owned())?;
    match payload {
        Some(d) => {
            ensure(row <= d / n_copies, || {
                format!("{n_copies} rows of {row} bytes exceed the {d} payload bytes")
            })?;
            ensure(row * n_copies == d, || {
                format!("{n_copies} rows of {row} bytes != {d} payload bytes")
            })?;
        }
        None => ensure(row <= u64::MAX / n_copies, || {
            format!("{n_copies} rows of {row} bytes overflow u64")
        })?,
    }
    // Item 4: (n_copies - 1)·stride + row must not overflow.
    ensure(
        stride == 0 || n_copies - 1 <= (u64::MAX - row) / stride,
        || format!("span of {n_copies} rows with stride {stride} overflows u64"),
    )?;
    let span = (n_copies - 1) * stride + row;
    // Item 5: inside the buffer.
    let end = buffer_end(base, size)?;
    check_above_base(data, base)?;
    ensure(data <= end, || {
        format!("tensor data {data:#x} beyond buffer end {end:#x}")
    })?;
    check_fits_buffer(end - data, offset, span, "span")?;
    // Item 6: inside the tensor.
    check_fits_tensor(tensor_nbytes, offset, span, || {
        format!("span of {span} bytes at offset {offset}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x1000;
    const SIZE: u64 = 0x100;
    const MAX: u64 = u64::MAX;

    #[test]
    fn tensor_in_buffer() {
        assert!(check_tensor_in_buffer(BASE, SIZE, BASE, SIZE).is_ok());
        assert!(check_tensor_in_buffer(BASE + 0x80, 0x80, BASE, SIZE).is_ok());
        assert!(check_tensor_in_buffer(BASE + 0x80, 0x81, BASE, SIZE).is_err());
        assert!(check_tensor_in_buffer(BASE - 1, 1, BASE, SIZE).is_err());
        assert!(check_tensor_in_buffer(MAX, 2, BASE, SIZE).is_err());
        assert!(check_tensor_in_buffer(BASE, 0, BASE, 0).is_ok());
        assert!(check_tensor_in_buffer(MAX - 1, 1, MAX - 2, 2).is_ok());
        assert!(check_tensor_in_buffer(MAX - 1, 1, MAX - 2, 3).is_err()); // buffer end overflows
    }

    #[test]
    fn region_buffer_rules() {
        assert!(check_region(BASE, SIZE, BASE, 0, SIZE, SIZE).is_ok());
        assert!(check_region(BASE, SIZE, BASE, 0, SIZE + 1, MAX).is_err());
        assert!(check_region(BASE, SIZE, BASE - 1, 0, 1, MAX).is_err());
        // d + off == p1 fails even for len 0 (spec §5.2, verified).
        assert!(check_region(BASE, SIZE, BASE, SIZE, 0, MAX).is_err());
        assert!(check_region(BASE, SIZE, BASE, SIZE - 1, 1, MAX).is_ok());
        assert!(check_region(BASE, SIZE, BASE + 8, MAX - 4, 1, MAX).is_err()); // d + off overflows
        assert!(check_region(BASE, SIZE, BASE, 8, MAX, MAX).is_err());
    }

    #[test]
    fn region_tensor_rule() {
        // Inside the buffer but past the tensor: the reference aborts, we reject.
        assert!(check_region(BASE, SIZE, BASE, 8, 8, 16).is_ok());
        assert!(check_region(BASE, SIZE, BASE, 8, 9, 16).is_err());
        assert!(check_region(BASE, SIZE, BASE, 17, 0, 16).is_err());
        assert!(check_region(BASE, SIZE, BASE, 16, 0, 16).is_ok());
    }

    #[test]
    fn memset_rules() {
        assert!(check_memset(BASE, SIZE, BASE, 0, 16, 16).is_ok());
        assert!(check_memset(BASE, SIZE, BASE, 17, 0, 16).is_err());
        assert!(check_memset(BASE, SIZE, BASE, 8, 9, 16).is_err());
        assert!(check_memset(BASE, SIZE, BASE, 8, MAX, 16).is_err());
        assert!(check_memset(BASE, SIZE, BASE - 1, 0, 1, 16).is_err());
        assert!(check_memset(BASE, SIZE, BASE + SIZE + 1, 0, 0, 16).is_err());
        assert!(check_memset(BASE, SIZE, BASE + SIZE - 8, 0, 8, 16).is_ok());
        assert!(check_memset(BASE, SIZE, BASE + SIZE - 8, 0, 9, 16).is_err());
        assert!(check_memset(BASE, SIZE, BASE + SIZE - 8, 9, 0, 16).is_err());
        // Unlike §5.2, offset landing exactly on the buffer end with size 0 passes.
        assert!(check_memset(BASE, SIZE, BASE + SIZE - 8, 8, 0, 16).is_ok());
    }

    #[test]
    fn region_2d_set_payload_rules() {
        let ok =
            |off, row, n, stride, d| check_region_2d(BASE, SIZE, BASE, 64, off, row, n, stride, d);
        assert!(ok(0, 4, 4, 16, Some(16)).is_ok());
        assert!(ok(0, 4, 0, 16, Some(0)).is_err());
        assert!(ok(0, 0, 4, 16, Some(0)).is_err());
        assert!(ok(0, 4, 4, 16, Some(15)).is_err());
        assert!(ok(0, 4, 4, 16, Some(17)).is_err());
        assert!(ok(0, 5, 4, 16, Some(16)).is_err());
        // n_copies == 1 and stride == 0 are accepted.
        assert!(ok(0, 8, 1, 0, Some(8)).is_ok());
        assert!(ok(0, 8, 3, 0, Some(24)).is_ok());
    }

    #[test]
    fn region_2d_get_and_spans() {
        let get =
            |off, row, n, stride| check_region_2d(BASE, SIZE, BASE, 64, off, row, n, stride, None);
        assert!(get(0, 4, 4, 16).is_ok());
        assert!(get(12, 4, 4, 16).is_ok()); // span 52, ends at 64
        assert!(get(13, 4, 4, 16).is_err()); // tensor bounds
        assert!(get(0, MAX, 2, 0).is_err()); // row·n overflows
        assert!(get(0, 1, MAX, 2).is_err()); // stride overflow (item 4)
        assert!(get(0, 1, 3, MAX / 2).is_err());
        assert!(get(65, 1, 1, 0).is_err());
        // Buffer bounds take precedence over the (larger) tensor.
        let r = check_region_2d(BASE, SIZE, BASE + SIZE - 4, 1000, 0, 4, 2, 4, None);
        assert!(r.unwrap_err().reason.contains("buffer"));
        assert!(check_region_2d(BASE, SIZE, BASE + SIZE, 10, 0, 1, 1, 0, None).is_err());
        assert!(check_region_2d(BASE, SIZE, BASE - 1, 10, 0, 1, 1, 0, None).is_err());
        assert!(check_region_2d(BASE, SIZE, BASE + SIZE + 1, 10, 0, 1, 1, 0, None).is_err());
        assert!(check_region_2d(MAX - 4, 8, MAX - 4, 10, 0, 1, 1, 0, None).is_err());
    }
}
