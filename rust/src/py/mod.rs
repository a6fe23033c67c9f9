//! The pyo3 layer: converts arguments, borrows buffers, maps errors. No protocol logic lives
//! here; everything below `crate::py` is the pure-Rust core.

mod buffer;
mod exceptions;
mod functions;
mod graph;
mod hash;
mod kernels;
mod native_experts;
mod native_ops;
mod rdma;
mod tensor;

use pyo3::prelude::*;

use crate::{chunk, framing, rdma as core_rdma, tensor as core_tensor, types};

/// Sans-I/O codec and checks of the ggml RPC protocol (rpcnet's native core).
// gil_used: the buffer borrows rely on an attached interpreter keeping Python writers out.
#[pymodule(gil_used = true)]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("PROTO_V8", framing::PROTO_V8)?;
    m.add("PROTO_V7", framing::PROTO_V7)?;
    m.add("RPC_TENSOR_SIZE", core_tensor::RPC_TENSOR_SIZE)?;
    m.add("MAX_CHUNK", chunk::MAX_CHUNK)?;
    m.add("GGML_TYPE_COUNT", types::GGML_TYPE_COUNT)?;
    m.add("RDMA_CAPS_SIZE", core_rdma::CAPS_SIZE)?;
    m.add("RDMA_SYSFS_ROOT", core_rdma::SYSFS_ROOT)?;

    m.add("NativeError", py.get_type::<exceptions::NativeError>())?;
    m.add("FrameError", py.get_type::<exceptions::FrameError>())?;
    m.add("TensorError", py.get_type::<exceptions::TensorError>())?;
    m.add("GraphError", py.get_type::<exceptions::GraphError>())?;
    m.add("RdmaError", py.get_type::<rdma::RdmaError>())?;

    m.add_class::<tensor::PyRpcTensor>()?;
    m.add_class::<graph::PyGraph>()?;
    m.add_class::<hash::PyFnv1a64>()?;
    m.add_class::<rdma::PyRdmaGid>()?;
    m.add_class::<rdma::PyRdmaPort>()?;
    m.add_class::<rdma::PyRdmaEnv>()?;
    m.add_class::<rdma::PyRdmaSelection>()?;

    m.add_function(wrap_pyfunction!(functions::command_name, m)?)?;
    m.add_function(wrap_pyfunction!(functions::check_header, m)?)?;
    m.add_function(wrap_pyfunction!(functions::request_size, m)?)?;
    m.add_function(wrap_pyfunction!(functions::response_size, m)?)?;
    m.add_function(wrap_pyfunction!(functions::type_info, m)?)?;
    m.add_function(wrap_pyfunction!(functions::type_table, m)?)?;
    m.add_function(wrap_pyfunction!(functions::tensor_nbytes, m)?)?;
    m.add_function(wrap_pyfunction!(functions::nelements, m)?)?;
    m.add_function(wrap_pyfunction!(functions::check_tensor_in_buffer, m)?)?;
    m.add_function(wrap_pyfunction!(functions::check_region, m)?)?;
    m.add_function(wrap_pyfunction!(functions::check_memset, m)?)?;
    m.add_function(wrap_pyfunction!(functions::check_region_2d, m)?)?;
    m.add_function(wrap_pyfunction!(functions::chunk_plan, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::decode_tensor, m)?)?;
    m.add_function(wrap_pyfunction!(tensor::decode_tensors, m)?)?;
    m.add_function(wrap_pyfunction!(graph::decode_graph, m)?)?;
    m.add_function(wrap_pyfunction!(hash::fnv1a64, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::matmul_quant, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::matmul_quant_supports, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::matmul_quant_block, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::matmul_activation_block, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::set_portable_kernels, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::kernels_simd, m)?)?;
    m.add_function(wrap_pyfunction!(kernels::set_avx512_kernels, m)?)?;
    m.add_class::<native_ops::NativeStep>()?;
    m.add_function(wrap_pyfunction!(native_ops::run_steps, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::run_joint, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::same_weights, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::pool_rest, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::native_ops_portable, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::flash_attn_ext_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::rms_norm_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::rope_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::swiglu_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::set_rows_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::get_rows_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::copy_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::binary_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::soft_max_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_ops::mul_mat_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_experts::mul_mat_id_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_experts::argsort_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_experts::sum_rows_step, m)?)?;
    m.add_function(wrap_pyfunction!(native_experts::clamp_step, m)?)?;
    m.add_function(wrap_pyfunction!(rdma::rdma_scan, m)?)?;
    m.add_function(wrap_pyfunction!(rdma::rdma_env, m)?)?;
    m.add_function(wrap_pyfunction!(rdma::rdma_resolve, m)?)?;
    m.add_function(wrap_pyfunction!(rdma::rdma_target_gid, m)?)?;
    m.add_function(wrap_pyfunction!(rdma::rdma_format_gid, m)?)?;
    m.add_function(wrap_pyfunction!(rdma::rdma_parse_gid, m)?)?;
    m.add_function(wrap_pyfunction!(rdma::rdma_encode_caps, m)?)?;
    m.add_function(wrap_pyfunction!(rdma::rdma_decode_caps, m)?)?;
    Ok(())
}
