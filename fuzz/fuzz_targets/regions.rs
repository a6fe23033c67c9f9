//! The overflow-checked region rules of `region` against a straightforward u128 evaluation of
//! the same rules (spec §5.1 rule 5, §5.2, §7.14, §7.16, §7.17): no panic, and accept exactly
//! when the exact-arithmetic rule accepts.
//!
//! Input layout (shared with tests/test_fuzz_corpus.py), little-endian, zero-padded when short:
//!   op u8      op % 5: 0 check_tensor_in_buffer(a0, a1, a2, a3)
//!                      1 check_region(a0..a5)      2 check_memset(a0..a5)
//!                      3 check_region_2d(a0..a7, payload = Some(a8))
//!                      4 check_region_2d(a0..a7, payload = None)
//!   a0..a8     nine u64
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcnet_native::region::{check_memset, check_region, check_region_2d, check_tensor_in_buffer};

const MAX: u128 = u64::MAX as u128;

/// Spec §5.1 rule 5: `[data, data + nbytes)` inside `[base, base + size)`; `base + size` fits.
fn ref_tensor_in_buffer(data: u128, nbytes: u128, base: u128, size: u128) -> bool {
    let end = base + size;
    end <= MAX && data >= base && data + nbytes <= end
}

/// Spec §5.2 (+ §10 tensor bound): `base <= data + offset < end`, `+ length <= end`,
/// `offset + length <= tensor_nbytes`; `base + size` fits.
fn ref_region(base: u128, size: u128, data: u128, off: u128, len: u128, tn: u128) -> bool {
    let end = base + size;
    let start = data + off;
    end <= MAX && start >= base && start < end && start + len <= end && off + len <= tn
}

/// Spec §7.14: inside the tensor, and `data - base + offset + length <= size`.
fn ref_memset(base: u128, size: u128, data: u128, off: u128, len: u128, tn: u128) -> bool {
    off + len <= tn && data >= base && data - base + off + len <= size
}

/// Spec §7.16 / §7.17.
#[allow(clippy::too_many_arguments)]
fn ref_region_2d(
    base: u128,
    size: u128,
    data: u128,
    tn: u128,
    off: u128,
    row: u128,
    n: u128,
    stride: u128,
    payload: Option<u128>,
) -> bool {
    if n == 0 || row == 0 {
        return false;
    }
    let rows_ok = match payload {
        Some(d) => row * n == d,
        None => row * n <= MAX,
    };
    let span = (n - 1) * stride + row;
    let end = base + size;
    rows_ok
        && span <= MAX
        && end <= MAX
        && data >= base
        && data + off + span <= end
        && off + span <= tn
}

fuzz_target!(|data: &[u8]| {
    let Some((&op, rest)) = data.split_first() else {
        return;
    };
    let a: [u64; 9] = std::array::from_fn(|i| {
        let mut b = [0u8; 8];
        let chunk = rest.get(8 * i..).unwrap_or(&[]);
        let n = chunk.len().min(8);
        b[..n].copy_from_slice(&chunk[..n]);
        u64::from_le_bytes(b)
    });
    let w = a.map(u128::from);
    let (got, want) = match op % 5 {
        0 => (
            check_tensor_in_buffer(a[0], a[1], a[2], a[3]),
            ref_tensor_in_buffer(w[0], w[1], w[2], w[3]),
        ),
        1 => (
            check_region(a[0], a[1], a[2], a[3], a[4], a[5]),
            ref_region(w[0], w[1], w[2], w[3], w[4], w[5]),
        ),
        2 => (
            check_memset(a[0], a[1], a[2], a[3], a[4], a[5]),
            ref_memset(w[0], w[1], w[2], w[3], w[4], w[5]),
        ),
        k => {
            let payload = (k == 3).then_some(a[8]);
            (
                check_region_2d(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], payload),
                ref_region_2d(
                    w[0],
                    w[1],
                    w[2],
                    w[3],
                    w[4],
                    w[5],
                    w[6],
                    w[7],
                    payload.map(u128::from),
                ),
            )
        }
    };
    match got {
        Ok(()) => assert!(want, "op {} accepted {a:?}", op % 5),
        Err(e) => {
            assert!(!want, "op {} rejected {a:?}: {e}", op % 5);
            assert!(!e.reason.is_empty());
        }
    }
});
