//! Compute kernels for Python: argument checks, then the arithmetic detached from the
//! interpreter.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::buffer::ByteView;
use crate::kernels::cpu;
use crate::kernels::formats::type_info;
use crate::kernels::matmul::plan as matmul;

fn matrix_shape(buf: &PyBuffer<f32>, what: &str) -> PyResult<(usize, usize)> {
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err(format!(
            "{what} must be C-contiguous"
        )));
    }
    match *buf.shape() {
        [rows, cols] => Ok((rows, cols)),
        ref shape => Err(PyValueError::new_err(format!(
            "{what} must be 2-D, got shape {shape:?}"
        ))),
    }
}

/// `out[n, m] = Σ_k w[m, k] · x[n, k]` for weights of ggml type `type_id` (rows `row_stride`
/// bytes apart, in block form) against float32 activations converted like ggml's CPU backend
/// (quantized to the type's vec_dot type); weight rows split over `threads` threads.
/// `each_row`: every activation row by the single-row kernels (`matmul::Order::EachRow`, the
/// joint decode of several clients), `llamafile` ignored.
#[pyfunction]
#[pyo3(signature = (type_id, w, row_stride, x, out, threads = 1, llamafile = false, each_row = false))]
#[allow(clippy::too_many_arguments)]
pub fn matmul_quant(
    py: Python<'_>,
    type_id: u32,
    w: &Bound<'_, PyAny>,
    row_stride: usize,
    x: &Bound<'_, PyAny>,
    out: &Bound<'_, PyAny>,
    threads: usize,
    llamafile: bool,
    each_row: bool,
) -> PyResult<()> {
    let w = ByteView::new(w)?;
    let x = PyBuffer::<f32>::get(x)?;
    let out = PyBuffer::<f32>::get(out)?;
    let (n, k) = matrix_shape(&x, "x")?;
    let (n_out, m) = matrix_shape(&out, "out")?;
    if out.readonly() {
        return Err(PyValueError::new_err("out must be writable"));
    }
    if n_out != n {
        return Err(PyValueError::new_err(format!(
            "out has {n_out} rows, x has {n}"
        )));
    }
    // Activations and results are small next to the weights: copy them while attached, so
    // only the weights are read while detached.
    let xs = x.to_vec(py)?;
    let mut res = vec![0.0f32; n * m];
    // SAFETY: like NumPy's own GIL-released kernels, this relies on no other thread writing
    // the weight buffer during the call; `w` keeps the export (and the memory) alive.
    let wb = unsafe { w.raw_slice() };
    py.detach(|| {
        let order = if each_row {
            matmul::Order::EachRow
        } else {
            matmul::Order::Ggml { llamafile }
        };
        matmul::matmul_quant(type_id, wb, row_stride, m, k, &xs, &mut res, threads, order)
    })
    .map_err(|e| PyValueError::new_err(e.reason))?;
    out.copy_from_slice(py, &res)
}

/// Whether `matmul_quant` has a kernel for ggml type `type_id`.
#[pyfunction]
pub fn matmul_quant_supports(type_id: u32) -> bool {
    type_info(type_id).is_some()
}

/// (elements per block, bytes per block, K must be a multiple of) for a supported weight
/// type, else None.
#[pyfunction]
pub fn matmul_quant_block(type_id: u32) -> Option<(usize, usize, usize)> {
    type_info(type_id).map(|t| (t.block, t.block_bytes, t.block.max(t.act.block())))
}

/// Elements per block of the format ggml's CPU dot product quantizes activations to for this
/// weight type (its vec_dot_type): 32 (q8_0, q8_1), 256 (q8_K), 1 (float: no quantization);
/// None for an unsupported type.
#[pyfunction]
pub fn matmul_activation_block(type_id: u32) -> Option<usize> {
    type_info(type_id).map(|t| t.act.block())
}

/// Forces (True) or releases (False) the portable kernels; returns whether SIMD is now used.
#[pyfunction]
pub fn set_portable_kernels(on: bool) -> bool {
    cpu::set_force_portable(on);
    cpu::simd_active()
}

/// Allows (True) or disables (False) the AVX-512 kernels; returns whether they now run.
#[pyfunction]
pub fn set_avx512_kernels(on: bool) -> bool {
    cpu::set_avx512(on);
    cpu::avx512_vnni_active()
}

/// Whether the native matmul kernels take their SIMD build on this CPU.
#[pyfunction]
pub fn kernels_simd() -> bool {
    cpu::simd_active()
}
