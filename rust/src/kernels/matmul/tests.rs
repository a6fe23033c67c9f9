//! The matmul through its public entry points: every plan it chooses gives the bits of the
//! row dots (or of ggml's order for that row count), whatever the threads and strides.

use super::plan::{matmul_quant, Order};
use crate::kernels::blocks::half::fp16_to_f32;
use crate::kernels::dot::by_type::F16;
use crate::kernels::dot::row_dot::RowDot;
use crate::kernels::formats::{type_info, ActFormat};
use crate::kernels::gemm::f16_rows;
use crate::kernels::operand::Converted;
use crate::kernels::test_util::{float_cases, noise, weights};

/// ggml's order with llamafile's tinyBLAS, as a client's MUL_MAT runs.
const LLAMAFILE: Order = Order::Ggml { llamafile: true };
/// ggml's order without llamafile.
const GGML: Order = Order::Ggml { llamafile: false };

const TYPES: [u32; 16] = [0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30, 39];

#[test]
fn threads_and_strides_do_not_change_results() {
    for &t in &TYPES {
        let (m, k, n) = (70, 256, 2);
        let info = type_info(t).unwrap();
        let row = k / info.block * info.block_bytes;
        let dense = weights(t, m, k, 11);
        let stride = row + 6;
        let mut w = vec![0x55u8; (m - 1) * stride + row];
        for i in 0..m {
            w[i * stride..i * stride + row].copy_from_slice(&dense[i * row..(i + 1) * row]);
        }
        let x = noise(13, n * k);
        let mut one = vec![0.0f32; n * m];
        let mut many = vec![0.0f32; n * m];
        matmul_quant(t, &dense, row, m, k, &x, &mut one, 1, LLAMAFILE).unwrap();
        matmul_quant(t, &w, stride, m, k, &x, &mut many, 3, LLAMAFILE).unwrap();
        assert_eq!(one, many, "type {t}");
    }
}

#[test]
fn q8_0_close_to_f64() {
    let (m, k) = (5, 96);
    let w = weights(8, m, k, 3);
    let x = noise(4, k);
    let mut out = vec![0.0f32; m];
    matmul_quant(8, &w, 34 * 3, m, k, &x, &mut out, 1, LLAMAFILE).unwrap();
    let act = Converted::new(ActFormat::Q8_0, &x, k);
    for i in 0..m {
        let mut s = 0.0f64;
        for b in 0..3 {
            let wb = &w[i * 102 + 34 * b..];
            let yb = &act.data[34 * b..];
            let dw = fp16_to_f32(u16::from_le_bytes([wb[0], wb[1]])) as f64;
            let dy = fp16_to_f32(u16::from_le_bytes([yb[0], yb[1]])) as f64;
            for j in 0..32 {
                s += dw * dy * (wb[2 + j] as i8 as f64) * (yb[2 + j] as i8 as f64);
            }
        }
        assert!(
            (out[i] as f64 - s).abs() <= 1e-5 * s.abs().max(1.0),
            "{} {s}",
            out[i]
        );
    }
}

#[test]
fn rejects_bad_sizes() {
    let w = vec![0u8; 34 * 4];
    let x = vec![0.0f32; 64];
    let mut out = vec![0.0f32; 2];
    assert!(matmul_quant(8, &w, 68, 2, 64, &x, &mut out, 1, LLAMAFILE).is_ok());
    assert!(matmul_quant(8, &w, 68, 3, 64, &x, &mut out, 1, LLAMAFILE).is_err());
    assert!(matmul_quant(8, &w, 60, 2, 64, &x, &mut out, 1, LLAMAFILE).is_err());
    assert!(matmul_quant(8, &w, 68, 2, 48, &x, &mut out, 1, LLAMAFILE).is_err());
    assert!(matmul_quant(12, &w, 68, 2, 64, &x, &mut out, 1, LLAMAFILE).is_err());
    assert!(matmul_quant(99, &w, 68, 2, 64, &x, &mut out, 1, LLAMAFILE).is_err());
    assert!(matmul_quant(8, &w, 68, 2, 64, &x, &mut out[..1], 1, LLAMAFILE).is_err());
}

/// Widened rows give the f16 row dot's bits (odd K: the tail added one by one), for one and
/// several activation rows, through the matmul that chooses them.
#[test]
fn widened_rows_keep_the_row_dots_bits() {
    if !f16_rows::serves() {
        return;
    }
    // eights of rows side by side where K is whole steps of 32 (attention's K = head size),
    // the rest one by one
    let shapes = [
        (1, 1, 13),
        (31, 1, 13),
        (32, 2, 13),
        (87, 3, 13),
        (1000, 1, 13),
    ];
    for (k, n, m) in shapes
        .into_iter()
        .chain([(4096, 5, 13), (64, 4, 45), (128, 3, 24)])
        // split over both threads in chunks, with a ragged end
        .chain([(1024, 1, 300), (1024, 2, 300), (1000, 2, 301)])
    {
        let w = weights(1, m, k, k as u64);
        let x: Vec<f32> = noise(7 + k as u64, n * k).iter().map(|v| v * 4.0).collect();
        let act = Converted::new(ActFormat::F16, &x, k);
        let mut got = vec![0.0f32; n * m];
        matmul_quant(1, &w, 2 * k, m, k, &x, &mut got, 2, GGML).unwrap();
        for i in 0..m {
            for r in 0..n {
                // SAFETY: serves() checked AVX2, FMA and F16C.
                let want = unsafe { F16::dot_simd(&w[i * 2 * k..(i + 1) * 2 * k], act.row(r), k) };
                assert_eq!(
                    got[r * m + i].to_bits(),
                    want.to_bits(),
                    "k={k} n={n} row {i}"
                );
            }
        }
    }
}

/// Float weights at N >= 2 and M % 4 == 0 take tinyBLAS's order: every output the one-pair
/// tinyBLAS-order dot (the tiles themselves are compared in `gemm::float`).
#[test]
fn float_weights_follow_tinyblas_through_matmul_quant() {
    // (M % 4 != 0 takes the rows of vec_dot instead)
    let tiled = float_cases().filter(|(_, (m, _, _), ..)| m % 4 == 0);
    for (t, (m, k, n), w, x, _, want) in tiled {
        let row = k * type_info(t).unwrap().act.block_bytes();
        let mut got = vec![0.0f32; n * m];
        matmul_quant(t, &w, row, m, k, &x, &mut got, 3, LLAMAFILE).unwrap();
        for (o, (got, want)) in got.iter().zip(&want).enumerate() {
            let (r, i) = (o / m, o % m);
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "type {t} m {m} k {k} n {n} at {r},{i}"
            );
        }
    }
}
