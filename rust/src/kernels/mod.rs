//! CPU compute kernels working directly on ggml's quantized block layouts (no Python types),
//! in layers: each module imports only from the layers above it in this list.
//!
//! 1. The machine: [`cpu`] (features detected once, run-time switches), [`pool`] (the
//!    persistent worker threads every kernel call runs on), [`error`].
//! 2. Block formats: [`blocks`] (f16 conversions, codebooks, packed scales).
//! 3. Operands and activation formats: [`formats`] (vec_dot types, the weight type table),
//!    [`act`] (activations converted as ggml's x86 build does), [`operand`] (converted rows,
//!    strided tensors, the rows function signatures).
//! 4. Vector primitives: [`dot`] (one weight row · one activation row per type, portable,
//!    AVX2 and AVX-512 VNNI builds, behind one table of rows functions per build), [`f16vec`],
//!    [`expf8`], [`expf_libm`], [`mathf`].
//! 5. GEMM tiles for many activation rows: [`gemm`].
//! 6. Matmul dispatch: [`matmul`] (plan, thread split, whole MUL_MAT nodes).
//! 7. The other ops of a decode step: [`flash_attn`], [`rowops`], [`elementwise`] (maps such as
//!    SCALE, TANH and GELU), [`routing`] (a MoE router's).

pub mod act;
pub mod blocks;
pub mod cpu;
pub mod dot;
pub mod elementwise;
pub mod error;
pub mod expf8;
pub mod expf_libm;
pub mod f16vec;
pub mod flash_attn;
pub mod formats;
pub mod gemm;
pub mod mathf;
pub mod matmul;
pub mod operand;
pub mod pool;
pub mod routing;
pub mod rowops;
#[cfg(test)]
mod test_util;
