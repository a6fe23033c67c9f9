//! AVX2+FMA+F16C builds of the row dots of every weight type: the intrinsics
//! of ggml's x86 vec_dot, giving the same lanes, FMAs and final sums as the portable code in
//! [`super::by_type`] (the tests compare both bit for bit).
//!
//! Every function here is `unsafe`: the caller guarantees the CPU has AVX2, FMA and F16C, and
//! the slices hold `k` values' worth of blocks (checked with asserts, so bad sizes panic rather
//! than read out of bounds).

pub(crate) mod common;
pub mod float;
pub mod kquant;
pub mod quant;

pub(crate) use float::{bf16, f16, f16_wide, f16_wide_rows8, f16_wide_x2, f16x2, f16x4, f32};
#[cfg(test)]
pub(crate) use kquant::q6_k_avx2;
pub(crate) use kquant::{iq4_xs, q2_k, q3_k, q4_k, q4_k_x4, q5_k, q6_k, q6_k_x4};
pub(crate) use quant::{iq4_nl, iq4_nl_gemm, mxfp4, q4_0, q4_1, q5_0, q5_1, q8_0, q8_0_x4};
