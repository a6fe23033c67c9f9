//! `Graph` and `decode_graph`: the GRAPH_COMPUTE payload as Python objects.

use std::collections::HashMap;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use super::buffer::ByteView;
use super::functions::proto_of;
use super::tensor::PyRpcTensor;
use crate::graph;
use crate::region;
use crate::tensor::RpcTensor;

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
    parsed: graph::Graph,
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

    /// Check every tensor the nodes reach (ids, cycles, types, sizes; a tensor whose buffer
    /// handle is in `regions` (handle -> (base, size)) must lie inside it, empty ones only when
    /// `check_empty`) and return the nodes to run: (index into `tensors`, indices of its 10
    /// source slots or None). GraphError for ids and cycles, TensorError for a bad tensor.
    fn walk<'py>(
        &self,
        py: Python<'py>,
        regions: &Bound<'py, PyDict>,
        check_empty: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut known: HashMap<u64, Option<(u64, u64)>> = HashMap::new();
        let nodes = self.parsed.walk(|t: &RpcTensor| -> PyResult<()> {
            let nbytes = t.nbytes()?;
            if t.buffer == 0 {
                return Ok(());
            }
            let region = match known.get(&t.buffer) {
                Some(r) => *r,
                None => {
                    let r = match regions.get_item(t.buffer)? {
                        Some(v) => Some(v.extract::<(u64, u64)>()?),
                        None => None,
                    };
                    known.insert(t.buffer, r);
                    r
                }
            };
            if let Some((base, size)) = region {
                if check_empty || t.nelements()? > 0 {
                    region::check_tensor_in_buffer(t.data, nbytes, base, size)?;
                }
            }
            Ok(())
        })?;
        let out = PyList::empty(py);
        for (root, srcs) in nodes {
            out.append((root, PyTuple::new(py, srcs)?))?;
        }
        Ok(out)
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
    let nodes = PyList::new(py, &parsed.nodes)?.unbind();
    let tensors = PyList::new(py, parsed.tensors.iter().cloned().map(PyRpcTensor::from))?.unbind();
    Ok(PyGraph {
        device: parsed.device,
        uid: parsed.uid,
        nodes,
        tensors,
        parsed,
    })
}
