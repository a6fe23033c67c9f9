//! ggml's block formats as every build of the kernels reads them.

pub mod half;
pub mod tables;
