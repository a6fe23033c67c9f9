//! Shared by the kernels' unit tests: deterministic inputs.

/// `len` values in [-1, 1) from an xorshift stream seeded by `seed`.
pub fn noise(seed: u64, len: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Random bytes for a weight type whose f16 scales are small finite numbers.
pub fn weights(type_id: u32, m: usize, k: usize, seed: u64) -> Vec<u8> {
    let info = crate::kernels::formats::type_info(type_id).unwrap();
    let nbytes = m * k / info.block * info.block_bytes;
    let mut b: Vec<u8> = noise(seed, nbytes)
        .iter()
        .map(|v| ((v + 1.0) * 127.9) as u8)
        .collect();
    let fix = |b: &mut [u8], at: usize| {
        b[at..at + 2]
            .copy_from_slice(&crate::kernels::blocks::half::f32_to_fp16(0.01).to_le_bytes());
    };
    for blk in b.chunks_exact_mut(info.block_bytes) {
        match type_id {
            0 => blk.copy_from_slice(&0.5f32.to_le_bytes()),
            1 | 30 => {
                blk[1] &= 0x3f;
            }
            2 | 6 | 8 | 20 | 23 => fix(blk, 0),
            3 | 7 | 12 | 13 => {
                fix(blk, 0);
                fix(blk, 2)
            }
            10 => {
                fix(blk, 80);
                fix(blk, 82)
            }
            11 => fix(blk, 108),
            14 => fix(blk, 208),
            39 => blk[0] = 120,
            _ => {}
        }
    }
    b
}
