//! FNV-1a 64 for Python. Large inputs are hashed detached from the interpreter so other
//! Python threads (e.g. the event loop's I/O) keep running.

use pyo3::prelude::*;

use super::buffer::ByteView;
use crate::hash;

/// Below this many bytes detaching costs more than it frees.
const DETACH_THRESHOLD: usize = 64 * 1024;

fn hash_view(py: Python<'_>, state: u64, view: &ByteView) -> u64 {
    if view.len() < DETACH_THRESHOLD {
        hash::update(state, view.as_slice(py))
    } else {
        let shared = view.as_shared();
        py.detach(|| hash::update_shared(state, shared))
    }
}

/// FNV-1a 64 of the whole buffer.
#[pyfunction]
pub fn fnv1a64(py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<u64> {
    let view = ByteView::new(data)?;
    Ok(hash_view(py, hash::FNV_OFFSET_BASIS, &view))
}

/// Incremental FNV-1a 64 (same result as `fnv1a64` over the concatenated updates).
#[pyclass(module = "rpcnet._native", name = "Fnv1a64")]
pub struct PyFnv1a64 {
    state: u64,
}

#[pymethods]
impl PyFnv1a64 {
    #[new]
    fn new() -> Self {
        Self {
            state: hash::FNV_OFFSET_BASIS,
        }
    }

    fn update(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let view = ByteView::new(data)?;
        self.state = hash_view(py, self.state, &view);
        Ok(())
    }

    fn digest(&self) -> u64 {
        self.state
    }

    fn hexdigest(&self) -> String {
        hash::hex(self.state)
    }

    fn __repr__(&self) -> String {
        format!("Fnv1a64({})", hash::hex(self.state))
    }
}
