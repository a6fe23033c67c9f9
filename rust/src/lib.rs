//! rpcnet's native core: a sans-I/O codec and the validation rules of the ggml RPC protocol
//! (v8.0.0 and v7.0.0), with a thin pyo3 layer exposing it as `rpcnet._native`.
//!
//! Pure-Rust modules (no Python types):
//! * [`framing`] — command ids, fixed sizes, request header check
//! * [`types`] — ggml type table, `ggml_nbytes`, element counts
//! * [`tensor`] — the 296-byte `rpc_tensor` codec
//! * [`graph`] — GRAPH_COMPUTE payload decoding
//! * [`region`] — overflow-checked buffer / tensor bounds checks
//! * [`hash`] — FNV-1a 64
//! * [`kernels`] — the CPU compute kernels (matmul over every supported weight type, flash
//!   attention, row ops), with ggml's arithmetic bit for bit
//! * [`chunk`] — transfer chunking
//! * [`rdma`] — HELLO conn_caps codec and RoCE GID selection from sysfs
//! * [`errors`] — the error values above return

pub mod chunk;
pub mod errors;
pub mod framing;
pub mod graph;
pub mod hash;
pub mod kernels;
pub mod rdma;
pub mod region;
pub mod tensor;
pub mod types;

mod py;
