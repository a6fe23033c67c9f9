//! One weight row · one converted activation row per weight type, in the order ggml's x86
//! AVX2 `ggml_vec_dot_*` functions compute it, and the rows functions built on it.
//!
//! * [`row_dot`] — the trait each type implements; [`by_type`] — the implementations
//! * [`lanes`] — the portable build's emulated AVX2 lanes
//! * [`avx2`], [`avx512`] — the SIMD builds (same bits)
//! * [`kquant_tiles`], [`kquant_gemm`] — ggml's tiled K-quant order for many rows
//! * [`rows`] — weight rows × activation rows in cache tiles; [`table`] — one rows function
//!   per type and build, the build chosen per call from the detected CPU

#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
pub mod by_type;
#[cfg(target_arch = "x86_64")]
pub mod kquant_gemm;
pub mod kquant_tiles;
pub mod lanes;
pub mod row_dot;
pub mod rows;
pub mod table;
