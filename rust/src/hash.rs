//! FNV-1a 64 (spec §7.12), the content key of the server's hash cache.
//!
//! The algorithm is byte-serial: every step depends on the previous product, so the loop is
//! bound by multiply latency and there is nothing to vectorise; the goal is simply a loop that
//! compiles to the same xor+imul chain a C compiler emits.

use std::sync::atomic::{AtomicU8, Ordering};

pub const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

#[inline(always)]
fn step(h: u64, b: u8) -> u64 {
    (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
}

/// Continue hashing `data` from state `h`.
#[inline]
pub fn update(h: u64, data: &[u8]) -> u64 {
    data.iter().fold(h, |h, &b| step(h, b))
}

/// Same as [`update`] for memory that other threads may write concurrently (a Python buffer
/// hashed with the GIL released). Relaxed byte loads compile to plain loads, so this costs
/// nothing over [`update`], but it keeps the Rust side free of a data race on `&[u8]`.
#[inline]
pub fn update_shared(h: u64, data: &[AtomicU8]) -> u64 {
    data.iter()
        .fold(h, |h, b| step(h, b.load(Ordering::Relaxed)))
}

/// One-shot hash.
pub fn fnv1a64(data: &[u8]) -> u64 {
    update(FNV_OFFSET_BASIS, data)
}

/// Incremental hasher: feeding the data in pieces gives the one-shot result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a64 {
    state: u64,
}

impl Default for Fnv1a64 {
    fn default() -> Self {
        Self::new()
    }
}

impl Fnv1a64 {
    pub fn new() -> Self {
        Self {
            state: FNV_OFFSET_BASIS,
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        self.state = update(self.state, data);
    }

    pub fn digest(&self) -> u64 {
        self.state
    }

    /// The cache file name: 16 lowercase hex digits, zero padded.
    pub fn hexdigest(&self) -> String {
        hex(self.state)
    }
}

pub fn hex(h: u64) -> String {
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_vectors() {
        let v: Vec<u8> = (1..=16).collect();
        assert_eq!(fnv1a64(&v), 0xe7ec_fb4f_6e00_6495);
        assert_eq!(hex(fnv1a64(&v)), "e7ecfb4f6e006495");
        assert_eq!(fnv1a64(&[]), 0xcbf2_9ce4_8422_2325);
        // Published FNV-1a 64 vectors.
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn incremental_matches_one_shot() {
        let v: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut h = Fnv1a64::new();
        for piece in v.chunks(7) {
            h.update(piece);
        }
        assert_eq!(h.digest(), fnv1a64(&v));
        let shared: Vec<AtomicU8> = v.iter().map(|&b| AtomicU8::new(b)).collect();
        assert_eq!(update_shared(FNV_OFFSET_BASIS, &shared), fnv1a64(&v));
        assert_eq!(Fnv1a64::default(), Fnv1a64::new());
    }

    #[test]
    fn hex_is_zero_padded() {
        assert_eq!(hex(0xab), "00000000000000ab");
        assert_eq!(Fnv1a64::new().hexdigest(), "cbf29ce484222325");
    }
}
