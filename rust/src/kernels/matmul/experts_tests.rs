//! MUL_MAT_ID in one call against one [`matmul_quant`] per expert over the rows routed to it.

use super::*;
use crate::kernels::matmul::plan::{matmul_quant, Order};
use crate::kernels::test_util::{noise, weights};

/// ggml's order without llamafile.
const GGML: Order = Order::Ggml { llamafile: false };

const TYPES: [u32; 16] = [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30, 39];

struct Case {
    type_id: u32,
    m: usize,
    k: usize,
    n_exp: usize,
    slots: usize,
    per_token: usize,
    tokens: usize,
}

impl Case {
    fn row_bytes(&self) -> usize {
        let info = type_info(self.type_id).unwrap();
        self.k / info.block * info.block_bytes
    }

    /// Ids where expert 0 gets every token (the tiled kernels from 8 rows), the others spread.
    fn ids(&self, seed: u64) -> Vec<i32> {
        let r = noise(seed, self.tokens * self.slots);
        (0..self.tokens * self.slots)
            .map(|i| {
                if i % self.slots == 0 {
                    0
                } else {
                    1 + ((r[i] + 1.0) * 0.5 * (self.n_exp - 1) as f32) as i32
                        % (self.n_exp as i32 - 1)
                }
            })
            .collect()
    }

    fn step(&self, w: &[u8], x: &[f32], ids: &[i32], out: &mut [f32]) -> MulMatId {
        let info = type_info(self.type_id).unwrap();
        let (row, k, m) = (self.row_bytes(), self.k, self.m);
        MulMatId {
            type_id: self.type_id,
            w: Operand {
                ptr: w.as_ptr(),
                ne: [k / info.block, m, self.n_exp, 1],
                nb: [info.block_bytes, row, row * m, row * m * self.n_exp],
            },
            x: Operand {
                ptr: x.as_ptr() as *const u8,
                ne: [k, self.per_token, self.tokens, 1],
                nb: [4, 4 * k, 4 * k * self.per_token, 4 * k * x.len()],
            },
            ids: Operand {
                ptr: ids.as_ptr() as *const u8,
                ne: [self.slots, self.tokens, 1, 1],
                nb: [4, 4 * self.slots, 4 * ids.len(), 4 * ids.len()],
            },
            out: out.as_mut_ptr() as *mut u8,
            out_nb: [4, 4 * m, 4 * m * self.slots, 4 * out.len()],
        }
    }

    /// One matmul per expert over the rows routed to it, scattered by hand.
    fn per_expert(&self, w: &[u8], x: &[f32], ids: &[i32]) -> Vec<f32> {
        let (k, m, row) = (self.k, self.m, self.row_bytes());
        let mut out = vec![0.0f32; self.tokens * self.slots * m];
        for e in 0..self.n_exp {
            let at: Vec<usize> = (0..ids.len()).filter(|&i| ids[i] == e as i32).collect();
            if at.is_empty() {
                continue;
            }
            let mut xs = Vec::new();
            for &i in &at {
                let (t, s) = (i / self.slots, i % self.slots);
                let r = t * self.per_token + s % self.per_token;
                xs.extend_from_slice(&x[r * k..(r + 1) * k]);
            }
            let mut res = vec![0.0f32; at.len() * m];
            let we = &w[e * m * row..(e + 1) * m * row];
            matmul_quant(self.type_id, we, row, m, k, &xs, &mut res, 1, GGML).unwrap();
            for (j, &i) in at.iter().enumerate() {
                out[i * m..(i + 1) * m].copy_from_slice(&res[j * m..(j + 1) * m]);
            }
        }
        out
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn one_call_gives_each_experts_own_product() {
    for &t in &TYPES {
        for (slots, per_token, tokens) in [(2, 1, 1), (3, 3, 1), (2, 1, 11), (3, 3, 9)] {
            let case = Case {
                type_id: t,
                m: 72,
                k: 256,
                n_exp: 5,
                slots,
                per_token,
                tokens,
            };
            let w = weights(t, case.m * case.n_exp, case.k, 7 + t as u64);
            let x = noise(11 + t as u64, tokens * per_token * case.k);
            let ids = case.ids(5 + tokens as u64);
            let want = case.per_expert(&w, &x, &ids);
            for threads in [1, 2, 3] {
                let mut got = vec![f32::NAN; want.len()];
                let step = case.step(&w, &x, &ids, &mut got);
                step.check([case.m, slots, tokens, 1]).unwrap();
                assert!(unsafe { step.run(threads) });
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "type {t}, {tokens} tokens, {slots} slots / {per_token} rows, {threads} threads"
                );
            }
        }
    }
}

/// Three q8_0 experts of 32 × 64, two tokens of one row each routed to two slots: the case,
/// its weights and activations.
fn small_q8_0_case() -> (Case, Vec<u8>, Vec<f32>) {
    let case = Case {
        type_id: 8,
        m: 32,
        k: 64,
        n_exp: 3,
        slots: 2,
        per_token: 1,
        tokens: 2,
    };
    let w = weights(8, case.m * case.n_exp, case.k, 1);
    let x = noise(2, 2 * case.k);
    (case, w, x)
}

#[test]
fn an_id_out_of_range_writes_nothing() {
    let (case, w, x) = small_q8_0_case();
    let mut out = vec![1.5f32; 2 * 2 * case.m];
    for bad in [3, -1, i32::MAX] {
        let ids = [0, 1, 2, bad];
        let step = case.step(&w, &x, &ids, &mut out);
        assert!(!unsafe { step.run(2) });
        assert!(out.iter().all(|&v| v == 1.5));
    }
}

#[test]
fn check_rejects_mismatched_shapes() {
    let (case, w, x) = small_q8_0_case();
    let ids = [0, 1, 2, 0];
    let mut out = vec![0.0f32; 2 * 2 * case.m];
    let step = case.step(&w, &x, &ids, &mut out);
    assert!(step.check([32, 2, 2, 1]).is_ok());
    assert!(step.check([32, 2, 3, 1]).is_err());
    let mut odd = step;
    odd.x.ne[1] = 3; // 2 slots do not take 3 rows per token
    assert!(odd.check([32, 2, 2, 1]).is_err());
    let mut short_k = step;
    short_k.x.ne[0] = 32;
    assert!(short_k.check([32, 2, 2, 1]).is_err());
    let mut unknown = step;
    unknown.type_id = 99;
    assert!(unknown.check([32, 2, 2, 1]).is_err());
}

/// Activation rows and output rows apart (views of wider tensors) give the dense call's bits.
#[test]
fn strided_activations_and_output_keep_the_bits() {
    let case = Case {
        type_id: 12,
        m: 40,
        k: 256,
        n_exp: 4,
        slots: 2,
        per_token: 2,
        tokens: 9,
    };
    let (k, m) = (case.k, case.m);
    let w = weights(12, m * case.n_exp, k, 3);
    let x = noise(4, case.tokens * case.per_token * k);
    let ids = case.ids(6);
    let want = case.per_expert(&w, &x, &ids);
    // every activation row 8 floats apart from the next, every output row 3 floats
    let (xs, os) = (k + 8, m + 3);
    let mut wide_x = vec![f32::NAN; case.tokens * case.per_token * xs];
    for (r, row) in x.chunks_exact(k).enumerate() {
        wide_x[r * xs..r * xs + k].copy_from_slice(row);
    }
    let mut wide_out = vec![f32::NAN; case.tokens * case.slots * os];
    let mut step = case.step(&w, &wide_x, &ids, &mut wide_out);
    step.x.nb = [4, 4 * xs, 4 * xs * case.per_token, 4 * wide_x.len()];
    step.out_nb = [4, 4 * os, 4 * os * case.slots, 4 * wide_out.len()];
    step.check([m, case.slots, case.tokens, 1]).unwrap();
    assert!(unsafe { step.run(2) });
    let got: Vec<f32> = wide_out
        .chunks_exact(os)
        .flat_map(|row| row[..m].to_vec())
        .collect();
    assert_eq!(bits(&got), bits(&want));
    assert!(wide_out
        .chunks_exact(os)
        .all(|row| row[m..].iter().all(|v| v.is_nan())));
}
