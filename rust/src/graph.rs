//! GRAPH_COMPUTE payload decoding (spec §8.1 for v8, §14 for v7) and the walk over what its
//! nodes reach (spec §8.3). Decoding checks only the framing; the walk checks ids, cycles and,
//! through the caller's check, every reachable tensor against the server's buffers.

use std::collections::HashMap;

use crate::errors::GraphError;
use crate::framing::Proto;
use crate::tensor::{RpcTensor, GGML_MAX_SRC, RPC_TENSOR_SIZE};

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

/// One node to compute: its index in `Graph::tensors` and those of its sources (None where the
/// slot is empty).
pub type NodeRefs = (usize, [Option<usize>; GGML_MAX_SRC]);

impl Graph {
    /// Walk everything the nodes reach through `src` and `view_src`, as the reference's
    /// deserializer does (the first tensor sent with an id wins), calling `check` once on each
    /// reachable tensor, sources first. Fails on an id that was not sent, a cycle, a node listed
    /// twice, or the first failed check. Returns the nodes (id 0 skipped) in order, each with its
    /// direct sources: nothing else of a graph is needed to run it, so a one-node graph that
    /// carries its whole ancestry (as the client's reductions send them) is walked, not built.
    pub fn walk<E: From<GraphError>>(
        &self,
        mut check: impl FnMut(&RpcTensor) -> Result<(), E>,
    ) -> Result<Vec<NodeRefs>, E> {
        let mut index: HashMap<u64, usize> = HashMap::with_capacity(self.tensors.len());
        for (i, t) in self.tensors.iter().enumerate() {
            index.entry(t.id).or_insert(i);
        }
        let lookup = |id: u64| {
            index.get(&id).copied().ok_or_else(|| {
                GraphError::new(format!(
                    "graph references tensor id {id:#x} that was not sent"
                ))
            })
        };
        #[derive(Clone, Copy, PartialEq)]
        enum State {
            New,
            Visiting,
            Done,
        }
        let mut state = vec![State::New; self.tensors.len()];
        let mut is_node = vec![false; self.tensors.len()];
        let mut stack: Vec<(usize, bool)> = Vec::new();
        let mut out = Vec::with_capacity(self.nodes.len());
        for &nid in &self.nodes {
            if nid == 0 {
                continue;
            }
            let root = lookup(nid)?;
            if std::mem::replace(&mut is_node[root], true) {
                return Err(GraphError::new("graph lists the same node twice").into());
            }
            // Iterative post-order: client graphs can be thousands of tensors deep.
            stack.push((root, false));
            while let Some((cur, expanded)) = stack.pop() {
                if state[cur] == State::Done {
                    continue;
                }
                let t = &self.tensors[cur];
                if expanded {
                    check(t)?;
                    state[cur] = State::Done;
                    continue;
                }
                if state[cur] == State::Visiting {
                    let id = t.id;
                    return Err(GraphError::new(format!(
                        "graph has a cycle through tensor id {id:#x}"
                    ))
                    .into());
                }
                state[cur] = State::Visiting;
                stack.push((cur, true));
                for &dep in t.src.iter().chain(std::iter::once(&t.view_src)) {
                    if dep != 0 {
                        let d = lookup(dep)?;
                        if state[d] != State::Done {
                            stack.push((d, false));
                        }
                    }
                }
            }
            let mut srcs = [None; GGML_MAX_SRC];
            for (slot, &sid) in srcs.iter_mut().zip(self.tensors[root].src.iter()) {
                if sid != 0 {
                    *slot = Some(lookup(sid)?);
                }
            }
            out.push((root, srcs));
        }
        Ok(out)
    }
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

    fn linked(id: u64, src: &[u64], view_src: u64) -> RpcTensor {
        let mut t = tensor(id);
        t.src[..src.len()].copy_from_slice(src);
        t.view_src = view_src;
        t
    }

    fn graph(nodes: &[u64], tensors: Vec<RpcTensor>) -> Graph {
        Graph {
            device: 0,
            uid: 0,
            nodes: nodes.to_vec(),
            tensors,
        }
    }

    fn walk_ids(g: &Graph) -> Result<(Vec<NodeRefs>, Vec<u64>), GraphError> {
        let mut checked = Vec::new();
        let nodes = g.walk(|t: &RpcTensor| -> Result<(), GraphError> {
            checked.push(t.id);
            Ok(())
        })?;
        Ok((nodes, checked))
    }

    #[test]
    fn walk_checks_every_ancestor_once_sources_first() {
        // 4 = add(3, 2); 3 = view of 1; 2 = mul(1, 1); 9 is sent but unreachable.
        let g = graph(
            &[0, 4],
            vec![
                linked(1, &[], 0),
                linked(2, &[1, 1], 0),
                linked(3, &[], 1),
                linked(4, &[3, 2], 0),
                linked(9, &[], 0),
            ],
        );
        let (nodes, checked) = walk_ids(&g).unwrap();
        assert_eq!(nodes.len(), 1);
        let (root, srcs) = nodes[0];
        assert_eq!(root, 3);
        assert_eq!(&srcs[..3], &[Some(2), Some(1), None]);
        let mut sorted = checked.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, vec![1, 2, 3, 4]);
        let pos = |id| checked.iter().position(|&c| c == id).unwrap();
        assert!(pos(1) < pos(2) && pos(1) < pos(3) && pos(2) < pos(4) && pos(3) < pos(4));
    }

    #[test]
    fn walk_first_duplicate_id_wins() {
        let g = graph(
            &[5],
            vec![linked(5, &[7], 0), linked(7, &[], 0), linked(5, &[], 0)],
        );
        let (nodes, checked) = walk_ids(&g).unwrap();
        assert_eq!(nodes[0].0, 0);
        assert_eq!(nodes[0].1[0], Some(1));
        assert_eq!(checked, vec![7, 5]);
    }

    #[test]
    fn walk_refuses_missing_ids_cycles_and_repeated_nodes() {
        let missing = graph(&[5], vec![linked(5, &[1], 0), linked(1, &[], 6)]);
        let err = walk_ids(&missing).unwrap_err();
        assert!(
            err.reason.contains("0x6 that was not sent"),
            "{}",
            err.reason
        );
        assert!(walk_ids(&graph(&[8], vec![])).is_err());
        let cycle = graph(&[5], vec![linked(5, &[5, 5], 0)]);
        assert!(walk_ids(&cycle).unwrap_err().reason.contains("cycle"));
        let long = graph(
            &[1],
            vec![linked(1, &[2], 0), linked(2, &[3], 0), linked(3, &[], 1)],
        );
        assert!(walk_ids(&long).unwrap_err().reason.contains("cycle"));
        let twice = graph(&[1, 1], vec![linked(1, &[], 0)]);
        assert!(walk_ids(&twice).unwrap_err().reason.contains("twice"));
    }

    #[test]
    fn walk_stops_at_the_first_failed_check() {
        let g = graph(&[2], vec![linked(1, &[], 0), linked(2, &[1], 0)]);
        let err = g
            .walk(|t: &RpcTensor| {
                if t.id == 1 {
                    Err(GraphError::new("bad"))
                } else {
                    Ok(())
                }
            })
            .unwrap_err();
        assert_eq!(err.reason, "bad");
    }

    #[test]
    fn walk_handles_deep_chains() {
        let n = 100_000u64;
        let tensors = (1..=n).map(|i| linked(i, &[i - 1], 0)).collect();
        let (nodes, checked) = walk_ids(&graph(&[n], tensors)).unwrap();
        assert_eq!(nodes.len(), 1);
        assert_eq!(checked.len() as u64, n);
    }
}
