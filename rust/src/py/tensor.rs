//! `RpcTensor`: an immutable Python view of one 296-byte `rpc_tensor`, plus the decoders.

use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::buffer::ByteView;
use super::getters::pymethods_with_fields;
use crate::errors::TensorError;
use crate::tensor::{RpcTensor, GGML_MAX_NAME, GGML_MAX_OP_PARAMS};
use crate::types;

#[pyclass(module = "rpcnet._native", name = "RpcTensor", frozen, eq, hash)]
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PyRpcTensor {
    pub inner: RpcTensor,
}

impl From<RpcTensor> for PyRpcTensor {
    fn from(inner: RpcTensor) -> Self {
        Self { inner }
    }
}

fn to_u32_strides(nb: [u64; 4]) -> Result<[u32; 4], TensorError> {
    let mut out = [0u32; 4];
    for (o, v) in out.iter_mut().zip(nb) {
        *o = u32::try_from(v).map_err(|_| {
            TensorError::new(format!(
                "contiguous stride {v} does not fit the u32 wire field"
            ))
        })?;
    }
    Ok(out)
}

/// Copy `src` into the front of `dst`, refusing inputs longer than the field.
fn pad_into<T: Copy>(dst: &mut [T], src: &[T], field: &str) -> PyResult<()> {
    if src.len() > dst.len() {
        return Err(PyValueError::new_err(format!(
            "{field} has {} entries, at most {} allowed",
            src.len(),
            dst.len()
        )));
    }
    dst[..src.len()].copy_from_slice(src);
    Ok(())
}

pymethods_with_fields!(
    PyRpcTensor,
    [
        id: u64,
        buffer: u64,
        op: u32,
        flags: i32,
        view_src: u64,
        view_offs: u64,
        data: u64,
        use_count: i32,
    ] {
    #[new]
    #[pyo3(signature = (
        *, id=0, r#type=0, buffer=0, ne=[1, 1, 1, 1], nb=None, op=0, op_params=None, flags=0,
        src=Vec::new(), view_src=0, view_offs=0, data=0, name="", use_count=0
    ))]
    #[allow(clippy::too_many_arguments)] // one keyword per wire field
    fn new(
        py: Python<'_>,
        id: u64,
        r#type: u32,
        buffer: u64,
        ne: [u32; 4],
        nb: Option<[u32; 4]>,
        op: u32,
        op_params: Option<&Bound<'_, PyAny>>,
        flags: i32,
        src: Vec<u64>,
        view_src: u64,
        view_offs: u64,
        data: u64,
        name: &str,
        use_count: i32,
    ) -> PyResult<Self> {
        let nb = match nb {
            Some(nb) => nb,
            None => to_u32_strides(types::contiguous_strides(
                u64::from(r#type),
                ne.map(u64::from),
            )?)?,
        };
        let mut t = RpcTensor {
            id,
            type_id: r#type,
            buffer,
            ne,
            nb,
            op,
            flags,
            view_src,
            view_offs,
            data,
            use_count,
            ..RpcTensor::default()
        };
        if let Some(obj) = op_params {
            let view = ByteView::new(obj)?;
            pad_into(&mut t.op_params, view.as_slice(py), "op_params")?;
        }
        pad_into(&mut t.src, &src, "src")?;
        // ggml names are NUL-terminated: at most 63 bytes and no embedded NUL.
        if name.len() >= GGML_MAX_NAME || name.contains('\0') {
            return Err(PyValueError::new_err(format!(
                "name must be at most {} UTF-8 bytes without NUL",
                GGML_MAX_NAME - 1
            )));
        }
        t.name[..name.len()].copy_from_slice(name.as_bytes());
        Ok(t.into())
    }

    #[getter(r#type)]
    fn type_id(&self) -> u32 {
        self.inner.type_id
    }

    #[getter]
    fn ne<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.ne)
    }

    #[getter]
    fn nb<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.nb)
    }

    #[getter]
    fn op_params<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.op_params)
    }

    #[getter]
    fn src<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.inner.src)
    }

    #[getter]
    fn name(&self) -> String {
        String::from_utf8_lossy(self.inner.name_bytes()).into_owned()
    }

    fn to_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.inner.encode())
    }

    fn nbytes(&self) -> PyResult<u64> {
        Ok(self.inner.nbytes()?)
    }

    fn nelements(&self) -> PyResult<u64> {
        Ok(self.inner.nelements()?)
    }

    fn op_param_i32(&self, i: usize) -> PyResult<i32> {
        Ok(self.op_param_bits(i)? as i32)
    }

    fn op_param_f32(&self, i: usize) -> PyResult<f32> {
        Ok(f32::from_bits(self.op_param_bits(i)?))
    }

    fn __repr__(&self) -> String {
        let t = &self.inner;
        let type_name = types::TYPES
            .get(t.type_id as usize)
            .map_or_else(|| t.type_id.to_string(), |i| i.name.to_owned());
        let dims = |v: [u32; 4]| format!("({}, {}, {}, {})", v[0], v[1], v[2], v[3]);
        format!(
            "RpcTensor(id={:#x}, type={}, buffer={:#x}, ne={}, nb={}, op={}, flags={}, \
             data={:#x}, view_src={:#x}, view_offs={}, name='{}')",
            t.id,
            type_name,
            t.buffer,
            dims(t.ne),
            dims(t.nb),
            t.op,
            t.flags,
            t.data,
            t.view_src,
            t.view_offs,
            String::from_utf8_lossy(t.name_bytes()).escape_default(),
        )
    }
});

impl PyRpcTensor {
    fn op_param_bits(&self, i: usize) -> PyResult<u32> {
        self.inner.op_param_bits(i).ok_or_else(|| {
            PyIndexError::new_err(format!(
                "op_params index {i} out of range 0..{}",
                GGML_MAX_OP_PARAMS / 4
            ))
        })
    }
}

/// Decode one rpc_tensor at `offset`; no validation of the fields.
#[pyfunction]
#[pyo3(signature = (data, offset=0))]
pub fn decode_tensor(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    offset: usize,
) -> PyResult<PyRpcTensor> {
    let view = ByteView::new(data)?;
    Ok(RpcTensor::decode_at(view.as_slice(py), offset)?.into())
}

/// Decode `count` consecutive rpc_tensors starting at `offset`.
#[pyfunction]
pub fn decode_tensors(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    offset: usize,
    count: usize,
) -> PyResult<Vec<PyRpcTensor>> {
    let view = ByteView::new(data)?;
    let tensors = RpcTensor::decode_many(view.as_slice(py), offset, count)?;
    Ok(tensors.into_iter().map(PyRpcTensor::from).collect())
}
