//! Native steps of the element-wise maps on f32 rows: SCALE, TANH, GELU and GEGLU
//! (`kernels::elementwise`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::native_ops::{Kernel, NativeStep, Operands, TensorArg};
use crate::kernels::elementwise::{ElementMap, MapOp, GELU_TABLE_LEN};

fn map_step(
    x: TensorArg<'_>,
    out: TensorArg<'_>,
    threads: usize,
    what: &str,
    op: impl FnOnce(&mut Operands) -> PyResult<MapOp>,
) -> PyResult<NativeStep> {
    let (mut ops, x, out) = Operands::f32_in_out(&x, &out)?;
    let op = op(&mut ops)?;
    let map = ElementMap { x, out, op };
    map.check()
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
    Ok(NativeStep::new(Kernel::Map(Box::new(map)), threads, ops))
}

/// The GELU table (float32 values of ggml's f16 table, one per f16 bit pattern), held by `ops`.
fn gelu_table(ops: &mut Operands, table: &Bound<'_, PyAny>) -> PyResult<*const f32> {
    let len = GELU_TABLE_LEN;
    let arg = (
        table.clone(),
        0,
        [len, 1, 1, 1],
        [4, 4 * len, 4 * len, 4 * len],
    );
    let t = ops.take(&arg, 4, false, "gelu table")?;
    Ok(t.ptr as *const f32)
}

/// SCALE: `out = x·s`, or `fma(x, s, b)` when `b` is not 0 (in place allowed).
#[pyfunction]
#[pyo3(signature = (x, out, s, b, threads = 1))]
pub fn scale_step(
    x: TensorArg<'_>,
    out: TensorArg<'_>,
    s: f32,
    b: f32,
    threads: usize,
) -> PyResult<NativeStep> {
    map_step(x, out, threads, "scale", |_| Ok(MapOp::Scale { s, b }))
}

/// UNARY TANH, correctly rounded as the reference's C library computes it (in place allowed).
#[pyfunction]
#[pyo3(signature = (x, out, threads = 1))]
pub fn tanh_step(x: TensorArg<'_>, out: TensorArg<'_>, threads: usize) -> PyResult<NativeStep> {
    map_step(x, out, threads, "tanh", |_| Ok(MapOp::Tanh))
}

/// UNARY GELU of f32 rows through ggml's f16 table `table` (in place allowed).
#[pyfunction]
#[pyo3(signature = (x, out, table, threads = 1))]
pub fn gelu_step(
    x: TensorArg<'_>,
    out: TensorArg<'_>,
    table: Bound<'_, PyAny>,
    threads: usize,
) -> PyResult<NativeStep> {
    map_step(x, out, threads, "gelu", |ops| {
        Ok(MapOp::Gelu {
            table: gelu_table(ops, &table)?,
        })
    })
}

/// GLU GEGLU of f32 rows: `out = gelu(x)·g` through ggml's f16 table (views of split rows
/// allowed).
#[pyfunction]
#[pyo3(signature = (x, g, out, table, threads = 1))]
pub fn geglu_step(
    x: TensorArg<'_>,
    g: TensorArg<'_>,
    out: TensorArg<'_>,
    table: Bound<'_, PyAny>,
    threads: usize,
) -> PyResult<NativeStep> {
    map_step(x, out, threads, "geglu", |ops| {
        let g = ops.take(&g, 4, false, "g")?;
        let table = gelu_table(ops, &table)?;
        Ok(MapOp::Geglu { table, g })
    })
}
