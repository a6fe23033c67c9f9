//! MUL_MAT over broadcast batches in one call: ggml's attention products (K·Q and V·softmax,
//! one matrix per head) are many small matmuls, where converting, dispatching and joining
//! threads once per head costs more than the arithmetic. Every batch's activations are converted
//! once, then (batch, tile of weight rows) items are shared out over the threads together.
//! Each output is still one [`super::matmul`] row-dot, so results equal per-batch calls bit for
//! bit whatever the thread count.

use super::gemm_float;
use super::matmul::{check, rows_for, type_info, Converted, TILE_ROWS};
use super::KernelError;

/// Below this many multiply-adds per thread, another thread costs more than it saves.
const MIN_MACS_PER_THREAD: usize = 1 << 20;

#[allow(clippy::too_many_arguments)]
/// `out[b][n][m] = Σ_k w_b[m][k] · x[b][n][k]` for `offsets.len()` batches, where batch `b`'s
/// weights are the `m` rows (`row_stride` bytes apart) starting at byte `offsets[b]` of `w`;
/// `x` and `out` hold the batches back to back. `llamafile` as in [`super::matmul`].
pub fn matmul_batched(
    type_id: u32,
    w: &[u8],
    offsets: &[usize],
    row_stride: usize,
    m: usize,
    k: usize,
    x: &[f32],
    out: &mut [f32],
    threads: usize,
    llamafile: bool,
) -> Result<(), KernelError> {
    let info = type_info(type_id)
        .ok_or_else(|| KernelError::new(format!("weight type {type_id} is not supported")))?;
    let batches = offsets.len();
    if batches == 0 || k == 0 || !x.len().is_multiple_of(batches * k) {
        return Err(KernelError::new(format!(
            "{} activation values are not {batches} batches of rows of K = {k}",
            x.len()
        )));
    }
    let n = x.len() / batches / k;
    if out.len() != batches * n * m {
        return Err(KernelError::new(format!(
            "output holds {} values, expected {batches} × {n} × {m}",
            out.len()
        )));
    }
    for &off in offsets {
        let rest = w.get(off..).ok_or_else(|| {
            KernelError::new(format!(
                "batch offset {off} is past the {} weight bytes",
                w.len()
            ))
        })?;
        check(info, rest.len(), row_stride, m, k, n * k, n * m)?;
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (f, gemm) = rows_for(type_id, m, n, llamafile);
    let acts: Vec<Converted> = x
        .chunks_exact(n * k)
        .map(|xb| {
            let act = Converted::new(info.act, xb, k);
            if gemm && gemm_float::serves(type_id) {
                gemm_float::widen_activations(&act, info.act, k)
            } else {
                act
            }
        })
        .collect();
    // [b][m][n] results; items are (batch, first row, their slice of the results)
    let mut tmp = vec![0.0f32; batches * m * n];
    let macs = batches * m * n * k;
    let threads = threads.clamp(1, (macs / MIN_MACS_PER_THREAD).max(1));
    let per = m
        .div_ceil(threads.div_ceil(batches))
        .next_multiple_of(TILE_ROWS);
    let mut items: Vec<(usize, usize, &mut [f32])> = Vec::new();
    for (b, tb) in tmp.chunks_exact_mut(m * n).enumerate() {
        for (i, chunk) in tb.chunks_mut(per * n).enumerate() {
            items.push((b, i * per, chunk));
        }
    }
    let run = |(b, first, chunk): (usize, usize, &mut [f32])| {
        f(
            &w[offsets[b]..],
            row_stride,
            first,
            k,
            &acts[b],
            chunk,
            gemm,
        );
    };
    let threads = threads.min(items.len());
    if threads <= 1 {
        items.into_iter().for_each(run);
    } else {
        // round-robin shares: each output is computed alike on any thread
        let mut shares: Vec<Vec<(usize, usize, &mut [f32])>> =
            (0..threads).map(|_| Vec::new()).collect();
        for (i, item) in items.into_iter().enumerate() {
            shares[i % threads].push(item);
        }
        let run = &run;
        std::thread::scope(|s| {
            for share in shares {
                s.spawn(move || share.into_iter().for_each(run));
            }
        });
    }
    for (tb, ob) in tmp.chunks_exact(m * n).zip(out.chunks_exact_mut(n * m)) {
        for (mi, vals) in tb.chunks_exact(n).enumerate() {
            for (r, v) in vals.iter().enumerate() {
                ob[r * m + mi] = *v;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::matmul_quant;
    use crate::kernels::test_util::noise;

    /// Batches in one call equal one call per batch, bit for bit, for float and q8_0 weights,
    /// shared (broadcast) weight offsets included.
    #[test]
    fn batches_equal_separate_calls() {
        for &(t, elem_bytes) in &[(1u32, 2usize), (0, 4)] {
            let (m, k, n) = (36, 40, 5);
            let row = k * elem_bytes;
            let w: Vec<u8> = match t {
                1 => noise(1, 3 * m * k)
                    .iter()
                    .flat_map(|v| crate::kernels::f32_to_fp16(*v).to_le_bytes())
                    .collect(),
                _ => noise(1, 3 * m * k)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
            };
            let offsets = [0, m * row, m * row, 2 * m * row]; // GQA: two batches share weights
            let x = noise(2, offsets.len() * n * k);
            for threads in [1, 3] {
                for llamafile in [false, true] {
                    let mut got = vec![0.0f32; offsets.len() * n * m];
                    matmul_batched(t, &w, &offsets, row, m, k, &x, &mut got, threads, llamafile)
                        .unwrap();
                    for (b, &off) in offsets.iter().enumerate() {
                        let mut want = vec![0.0f32; n * m];
                        let xb = &x[b * n * k..(b + 1) * n * k];
                        matmul_quant(t, &w[off..], row, m, k, xb, &mut want, 1, llamafile).unwrap();
                        let same = got[b * n * m..(b + 1) * n * m]
                            .iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "type {t} batch {b} threads {threads} {llamafile}");
                    }
                }
            }
        }
    }

    #[test]
    fn rejects_bad_offsets_and_sizes() {
        let w = vec![0u8; 2 * 40 * 2];
        let x = vec![0.0f32; 2 * 40];
        let mut out = vec![0.0f32; 4];
        assert!(matmul_batched(1, &w, &[0, 0], 80, 2, 40, &x, &mut out, 1, true).is_ok());
        assert!(matmul_batched(1, &w, &[0, 2], 80, 2, 40, &x, &mut out, 1, true).is_err());
        assert!(matmul_batched(1, &w, &[0, 999], 80, 2, 40, &x, &mut out, 1, true).is_err());
        assert!(matmul_batched(1, &w, &[], 80, 2, 40, &x, &mut out, 1, true).is_err());
        assert!(matmul_batched(1, &w, &[0, 0], 80, 2, 40, &x, &mut out[..3], 1, true).is_err());
    }
}
