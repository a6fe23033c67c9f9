//! GRAPH_COMPUTE payload decoding (spec §8.1 for v8, §14 for v7). Every input is decoded in
//! both dialects; success must coincide with a u128 computation of the payload length the
//! counts require, and re-encoding a decoded graph must reproduce the consumed bytes exactly.
//!
//! Input layout (shared with tests/test_fuzz_corpus.py): the whole input is the payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcnet_native::framing::Proto;
use rpcnet_native::graph::{decode_graph, Graph};
use rpcnet_native::tensor::RPC_TENSOR_SIZE;

fn u32_at(p: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(p[off..off + 4].try_into().unwrap())
}

/// The byte length a well-formed payload needs, or `None` when it is too short.
fn reference_len(v8: bool, p: &[u8]) -> Option<usize> {
    let len = p.len() as u128;
    let header: u128 = if v8 { 16 } else { 8 };
    if len < header {
        return None;
    }
    let n_nodes = u128::from(u32_at(p, if v8 { 12 } else { 4 }));
    let nodes_end = header + 8 * n_nodes;
    if len < nodes_end + 4 {
        return None;
    }
    let n_tensors = u128::from(u32_at(p, nodes_end as usize));
    let need = nodes_end + 4 + RPC_TENSOR_SIZE as u128 * n_tensors;
    (len >= need).then_some(need as usize)
}

fn encode(v8: bool, g: &Graph) -> Vec<u8> {
    let mut out = g.device.to_le_bytes().to_vec();
    if v8 {
        out.extend_from_slice(&g.uid.to_le_bytes());
    }
    out.extend_from_slice(&u32::try_from(g.nodes.len()).unwrap().to_le_bytes());
    for n in &g.nodes {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&u32::try_from(g.tensors.len()).unwrap().to_le_bytes());
    for t in &g.tensors {
        out.extend_from_slice(&t.encode());
    }
    out
}

fuzz_target!(|data: &[u8]| {
    for (proto, v8) in [(Proto::V8, true), (Proto::V7, false)] {
        let got = decode_graph(proto, data);
        match (got, reference_len(v8, data)) {
            (Ok(g), Some(need)) => {
                if !v8 {
                    assert_eq!(g.uid, 0, "v7 has no uid");
                }
                let enc = encode(v8, &g);
                assert_eq!(enc.len(), need);
                assert_eq!(&enc[..], &data[..need], "{proto:?} re-encoding differs");
            }
            (Err(e), None) => assert!(!e.reason.is_empty()),
            (Ok(_), None) => panic!("{proto:?}: accepted a truncated payload of {}", data.len()),
            (Err(e), Some(need)) => {
                panic!(
                    "{proto:?}: rejected a complete payload ({need} of {}): {e}",
                    data.len()
                )
            }
        }
    }
});
