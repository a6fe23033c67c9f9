//! Splitting a transfer into pieces of at most one syscall's worth (spec §1.2: the reference
//! never moves more than 1 GiB per send/recv; invisible on the wire).

/// Largest piece the reference hands to one send()/recv().
pub const MAX_CHUNK: u64 = 1 << 30;

/// `(offset, length)` pieces covering `[0, total)`, none longer than `chunk` (> 0).
pub fn chunk_plan(total: u64, chunk: u64) -> impl Iterator<Item = (u64, u64)> {
    assert!(chunk > 0, "chunk size must be positive");
    let count = total.div_ceil(chunk);
    (0..count).map(move |i| {
        let off = i * chunk;
        (off, chunk.min(total - off))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(total: u64, chunk: u64) -> Vec<(u64, u64)> {
        chunk_plan(total, chunk).collect()
    }

    #[test]
    fn pieces() {
        assert!(plan(0, 4).is_empty());
        assert_eq!(plan(3, 4), vec![(0, 3)]);
        assert_eq!(plan(8, 4), vec![(0, 4), (4, 4)]);
        assert_eq!(plan(9, 4), vec![(0, 4), (4, 4), (8, 1)]);
        assert_eq!(plan(3 * MAX_CHUNK + 1, MAX_CHUNK).len(), 4);
    }

    #[test]
    fn extreme_sizes() {
        let p = plan(u64::MAX, 1 << 62);
        assert_eq!(p.len(), 4);
        assert_eq!(p[3], (3 << 62, (1 << 62) - 1));
        assert_eq!(plan(u64::MAX, u64::MAX), vec![(0, u64::MAX)]);
    }

    #[test]
    #[should_panic]
    fn zero_chunk_panics() {
        let _ = chunk_plan(1, 0);
    }
}
