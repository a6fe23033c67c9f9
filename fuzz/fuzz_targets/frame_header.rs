//! `framing::check_header` on arbitrary headers, checked against an independent table of the
//! spec's request sizes (§3, §14) and the payload caps (§1.2).
//!
//! Input layout (shared with tests/test_fuzz_corpus.py), little-endian, zero-padded when short:
//!   flags u8   bit 0: dialect (0 = v8, 1 = v7); bit 1: cmd is a u64 (else one wire byte)
//!   cmd        u8 or u64
//!   size u64, max_data u64, max_graph u64
#![no_main]

use libfuzzer_sys::fuzz_target;
use rpcnet_native::framing::{check_header, command_name, Command, Proto};

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
}

enum Rule {
    Exactly(u64),
    AtLeast(u64),
}

/// The request-size rule of `cmd`, written out from the spec tables (not from `framing`).
fn reference_rule(v7: bool, cmd: u64) -> Option<Rule> {
    use Rule::{AtLeast, Exactly};
    let limit = if v7 { 18 } else { 23 };
    if cmd >= limit {
        return None;
    }
    Some(match cmd {
        0 => Exactly(12),
        1 | 2 | 11 | 22 => Exactly(4),
        3 | 4 => Exactly(8),
        5 => Exactly(9),
        6 => AtLeast(296 + 1 + 8),
        7 | 8 => Exactly(296 + 16),
        9 => Exactly(2 * 296),
        10 => AtLeast(if v7 { 8 } else { 16 }),
        12 => Exactly(296),
        13 => Exactly(4 + 11 * 296),
        14 => Exactly(24),
        15 => Exactly(0),
        16 => Exactly(if v7 { 4 } else { 12 }),
        17 => Exactly(296 + 17),
        18 => AtLeast(296 + 32),
        19 => Exactly(296 + 32),
        20 => Exactly(80),
        21 => Exactly(4 + 296),
        _ => unreachable!("cmd < limit <= 23"),
    })
}

fn reference_ok(v7: bool, cmd: u64, size: u64, max_data: u64, max_graph: u64) -> bool {
    let size_ok = match reference_rule(v7, cmd) {
        None => return false,
        Some(Rule::Exactly(n)) => size == n,
        Some(Rule::AtLeast(n)) => size >= n,
    };
    let cap_ok = match cmd {
        6 | 18 => size <= max_data,
        10 => size <= max_graph,
        _ => true,
    };
    size_ok && cap_ok
}

fuzz_target!(|data: &[u8]| {
    let mut r = Reader(data);
    let flags = r.u8();
    let v7 = flags & 1 != 0;
    let cmd = if flags & 2 != 0 {
        r.u64()
    } else {
        u64::from(r.u8())
    };
    let (size, max_data, max_graph) = (r.u64(), r.u64(), r.u64());
    let proto = if v7 { Proto::V7 } else { Proto::V8 };

    let got = check_header(proto, cmd, size, max_data, max_graph);
    let want = reference_ok(v7, cmd, size, max_data, max_graph);
    match &got {
        Ok(c) => {
            assert!(
                want,
                "accepted: v7={v7} cmd={cmd} size={size} caps={max_data},{max_graph}"
            );
            assert_eq!(u64::from(c.id()), cmd);
            assert_eq!(Command::from_id(proto, cmd), Some(*c));
            assert_eq!(command_name(proto, cmd), c.name());
            let _ = (c.request_size(proto), c.response_size());
        }
        Err(e) => {
            assert!(
                !want,
                "rejected: v7={v7} cmd={cmd} size={size} caps={max_data},{max_graph}: {e}"
            );
            assert_eq!((e.cmd, e.size), (cmd, size));
            assert!(!e.reason.is_empty());
            let _ = e.to_string();
        }
    }
    // Unknown ids and only unknown ids have no command.
    assert_eq!(
        Command::from_id(proto, cmd).is_some(),
        reference_rule(v7, cmd).is_some()
    );
});
