//! The native steps of a mixture-of-experts layer: MUL_MAT_ID (every selected expert of one
//! node in one detached call) and the router's ARGSORT, SUM_ROWS and CLAMP.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::native_ops::{Kernel, NativeStep, Operands, TensorArg};
use crate::kernels::formats::type_info;
use crate::kernels::matmul::experts::MulMatId;
use crate::kernels::routing::Routing;

/// MUL_MAT_ID of experts of ggml type `type_id` (`w.ne[0]` in blocks; [blocks, M, experts, 1])
/// with f32 activations `x` ([K, rows per token, tokens, 1]) routed by i32 `ids` ([slots,
/// tokens, 1, 1]) into f32 `out` ([M, slots, tokens, 1]); rows contiguous, any other strides.
#[pyfunction]
#[pyo3(signature = (type_id, w, x, ids, out, threads = 1))]
pub fn mul_mat_id_step(
    type_id: u32,
    w: TensorArg<'_>,
    x: TensorArg<'_>,
    ids: TensorArg<'_>,
    out: TensorArg<'_>,
    threads: usize,
) -> PyResult<NativeStep> {
    let info = type_info(type_id).ok_or_else(|| {
        PyValueError::new_err(format!(
            "mul_mat_id: expert type {type_id} is not supported"
        ))
    })?;
    let mut ops = Operands::new();
    let w = ops.take(&w, info.block_bytes, false, "w")?;
    let x = ops.take(&x, 4, false, "x")?;
    let ids = ops.take(&ids, 4, false, "ids")?;
    let o = ops.take(&out, 4, true, "out")?;
    let mm = MulMatId {
        type_id,
        w,
        x,
        ids,
        out: o.ptr as *mut u8,
        out_nb: o.nb,
    };
    mm.check(o.ne)
        .map_err(|e| PyValueError::new_err(format!("mul_mat_id: {}", e.reason)))?;
    Ok(NativeStep::new(
        Kernel::MulMatId(Box::new(mm)),
        threads,
        ops,
    ))
}

fn routing_step(op: Routing, threads: usize, ops: Operands, what: &str) -> PyResult<NativeStep> {
    op.check()
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
    Ok(NativeStep::new(Kernel::Routing(Box::new(op)), threads, ops))
}

/// ARGSORT of f32 rows into i32 indices of the same shape (stable; NaNs last).
#[pyfunction]
#[pyo3(signature = (x, out, descending, threads = 1))]
pub fn argsort_step(
    x: TensorArg<'_>,
    out: TensorArg<'_>,
    descending: bool,
    threads: usize,
) -> PyResult<NativeStep> {
    let (ops, x, out) = Operands::f32_in_out(&x, &out)?;
    let op = Routing::ArgSort { x, out, descending };
    routing_step(op, threads, ops, "argsort")
}

/// SUM_ROWS of f32 rows into f32 [1, rows...], summed in f64 like ggml.
#[pyfunction]
#[pyo3(signature = (x, out, threads = 1))]
pub fn sum_rows_step(x: TensorArg<'_>, out: TensorArg<'_>, threads: usize) -> PyResult<NativeStep> {
    let (ops, x, out) = Operands::f32_in_out(&x, &out)?;
    routing_step(Routing::SumRows { x, out }, threads, ops, "sum_rows")
}

/// CLAMP of f32 values into [min, max] with ggml's MAX(MIN(x, max), min) (in place allowed).
#[pyfunction]
#[pyo3(signature = (x, out, min, max, threads = 1))]
pub fn clamp_step(
    x: TensorArg<'_>,
    out: TensorArg<'_>,
    min: f32,
    max: f32,
    threads: usize,
) -> PyResult<NativeStep> {
    let (ops, x, out) = Operands::f32_in_out(&x, &out)?;
    routing_step(Routing::Clamp { x, out, min, max }, threads, ops, "clamp")
}
