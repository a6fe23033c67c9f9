//! The MUL_MAT_ID native step: every selected expert of one node in one detached call.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::native_ops::{Kernel, NativeStep, Operands, TensorArg};
use crate::kernels::formats::type_info;
use crate::kernels::matmul::experts::MulMatId;

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
    Ok(NativeStep {
        kernel: Kernel::MulMatId(Box::new(mm)),
        threads: threads.max(1),
        _keep: ops.keep,
    })
}
