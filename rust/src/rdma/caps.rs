//! The 24-byte HELLO `conn_caps` codec (Linux verbs layout).

use super::error::RdmaError;
use super::gid::{Gid, GID_SIZE};

/// Size of `conn_caps` in HELLO (request and response).
pub const CAPS_SIZE: usize = 24;
/// The PSN advertised in caps is the QP number's low 24 bits.
pub const PSN_MASK: u32 = 0x00FF_FFFF;

/// Non-zero `conn_caps`: `qpn` u32 @0, `psn` u32 @4, `gid[16]` @8 (little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Caps {
    pub qpn: u32,
    pub psn: u32,
    pub gid: Gid,
}

impl Caps {
    /// Caps for a queue pair, with the reference's PSN rule (`qpn & 0xFFFFFF`).
    pub fn for_qp(qpn: u32, gid: Gid) -> Self {
        Self {
            qpn,
            psn: qpn & PSN_MASK,
            gid,
        }
    }

    pub fn encode(&self) -> [u8; CAPS_SIZE] {
        let mut out = [0u8; CAPS_SIZE];
        out[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        out[4..8].copy_from_slice(&self.psn.to_le_bytes());
        out[8..24].copy_from_slice(&self.gid);
        out
    }

    /// `None` for the all-zero "no RDMA" caps; an error unless exactly 24 bytes.
    pub fn decode(bytes: &[u8]) -> Result<Option<Self>, RdmaError> {
        if bytes.len() != CAPS_SIZE {
            return Err(RdmaError::new(format!(
                "conn_caps must be {CAPS_SIZE} bytes, got {}",
                bytes.len()
            )));
        }
        if bytes.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let mut gid = [0u8; GID_SIZE];
        gid.copy_from_slice(&bytes[8..24]);
        Ok(Some(Self {
            qpn: word(0),
            psn: word(4),
            gid,
        }))
    }
}
