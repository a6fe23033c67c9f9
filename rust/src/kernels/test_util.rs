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

/// `v` as the weights of float type `type_id`: f16 (1), bf16 (30, truncated) or f32.
pub fn float_weights(type_id: u32, v: &[f32]) -> Vec<u8> {
    match type_id {
        1 => v
            .iter()
            .flat_map(|x| crate::kernels::blocks::half::f32_to_fp16(*x).to_le_bytes())
            .collect(),
        30 => v
            .iter()
            .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// The `(m, k, n)` shapes the float matmul tests run: ragged ones; K a multiple of 8 (f16
/// rows read in place, the next tile prefetched); for the AVX-512 tiles K in three slices and
/// activation rows in one chunk of more than XF_BYTES, then in two chunks.
const FLOAT_SHAPES: [(usize, usize, usize); 10] = [
    (4, 8, 2),
    (12, 37, 5),
    (40, 300, 33),
    (8, 1, 3),
    (6, 20, 3),
    (40, 256, 33),
    (50, 64, 7),
    (36, 1100, 40),
    (16, 4100, 70),
    (16, 4100, 100),
];

/// [`float_case`] of every float type and [`FLOAT_SHAPES`] shape, with the type and shape.
#[allow(clippy::type_complexity)]
pub fn float_cases() -> impl Iterator<
    Item = (
        u32,
        (usize, usize, usize),
        Vec<u8>,
        Vec<f32>,
        crate::kernels::operand::Converted,
        Vec<f32>,
    ),
> {
    [0u32, 1, 30].into_iter().flat_map(|t| {
        FLOAT_SHAPES.into_iter().map(move |(m, k, n)| {
            let (w, x, act, want) = float_case(t, m, k, n);
            (t, (m, k, n), w, x, act, want)
        })
    })
}

/// A float matmul case (type 0, 1 or 30): `m × k` weights and `n × k` activations from noise,
/// the activations converted for the type, and every output `[r][i]` as the one-pair
/// tinyBLAS-order dot computes it.
pub fn float_case(
    type_id: u32,
    m: usize,
    k: usize,
    n: usize,
) -> (
    Vec<u8>,
    Vec<f32>,
    crate::kernels::operand::Converted,
    Vec<f32>,
) {
    use crate::kernels::dot::by_type::{BF16, F16, F32};
    use crate::kernels::dot::row_dot::RowDot;
    let w = float_weights(type_id, &noise(3 + type_id as u64, m * k));
    let x = noise(9, n * k);
    let fmt = crate::kernels::formats::type_info(type_id).unwrap().act;
    let act = crate::kernels::operand::Converted::new(fmt, &x, k);
    let row = k * fmt.block_bytes();
    let want = (0..n * m)
        .map(|o| {
            let (r, i) = (o / m, o % m);
            let (wr, xr) = (&w[i * row..(i + 1) * row], act.row(r));
            match type_id {
                1 => F16::dot_gemm(wr, xr, k),
                30 => BF16::dot_gemm(wr, xr, k),
                _ => F32::dot_gemm(wr, xr, k),
            }
        })
        .collect();
    (w, x, act, want)
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
