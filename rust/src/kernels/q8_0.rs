//! q8_0 weights × float32 activations, computed like ggml's CPU backend: the activation rows
//! are quantized to q8_0 (`quantize_row_q8_0_ref`), each 32-element block pair gives an exact
//! integer dot product, scaled by `d_w · d_x` and summed in float32 (`vec_dot_q8_0_q8_0`).
//!
//! Block layout (34 bytes): `d` as little-endian IEEE half, then 32 × i8 `qs`; value = q · d.

use super::{f32_to_fp16, fp16_to_f32, KernelError};

/// Elements per block.
pub const QK8_0: usize = 32;
/// Bytes per block.
pub const BLOCK_BYTES: usize = 34;
/// Most activation rows one pass handles (the accumulators live in registers).
pub const MAX_ROWS: usize = 8;
/// Below this many weight bytes per thread, extra threads cost more than they save.
const MIN_BYTES_PER_THREAD: usize = 256 * 1024;

/// ggml's `MAX(a, b)`: `a > b ? a : b` (a NaN in `b` propagates, one in `a` is replaced).
#[inline(always)]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// One block of `x` (32 values) quantized like `quantize_row_q8_0_ref`: the f16 bits of `d`
/// and the codes.
#[inline]
pub fn quantize_block(x: &[f32; QK8_0]) -> (u16, [i8; QK8_0]) {
    let amax = x.iter().fold(0.0f32, |m, v| c_max(m, v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut qs = [0i8; QK8_0];
    for (q, v) in qs.iter_mut().zip(x) {
        // roundf: half away from zero; `as` saturates and maps NaN to 0
        *q = (v * id).round() as i8;
    }
    (f32_to_fp16(d), qs)
}

/// `quantize_row_q8_0_ref` into ggml's block bytes; `x.len()` must be a multiple of 32 and
/// `out` hold `x.len() / 32 * 34` bytes.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) -> Result<(), KernelError> {
    if !x.len().is_multiple_of(QK8_0) || out.len() != x.len() / QK8_0 * BLOCK_BYTES {
        return Err(KernelError::new(format!(
            "q8_0 row: {} values do not fill {} bytes of blocks",
            x.len(),
            out.len()
        )));
    }
    for (xb, ob) in x.chunks_exact(QK8_0).zip(out.chunks_exact_mut(BLOCK_BYTES)) {
        let (d, qs) = quantize_block(xb.try_into().expect("32 values"));
        ob[..2].copy_from_slice(&d.to_le_bytes());
        for (o, q) in ob[2..].iter_mut().zip(qs) {
            *o = q as u8;
        }
    }
    Ok(())
}

/// Activation rows in q8_0, split for the dot product: scales (decoded to f32) and codes,
/// both indexed `[row * blocks + block]`.
struct Activations {
    rows: usize,
    blocks: usize,
    d: Vec<f32>,
    qs: Vec<[i8; QK8_0]>,
}

impl Activations {
    fn quantize(x: &[f32], k: usize) -> Self {
        let blocks = k / QK8_0;
        let rows = x.len() / k;
        let mut d = Vec::with_capacity(rows * blocks);
        let mut qs = Vec::with_capacity(rows * blocks);
        for xb in x.chunks_exact(QK8_0) {
            let (db, qb) = quantize_block(xb.try_into().expect("32 values"));
            d.push(fp16_to_f32(db));
            qs.push(qb);
        }
        Self {
            rows,
            blocks,
            d,
            qs,
        }
    }
}

/// Lanes of the per-block partial sums (one AVX2 register of i32 / f32).
const LANES: usize = 8;

/// Σ a·b over one block pair as `LANES` exact i32 partial sums; lane `j` sums elements
/// `2j, 2j + 1, 16 + 2j, 17 + 2j` (the lanes of AVX2's vpmaddwd on the two halves).
#[inline(always)]
fn block_dot_lanes(a: &[u8], b: &[i8; QK8_0]) -> [i32; LANES] {
    let mut s = [0i32; LANES];
    for (j, sj) in s.iter_mut().enumerate() {
        for i in [2 * j, 2 * j + 1, 16 + 2 * j, 17 + 2 * j] {
            *sj += (a[i] as i8 as i32) * (b[i] as i32);
        }
    }
    s
}

/// Dot products of weight rows `first..` (each `row_stride` bytes apart) with every activation
/// row; `out[(m - first) * rows + r]`. Like ggml's AVX2 vec_dot, each block's integer partial
/// sums are scaled into float lanes and the lanes are summed once per output. `rows_avx2`
/// computes the same operations in the same order (bit-identical results).
fn rows_generic(w: &[u8], row_stride: usize, first: usize, act: &Activations, out: &mut [f32]) {
    let nb = act.blocks;
    let rows = act.rows;
    for (i, dst) in out.chunks_exact_mut(rows).enumerate() {
        let start = (first + i) * row_stride;
        let wrow = &w[start..start + nb * BLOCK_BYTES];
        let mut acc = [[0.0f32; LANES]; MAX_ROWS];
        for (b, blk) in wrow.chunks_exact(BLOCK_BYTES).enumerate() {
            let dw = fp16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
            let qw = &blk[2..BLOCK_BYTES];
            for (r, a) in acc.iter_mut().enumerate().take(rows) {
                let at = r * nb + b;
                let sumi = block_dot_lanes(qw, &act.qs[at]);
                let scale = dw * act.d[at];
                for (l, s) in a.iter_mut().zip(sumi) {
                    *l += s as f32 * scale;
                }
            }
        }
        for (d, a) in dst.iter_mut().zip(&acc) {
            *d = a.iter().sum();
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn rows_avx2(w: &[u8], row_stride: usize, first: usize, act: &Activations, out: &mut [f32]) {
    use std::arch::x86_64::*;

    let nb = act.blocks;
    let rows = act.rows;
    for (i, dst) in out.chunks_exact_mut(rows).enumerate() {
        let start = (first + i) * row_stride;
        let wrow = &w[start..start + nb * BLOCK_BYTES];
        let mut acc = [_mm256_setzero_ps(); MAX_ROWS];
        for (b, blk) in wrow.chunks_exact(BLOCK_BYTES).enumerate() {
            let dw = fp16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
            let qw: &[u8; QK8_0] = blk[2..].try_into().expect("32 codes");
            // SAFETY: 16-byte unaligned loads inside the 32-byte array `qw`.
            let (wlo, whi) = unsafe {
                (
                    _mm_loadu_si128(qw.as_ptr() as *const __m128i),
                    _mm_loadu_si128(qw.as_ptr().add(16) as *const __m128i),
                )
            };
            let (wlo, whi) = (_mm256_cvtepi8_epi16(wlo), _mm256_cvtepi8_epi16(whi));
            for (r, a) in acc.iter_mut().enumerate().take(rows) {
                let at = r * nb + b;
                let qx = &act.qs[at];
                // SAFETY: as above, inside the 32-byte array `qx`.
                let (xlo, xhi) = unsafe {
                    (
                        _mm_loadu_si128(qx.as_ptr() as *const __m128i),
                        _mm_loadu_si128(qx.as_ptr().add(16) as *const __m128i),
                    )
                };
                let lo = _mm256_madd_epi16(wlo, _mm256_cvtepi8_epi16(xlo));
                let hi = _mm256_madd_epi16(whi, _mm256_cvtepi8_epi16(xhi));
                let sumi = _mm256_add_epi32(lo, hi);
                let scale = _mm256_set1_ps(dw * act.d[at]);
                *a = _mm256_add_ps(*a, _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), scale));
            }
        }
        for (d, a) in dst.iter_mut().zip(&acc) {
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` holds exactly 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *a) };
            *d = lanes.iter().sum();
        }
    }
}

fn rows(w: &[u8], row_stride: usize, first: usize, act: &Activations, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { rows_avx2(w, row_stride, first, act, out) };
        }
    }
    rows_generic(w, row_stride, first, act, out)
}

/// `out[n][m] = Σ_k w[m][k] · x[n][k]` for q8_0 weights `w` (`m` rows of `k / 32` blocks, row
/// `i` starting at byte `i * row_stride`) and float32 activations `x` (`n × k`, row-major),
/// `n = x.len() / k` between 1 and [`MAX_ROWS`]; `out` is `n × m` row-major. The weight rows
/// are split over up to `threads` threads.
pub fn matmul_q8_0(
    w: &[u8],
    row_stride: usize,
    m: usize,
    k: usize,
    x: &[f32],
    out: &mut [f32],
    threads: usize,
) -> Result<(), KernelError> {
    if k == 0 || !k.is_multiple_of(QK8_0) {
        return Err(KernelError::new(format!(
            "K = {k} is not a positive multiple of 32"
        )));
    }
    if !x.len().is_multiple_of(k) {
        return Err(KernelError::new(format!(
            "{} activation values are not rows of K = {k}",
            x.len()
        )));
    }
    let n = x.len() / k;
    if n == 0 || n > MAX_ROWS {
        return Err(KernelError::new(format!(
            "{n} activation rows (expected 1..={MAX_ROWS})"
        )));
    }
    let row_bytes = k / QK8_0 * BLOCK_BYTES;
    if row_stride < row_bytes {
        return Err(KernelError::new(format!(
            "row stride {row_stride} is shorter than a row ({row_bytes} bytes)"
        )));
    }
    let need = match m {
        0 => 0,
        _ => (m - 1)
            .checked_mul(row_stride)
            .and_then(|v| v.checked_add(row_bytes))
            .ok_or_else(|| KernelError::new("weight extent overflows"))?,
    };
    if w.len() < need {
        return Err(KernelError::new(format!(
            "weights hold {} bytes, {m} rows need {need}",
            w.len()
        )));
    }
    if out.len() != n * m {
        return Err(KernelError::new(format!(
            "output holds {} values, expected {n} × {m}",
            out.len()
        )));
    }
    if m == 0 {
        return Ok(());
    }
    let act = Activations::quantize(x, k);
    // [m][n] while computing, so each thread owns a contiguous slice
    let mut tmp = vec![0.0f32; m * n];
    let by_size = (m * row_bytes / MIN_BYTES_PER_THREAD).max(1);
    let threads = threads.clamp(1, by_size.min(m));
    if threads == 1 {
        rows(w, row_stride, 0, &act, &mut tmp);
    } else {
        let per = m.div_ceil(threads);
        std::thread::scope(|s| {
            for (i, chunk) in tmp.chunks_mut(per * n).enumerate() {
                let act = &act;
                s.spawn(move || rows(w, row_stride, i * per, act, chunk));
            }
        });
    }
    for (mi, vals) in tmp.chunks_exact(n).enumerate() {
        for (r, v) in vals.iter().enumerate() {
            out[r * m + mi] = *v;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random floats in [-1, 1).
    fn noise(seed: u64, len: usize) -> Vec<f32> {
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

    fn quantize(x: &[f32]) -> Vec<u8> {
        let mut out = vec![0u8; x.len() / QK8_0 * BLOCK_BYTES];
        quantize_row_q8_0(x, &mut out).unwrap();
        out
    }

    fn dequantize(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(BLOCK_BYTES)
            .flat_map(|blk| {
                let d = fp16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
                blk[2..].iter().map(move |&q| q as i8 as f32 * d)
            })
            .collect()
    }

    /// Naive reference: dequantize both sides and sum in f64.
    fn reference(w: &[u8], m: usize, k: usize, x: &[f32]) -> Vec<f32> {
        let row_bytes = k / QK8_0 * BLOCK_BYTES;
        let n = x.len() / k;
        let wf: Vec<Vec<f32>> = (0..m)
            .map(|i| dequantize(&w[i * row_bytes..(i + 1) * row_bytes]))
            .collect();
        let mut out = vec![0.0f32; n * m];
        for r in 0..n {
            let xq = dequantize(&quantize(&x[r * k..(r + 1) * k]));
            for (i, wr) in wf.iter().enumerate() {
                let s: f64 = wr.iter().zip(&xq).map(|(a, b)| *a as f64 * *b as f64).sum();
                out[r * m + i] = s as f32;
            }
        }
        out
    }

    #[test]
    fn quantize_matches_ref_rules() {
        let mut x = noise(1, 64);
        x[0] = 2.0; // amax of block 0: d = 2/127, code 127
        x[1] = -0.77; // code = roundf(x * (1 / d))
        for v in &mut x[32..] {
            *v = 0.0;
        }
        let b = quantize(&x);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), f32_to_fp16(2.0 / 127.0));
        assert_eq!(b[2] as i8, 127);
        assert_eq!(b[3] as i8, (x[1] * (1.0 / (2.0f32 / 127.0))).round() as i8);
        assert!(b[34..].iter().all(|&v| v == 0), "all-zero block");
    }

    #[test]
    fn matmul_matches_reference() {
        for &(m, k, n, threads) in &[
            (1, 32, 1, 1),
            (7, 64, 3, 2),
            (33, 256, 8, 4),
            (300, 1024, 1, 3),
            (129, 96, 5, 8),
        ] {
            let x = noise(2 + m as u64, n * k);
            let w = quantize(&noise(3 + k as u64, m * k));
            let mut out = vec![0.0f32; n * m];
            matmul_q8_0(&w, k / QK8_0 * BLOCK_BYTES, m, k, &x, &mut out, threads).unwrap();
            let want = reference(&w, m, k, &x);
            for (got, want) in out.iter().zip(&want) {
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "m={m} k={k} n={n}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn strided_rows_and_threads_agree() {
        let (m, k, n) = (2000, 128, 2);
        let row_bytes = k / QK8_0 * BLOCK_BYTES;
        let stride = row_bytes + 10;
        let dense = quantize(&noise(9, m * k));
        let mut w = vec![0xAAu8; (m - 1) * stride + row_bytes];
        for i in 0..m {
            w[i * stride..i * stride + row_bytes]
                .copy_from_slice(&dense[i * row_bytes..(i + 1) * row_bytes]);
        }
        let x = noise(10, n * k);
        let mut one = vec![0.0f32; n * m];
        let mut many = vec![0.0f32; n * m];
        matmul_q8_0(&dense, row_bytes, m, k, &x, &mut one, 1).unwrap();
        matmul_q8_0(&w, stride, m, k, &x, &mut many, 4).unwrap();
        assert_eq!(one, many);
    }

    #[test]
    fn dispatched_kernel_matches_portable_bitwise() {
        let (m, k, n) = (37, 320, 8);
        let w = quantize(&noise(11, m * k));
        let x = noise(12, n * k);
        let act = Activations::quantize(&x, k);
        let row_bytes = k / QK8_0 * BLOCK_BYTES;
        let mut fast = vec![0.0f32; m * n];
        let mut portable = vec![0.0f32; m * n];
        rows(&w, row_bytes, 0, &act, &mut fast);
        rows_generic(&w, row_bytes, 0, &act, &mut portable);
        assert_eq!(fast, portable);
    }

    #[test]
    fn rejects_bad_sizes() {
        let w = vec![0u8; 34 * 4];
        let x = vec![0.0f32; 64];
        let mut out = vec![0.0f32; 2];
        assert!(matmul_q8_0(&w, 68, 2, 64, &x, &mut out, 1).is_ok());
        assert!(matmul_q8_0(&w, 68, 3, 64, &x, &mut out, 1).is_err()); // weights short
        assert!(matmul_q8_0(&w, 60, 2, 64, &x, &mut out, 1).is_err()); // stride < row
        assert!(matmul_q8_0(&w, 68, 2, 48, &x, &mut out, 1).is_err()); // K % 32
        assert!(matmul_q8_0(&w, 68, 2, 64, &x[..40], &mut out, 1).is_err()); // partial row
        assert!(matmul_q8_0(&w, 68, 2, 64, &x, &mut out[..1], 1).is_err()); // out size
        let x9 = vec![0.0f32; 32 * 9];
        let mut out9 = vec![0.0f32; 9];
        assert!(matmul_q8_0(&w, 34, 1, 32, &x9, &mut out9, 1).is_err()); // N > 8
    }
}
