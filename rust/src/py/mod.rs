//! The pyo3 layer: converts arguments, borrows buffers, maps errors. No protocol logic lives
//! here; everything below `crate::py` is the pure-Rust core.

mod buffer;
mod exceptions;
mod functions;
mod getters;
mod graph;
mod hash;
mod kernels;
mod native_experts;
mod native_maps;
mod native_ops;
mod rdma;
mod tensor;

use pyo3::prelude::*;

use crate::{chunk, framing, rdma as core_rdma, tensor as core_tensor, types};

/// `m.add_class` of every listed class.
macro_rules! add_classes {
    ($m:expr, $($class:path),* $(,)?) => {
        $($m.add_class::<$class>()?;)*
    };
}

/// `m.add_function` of every listed function of a module.
macro_rules! add_functions {
    ($m:expr, $module:ident::{$($f:ident),* $(,)?}) => {
        $($m.add_function(wrap_pyfunction!($module::$f, $m)?)?;)*
    };
}

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

    add_classes!(
        m,
        tensor::PyRpcTensor,
        graph::PyGraph,
        hash::PyFnv1a64,
        native_ops::NativeStep
    );
    add_classes!(
        m,
        rdma::PyRdmaGid,
        rdma::PyRdmaPort,
        rdma::PyRdmaEnv,
        rdma::PyRdmaSelection
    );

    add_functions!(m, functions::{
        command_name, check_header, request_size, response_size, type_info, type_table,
        tensor_nbytes, nelements, check_tensor_in_buffer, check_region, check_memset,
        check_region_2d, chunk_plan,
    });
    add_functions!(m, tensor::{decode_tensor, decode_tensors});
    add_functions!(m, graph::{decode_graph});
    add_functions!(m, hash::{fnv1a64});
    add_functions!(m, kernels::{
        matmul_quant, matmul_quant_supports, matmul_quant_block, matmul_activation_block,
        set_portable_kernels, kernels_simd, set_avx512_kernels,
    });
    add_functions!(m, native_ops::{
        run_steps, run_joint, same_weights, pool_rest, native_ops_portable, flash_attn_ext_step,
        rms_norm_step, rope_step, swiglu_step, set_rows_step, get_rows_step, copy_step,
        binary_step, soft_max_step, mul_mat_step,
    });
    add_functions!(m, native_maps::{scale_step, tanh_step, gelu_step, geglu_step});
    add_functions!(m, native_experts::{mul_mat_id_step, argsort_step, sum_rows_step, clamp_step});
    add_functions!(m, rdma::{
        rdma_scan, rdma_env, rdma_resolve, rdma_target_gid, rdma_format_gid, rdma_parse_gid,
        rdma_encode_caps, rdma_decode_caps,
    });
    Ok(())
}
