//! Python exception classes and the conversions from the core error values. Fields are set as
//! instance attributes so handlers can log `e.cmd`, `e.size`, `e.reason` without parsing text.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use crate::errors;

create_exception!(
    rpcnet._native,
    NativeError,
    PyException,
    "Base class of every error raised by rpcnet._native."
);
create_exception!(
    rpcnet._native,
    FrameError,
    NativeError,
    "Bad request header (attributes: cmd, size, reason)."
);
create_exception!(
    rpcnet._native,
    TensorError,
    NativeError,
    "Bad rpc_tensor, type, size or region (attribute: reason)."
);
create_exception!(
    rpcnet._native,
    GraphError,
    NativeError,
    "Malformed GRAPH_COMPUTE payload (attribute: reason)."
);

/// Instantiate `err` now and attach `attrs` to it.
fn with_attrs<'py>(
    py: Python<'py>,
    err: PyErr,
    attrs: impl FnOnce(&Bound<'py, PyAny>) -> PyResult<()>,
) -> PyErr {
    if let Err(e) = attrs(err.value(py).as_any()) {
        return e;
    }
    err
}

impl From<errors::FrameError> for PyErr {
    fn from(e: errors::FrameError) -> Self {
        Python::attach(|py| {
            with_attrs(py, FrameError::new_err(e.to_string()), |v| {
                v.setattr("cmd", e.cmd)?;
                v.setattr("size", e.size)?;
                v.setattr("reason", &e.reason)
            })
        })
    }
}

impl From<errors::TensorError> for PyErr {
    fn from(e: errors::TensorError) -> Self {
        Python::attach(|py| {
            with_attrs(py, TensorError::new_err(e.to_string()), |v| {
                v.setattr("reason", &e.reason)
            })
        })
    }
}

impl From<errors::GraphError> for PyErr {
    fn from(e: errors::GraphError) -> Self {
        Python::attach(|py| {
            with_attrs(py, GraphError::new_err(e.to_string()), |v| {
                v.setattr("reason", &e.reason)
            })
        })
    }
}
