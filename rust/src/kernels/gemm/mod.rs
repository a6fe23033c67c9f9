//! Many-row kernels (and the decode layouts) that replace the row dots where they give the
//! same bits faster: float weights in tinyBLAS's order, q8_0-family tiles, one-row Q4_K with
//! AVX-512, f16 rows against widened activations.

pub mod f16_rows;
pub mod float;
#[cfg(target_arch = "x86_64")]
mod float_avx512;
pub mod float_tiles;
pub mod q4k_paired;
pub mod q8;
