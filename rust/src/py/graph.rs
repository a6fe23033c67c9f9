//! `Graph` and `decode_graph`: the GRAPH_COMPUTE payload as Python objects.

use pyo3::prelude::*;
use pyo3::types::PyList;

use super::buffer::ByteView;
use super::functions::proto_of;
use super::tensor::PyRpcTensor;
use crate::graph;

/// A decoded GRAPH_COMPUTE payload. The lists are built once, so indexing them is cheap.
#[pyclass(module = "rpcnet._native", name = "Graph", frozen)]
pub struct PyGraph {
    #[pyo3(get)]
    device: u32,
    #[pyo3(get)]
    uid: u64,
    #[pyo3(get)]
    nodes: Py<PyList>,
    #[pyo3(get)]
    tensors: Py<PyList>,
}

#[pymethods]
impl PyGraph {
    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "Graph(device={}, uid={}, nodes={}, tensors={})",
            self.device,
            self.uid,
            self.nodes.bind(py).len(),
            self.tensors.bind(py).len()
        )
    }
}

/// Decode a GRAPH_COMPUTE payload of dialect `proto` (8: spec §8.1, 7: §14).
#[pyfunction]
pub fn decode_graph(py: Python<'_>, proto: u64, payload: &Bound<'_, PyAny>) -> PyResult<PyGraph> {
    let proto = proto_of(proto)?;
    let view = ByteView::new(payload)?;
    // Parsing needs no Python objects: detach when the bytes cannot change under us (`bytes`);
    // other buffers are parsed attached, which keeps Python writers out.
    let parsed = match view.as_immutable_slice() {
        Some(bytes) => py.detach(|| graph::decode_graph(proto, bytes)),
        None => graph::decode_graph(proto, view.as_slice(py)),
    }?;
    drop(view);
    let nodes = PyList::new(py, parsed.nodes)?.unbind();
    let tensors = PyList::new(py, parsed.tensors.into_iter().map(PyRpcTensor::from))?.unbind();
    Ok(PyGraph {
        device: parsed.device,
        uid: parsed.uid,
        nodes,
        tensors,
    })
}
