//! Thin wrappers around the framing, type, region and chunk functions of the core.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::FrameError;
use crate::framing::{self, Command, Proto, RequestSize, ResponseSize};
use crate::{chunk, region, types};

pub fn proto_of(proto: u64) -> PyResult<Proto> {
    Proto::from_major(proto).ok_or_else(|| {
        PyValueError::new_err(format!(
            "unsupported protocol version {proto} (expected 7 or 8)"
        ))
    })
}

fn command_of(proto: u64, cmd: u64) -> PyResult<Command> {
    Ok(Command::from_id(proto_of(proto)?, cmd)
        .ok_or_else(|| FrameError::new(cmd, 0, format!("unknown command {cmd}")))?)
}

/// Name of command `cmd` in dialect `proto`, or `UNKNOWN(<cmd>)`.
#[pyfunction]
pub fn command_name(proto: u64, cmd: u64) -> PyResult<String> {
    Ok(framing::command_name(proto_of(proto)?, cmd))
}

/// Validate a request header before its payload is read (FrameError on failure).
#[pyfunction]
pub fn check_header(
    proto: u64,
    cmd: u64,
    size: u64,
    max_data: u64,
    max_graph: u64,
) -> PyResult<()> {
    framing::check_header(proto_of(proto)?, cmd, size, max_data, max_graph)?;
    Ok(())
}

/// Fixed request payload size, or None when the size is variable.
#[pyfunction]
pub fn request_size(proto: u64, cmd: u64) -> PyResult<Option<u64>> {
    let proto_v = proto_of(proto)?;
    Ok(match command_of(proto, cmd)?.request_size(proto_v) {
        RequestSize::Fixed(n) => Some(n),
        RequestSize::AtLeast(_) => None,
    })
}

/// Fixed response payload size; None = no response; -1 = depends on the request.
#[pyfunction]
pub fn response_size(proto: u64, cmd: u64) -> PyResult<Option<i64>> {
    Ok(match command_of(proto, cmd)?.response_size() {
        ResponseSize::None => None,
        ResponseSize::Fixed(n) => Some(n as i64),
        ResponseSize::Variable => Some(-1),
    })
}

/// `(name, block_size, type_size, is_quantized)` of a valid ggml type.
#[pyfunction]
pub fn type_info(type_id: u64) -> PyResult<(&'static str, u64, u64, bool)> {
    let i = types::type_info(type_id)?;
    Ok((i.name, i.block_size, i.type_size, i.quantized))
}

/// Every ggml type id with `(id, name, block_size, type_size, is_quantized)`; removed ids have
/// block size 0. The single source Python builds its type enum from.
#[pyfunction]
pub fn type_table() -> Vec<(u32, &'static str, u64, u64, bool)> {
    (0..types::GGML_TYPE_COUNT)
        .zip(types::TYPES.iter())
        .map(|(id, i)| (id, i.name, i.block_size, i.type_size, i.quantized))
        .collect()
}

/// `ggml_nbytes` with overflow checks.
#[pyfunction]
pub fn tensor_nbytes(type_id: u64, ne: [u64; 4], nb: [u64; 4]) -> PyResult<u64> {
    Ok(types::nbytes(type_id, ne, nb)?)
}

/// Product of `ne`, failing past i64::MAX.
#[pyfunction]
pub fn nelements(ne: Vec<u64>) -> PyResult<u64> {
    Ok(types::nelements(&ne)?)
}

/// A `#[pyfunction]` passing its arguments on to the region check of the same name.
macro_rules! region_check {
    ($(#[$attr:meta])* $name:ident($($arg:ident: $ty:ty),* $(,)?)) => {
        #[pyfunction]
        $(#[$attr])*
        pub fn $name($($arg: $ty),*) -> PyResult<()> {
            Ok(region::$name($($arg),*)?)
        }
    };
}

region_check!(check_tensor_in_buffer(data: u64, nbytes: u64, base: u64, size: u64));
region_check!(check_region(base: u64, size: u64, data: u64, offset: u64, length: u64, tensor_nbytes: u64));
region_check!(check_memset(base: u64, size: u64, data: u64, offset: u64, length: u64, tensor_nbytes: u64));
region_check!(
    #[allow(clippy::too_many_arguments)] // mirrors the wire fields one to one
    check_region_2d(base: u64, size: u64, data: u64, tensor_nbytes: u64, offset: u64, row: u64, n_copies: u64, stride: u64, payload: Option<u64>)
);

/// `(offset, length)` pieces of at most `chunk` bytes covering `total`.
#[pyfunction]
#[pyo3(signature = (total, chunk = chunk::MAX_CHUNK))]
pub fn chunk_plan(total: u64, chunk: u64) -> PyResult<Vec<(u64, u64)>> {
    if chunk == 0 {
        return Err(PyValueError::new_err("chunk must be positive"));
    }
    Ok(chunk::chunk_plan(total, chunk).collect())
}
