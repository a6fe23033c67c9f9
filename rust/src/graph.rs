//! GRAPH_COMPUTE payload decoding (spec §8.1 for v8, §14 for v7). Only the framing is checked
//! here; resolving ids and validating tensors is the server's job (spec §8.3).

use crate::errors::GraphError;
use crate::framing::Proto;
use crate::tensor::{RpcTensor, RPC_TENSOR_SIZE};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Graph {
    pub device: u32,
    /// Client graph uid; always 0 for v7, which has no uid field.
    pub uid: u64,
    pub nodes: Vec<u64>,
    pub tensors: Vec<RpcTensor>,
}

fn u32_at(p: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(p[off..off + 4].try_into().expect("4-byte slice"))
}

fn u64_at(p: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(p[off..off + 8].try_into().expect("8-byte slice"))
}

/// `payload.len() >= need`, with `need` computed in u64 so huge counts cannot wrap.
fn require(payload: &[u8], need: Option<u64>, what: &str) -> Result<(), GraphError> {
    let have = payload.len() as u64;
    match need {
        Some(n) if have >= n => Ok(()),
        Some(n) => Err(GraphError::new(format!(
            "truncated GRAPH_COMPUTE payload: {what} needs {n} bytes, got {have}"
        ))),
        None => Err(GraphError::new(format!(
            "GRAPH_COMPUTE {what} size overflows"
        ))),
    }
}

/// Decode a GRAPH_COMPUTE payload. Trailing bytes are ignored (as the reference does).
pub fn decode_graph(proto: Proto, payload: &[u8]) -> Result<Graph, GraphError> {
    // v8 adds `uid u64` after `device`; everything after shifts by 8 bytes.
    let header = match proto {
        Proto::V8 => 16u64,
        Proto::V7 => 8u64,
    };
    require(payload, Some(header), "header")?;
    let device = u32_at(payload, 0);
    let (uid, n_nodes_off) = match proto {
        Proto::V8 => (u64_at(payload, 4), 12usize),
        Proto::V7 => (0, 4usize),
    };
    let n_nodes = u64::from(u32_at(payload, n_nodes_off));
    let nodes_off = header;
    // Spec: payload < header + 4 + 8·n_nodes fails (room for n_tensors as well).
    let nodes_end = n_nodes
        .checked_mul(8)
        .and_then(|n| n.checked_add(nodes_off));
    require(
        payload,
        nodes_end.and_then(|e| e.checked_add(4)),
        "node list",
    )?;
    let nodes_end = nodes_end.expect("checked above") as usize;
    let nodes = payload[nodes_off as usize..nodes_end]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8-byte chunk")))
        .collect();
    let n_tensors = u64::from(u32_at(payload, nodes_end));
    let tensors_off = nodes_end as u64 + 4;
    require(
        payload,
        n_tensors
            .checked_mul(RPC_TENSOR_SIZE as u64)
            .and_then(|n| n.checked_add(tensors_off)),
        "tensor list",
    )?;
    let tensors = RpcTensor::decode_many(payload, tensors_off as usize, n_tensors as usize)
        .map_err(|e| GraphError::new(e.reason))?;
    Ok(Graph {
        device,
        uid,
        nodes,
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(id: u64) -> RpcTensor {
        RpcTensor {
            id,
            ne: [1; 4],
            ..RpcTensor::default()
        }
    }

    fn build(proto: Proto, device: u32, uid: u64, nodes: &[u64], tensors: &[RpcTensor]) -> Vec<u8> {
        let mut p = device.to_le_bytes().to_vec();
        if proto == Proto::V8 {
            p.extend_from_slice(&uid.to_le_bytes());
        }
        p.extend_from_slice(&(nodes.len() as u32).to_le_bytes());
        for n in nodes {
            p.extend_from_slice(&n.to_le_bytes());
        }
        p.extend_from_slice(&(tensors.len() as u32).to_le_bytes());
        for t in tensors {
            p.extend_from_slice(&t.encode());
        }
        p
    }

    #[test]
    fn v8_round_trip() {
        let ts = [tensor(1), tensor(2), tensor(3)];
        let p = build(Proto::V8, 2, 24, &[3, 2], &ts);
        assert_eq!(p.len(), 20 + 16 + 3 * 296);
        let g = decode_graph(Proto::V8, &p).unwrap();
        assert_eq!((g.device, g.uid), (2, 24));
        assert_eq!(g.nodes, vec![3, 2]);
        assert_eq!(g.tensors, ts.to_vec());
    }

    #[test]
    fn v7_round_trip() {
        let ts = [tensor(9)];
        let p = build(Proto::V7, 1, 99, &[9], &ts);
        assert_eq!(p.len(), 12 + 8 + 296);
        let g = decode_graph(Proto::V7, &p).unwrap();
        assert_eq!((g.device, g.uid), (1, 0));
        assert_eq!(g.nodes, vec![9]);
        assert_eq!(g.tensors, ts.to_vec());
    }

    #[test]
    fn empty_graph_and_trailing_bytes() {
        let mut p = build(Proto::V8, 0, 0, &[], &[]);
        assert_eq!(p.len(), 20);
        assert!(decode_graph(Proto::V8, &p).unwrap().nodes.is_empty());
        p.extend_from_slice(&[0xFF; 100]);
        let g = decode_graph(Proto::V8, &p).unwrap();
        assert!(g.tensors.is_empty());
    }

    #[test]
    fn every_truncation_fails() {
        for proto in [Proto::V8, Proto::V7] {
            let p = build(proto, 0, 5, &[1, 2], &[tensor(1), tensor(2)]);
            assert!(decode_graph(proto, &p).is_ok());
            for len in 0..p.len() {
                assert!(
                    decode_graph(proto, &p[..len]).is_err(),
                    "{proto:?} len {len} should fail"
                );
            }
        }
    }

    #[test]
    fn exact_minimums() {
        // v8: payload < 16 fails; 16 bytes with n_nodes = 0 still lacks n_tensors (< 20).
        let mut p = vec![0u8; 16];
        assert!(decode_graph(Proto::V8, &p).is_err());
        p.extend_from_slice(&[0; 4]);
        assert!(decode_graph(Proto::V8, &p).is_ok());
        // v7: 8-byte header, then n_tensors at 8 + 8·n_nodes.
        assert!(decode_graph(Proto::V7, &[0u8; 8]).is_err());
        assert!(decode_graph(Proto::V7, &[0u8; 12]).is_ok());
    }

    #[test]
    fn huge_counts_do_not_overflow() {
        let mut p = vec![0u8; 16];
        p[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = decode_graph(Proto::V8, &p).unwrap_err();
        assert!(err.reason.contains("node list"), "{}", err.reason);
        let mut p = build(Proto::V8, 0, 0, &[], &[]);
        p[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = decode_graph(Proto::V8, &p).unwrap_err();
        assert!(err.reason.contains("tensor list"), "{}", err.reason);
    }
}
