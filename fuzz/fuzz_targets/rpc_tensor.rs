//! The 296-byte `rpc_tensor` codec: `decode_at` / `decode_many` on arbitrary buffers and
//! offsets, byte-identical decode -> encode round trips, independent field reads at the spec's
//! offsets (§4), and `nbytes` / `nelements` against a u128 evaluation of the same formulas.
//!
//! Input layout (shared with tests/test_fuzz_corpus.py):
//!   off u8     offset = off if off < 0xF0, else usize::MAX - (off - 0xF0)
//!   cnt u8     count  = cnt if cnt < 0xF0, else usize::MAX - (cnt - 0xF0)
//!   buf        the rest of the input
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcnet_native::tensor::{RpcTensor, RPC_TENSOR_SIZE};
use rpcnet_native::types::TYPES;

const T: usize = RPC_TENSOR_SIZE;

fn selector(b: u8) -> usize {
    if b < 0xF0 {
        usize::from(b)
    } else {
        usize::MAX - usize::from(b - 0xF0)
    }
}

fn le(b: &[u8]) -> u128 {
    b.iter()
        .rev()
        .fold(0u128, |acc, &x| (acc << 8) | u128::from(x))
}

/// ggml_nbytes (spec §5.1) in u128: `None` for an invalid type, else the exact value.
fn reference_nbytes(t: &RpcTensor) -> Option<u128> {
    let info = TYPES.get(t.type_id as usize)?;
    if info.block_size == 0 {
        return None;
    }
    let ne = t.ne.map(u128::from);
    let nb = t.nb.map(u128::from);
    if ne.contains(&0) {
        return Some(0);
    }
    let (bs, ts) = (u128::from(info.block_size), u128::from(info.type_size));
    Some(if bs == 1 {
        ts + (0..4).map(|i| (ne[i] - 1) * nb[i]).sum::<u128>()
    } else {
        ne[0] * nb[0] / bs + (1..4).map(|i| (ne[i] - 1) * nb[i]).sum::<u128>()
    })
}

fn check_tensor(t: &RpcTensor, raw: &[u8]) {
    // Byte-identical round trip and the value round trip.
    let enc = t.encode();
    assert_eq!(&enc[..], raw, "encode(decode(b)) != b");
    assert_eq!(&RpcTensor::decode(&enc), t);
    // Independent reads at the spec offsets.
    assert_eq!(u128::from(t.id), le(&raw[0..8]));
    assert_eq!(u128::from(t.type_id), le(&raw[8..12]));
    assert_eq!(u128::from(t.buffer), le(&raw[12..20]));
    for i in 0..4 {
        assert_eq!(u128::from(t.ne[i]), le(&raw[20 + 4 * i..24 + 4 * i]));
        assert_eq!(u128::from(t.nb[i]), le(&raw[36 + 4 * i..40 + 4 * i]));
    }
    assert_eq!(u128::from(t.op), le(&raw[52..56]));
    assert_eq!(&t.op_params[..], &raw[56..120]);
    assert_eq!(t.flags.to_le_bytes(), raw[120..124]);
    for i in 0..10 {
        assert_eq!(u128::from(t.src[i]), le(&raw[124 + 8 * i..132 + 8 * i]));
    }
    assert_eq!(u128::from(t.view_src), le(&raw[204..212]));
    assert_eq!(u128::from(t.view_offs), le(&raw[212..220]));
    assert_eq!(u128::from(t.data), le(&raw[220..228]));
    assert_eq!(&t.name[..], &raw[228..292]);
    assert_eq!(t.use_count.to_le_bytes(), raw[292..296]);

    // Accessors.
    let name = t.name_bytes();
    assert!(!name.contains(&0));
    assert_eq!(name, &raw[228..228 + name.len()]);
    assert!(name.len() == 64 || raw[228 + name.len()] == 0);
    for i in 0..16 {
        let bits = t.op_param_bits(i).expect("slot in range");
        assert_eq!(bits.to_le_bytes(), raw[56 + 4 * i..60 + 4 * i]);
    }
    assert_eq!(t.op_param_bits(16), None);
    assert_eq!(t.op_param_bits(usize::MAX), None);

    // nbytes: Ok(v) iff the type is valid and the exact value fits u64.
    match (t.nbytes(), reference_nbytes(t)) {
        (Ok(v), Some(want)) => assert_eq!(u128::from(v), want),
        (Err(_), Some(want)) => assert!(want > u128::from(u64::MAX), "nbytes {want} rejected"),
        (Err(_), None) => {}
        (Ok(v), None) => panic!("nbytes {v} for invalid type {}", t.type_id),
    }

    // nelements: Ok exactly when ggml_new_tensor_impl's int64 rule passes (spec §5.3), and
    // then the exact product.
    let product = t.ne.iter().map(|&n| u128::from(n)).product::<u128>();
    let max = i64::MAX as u128;
    let mut running = u128::from(t.ne[0]);
    let mut ggml_ok = running <= max;
    for &n in &t.ne[1..] {
        let n = u128::from(n);
        if ggml_ok && n > 1 {
            ggml_ok = n <= max && max / n > running;
            running *= n;
        }
    }
    match t.nelements() {
        Ok(v) => {
            assert!(ggml_ok, "nelements {v} accepted where ggml asserts");
            assert_eq!(u128::from(v), product);
        }
        Err(e) => assert!(!ggml_ok, "nelements {product} rejected: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let (offset, count) = (selector(data[0]), selector(data[1]));
    let buf = &data[2..];
    let len = buf.len() as u128;

    let one = RpcTensor::decode_at(buf, offset);
    let fits = offset as u128 + T as u128 <= len;
    match &one {
        Ok(t) => {
            assert!(fits);
            check_tensor(t, &buf[offset..offset + T]);
        }
        Err(e) => {
            assert!(!fits, "decode_at({offset}) of {len} bytes failed: {e}");
            assert!(!e.reason.is_empty());
        }
    }

    let many = RpcTensor::decode_many(buf, offset, count);
    let fits = offset as u128 + count as u128 * T as u128 <= len;
    match many {
        Ok(ts) => {
            assert!(fits);
            assert_eq!(ts.len(), count);
            for (i, t) in ts.iter().enumerate() {
                let at = offset + i * T;
                check_tensor(t, &buf[at..at + T]);
            }
            if let (Some(first), Ok(t)) = (ts.first(), &one) {
                assert_eq!(first, t);
            }
        }
        Err(e) => {
            assert!(
                !fits,
                "decode_many({offset}, {count}) of {len} bytes failed: {e}"
            );
        }
    }
});
