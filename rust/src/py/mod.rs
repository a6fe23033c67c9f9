//! The pyo3 layer: converts arguments, borrows buffers, maps errors. No protocol logic lives
//! here; everything below `crate::py` is the pure-Rust core.

mod buffer;
mod exceptions;
mod functions;
mod graph;
mod hash;
mod tensor;

use pyo3::prelude::*;

use crate::{chunk, framing, tensor as core_tensor, types};

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

    m.add("NativeError", py.get_type::<exceptions::NativeError>())?;
    m.add("FrameError", py.get_type::<exceptions::FrameError>())?;
    m.add("TensorError", py.get_type::<exceptions::TensorError>())?;
    m.add("GraphError", py.get_type::<exceptions::GraphError>())?;

    m.add_class::<tensor::PyRpcTensor>()?;
    m.add_class::<graph::PyGraph>()?;
    m.add_class::<hash::PyFnv1a64>()?;

    m.add_function(wrap_pyfunction!(functions::command_name, m)?)?;
    m.add_function(wrap_pyfunction!(functions::check_header, m)?)?;
    m.add_function(wrap_pyfunction!(functions::request_size, m)?)?;
    m.add_function(wrap_pyfunction!(functions::response_size, m)?)?;
    m.add_function(wrap_pyfunction!(functions::type_info, m)?)?;
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
    Ok(())
}
