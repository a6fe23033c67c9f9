//! Prepared native graph steps for Python: a builder checks one node's operands against their
//! buffers once (at plan time) and returns a [`NativeStep`]; calling it, or handing a run of
//! them to [`run_steps`], does only the arithmetic, detached from the interpreter.

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::kernels::f16vec;
use crate::kernels::flash_attn::{FlashAttn, Operand};
use crate::kernels::rowops::RowOp;

/// A tensor as Python passes it: (uint8 buffer, byte offset of element 0, ne, nb).
type TensorArg<'py> = (Bound<'py, PyAny>, usize, [usize; 4], [usize; 4]);

enum Kernel {
    FlashAttn(Box<FlashAttn>),
    Row(RowOp),
}

/// One compiled node. Holds the buffer exports, so its memory outlives the step.
#[pyclass(frozen, module = "rpcnet._native")]
pub struct NativeStep {
    kernel: Kernel,
    threads: usize,
    _keep: Vec<PyBuffer<u8>>,
}

// SAFETY: the raw pointers in `kernel` point into the held exports; a step is only run by one
// thread at a time (the device worker), and its threads write disjoint output rows.
unsafe impl Send for NativeStep {}
unsafe impl Sync for NativeStep {}

impl NativeStep {
    fn run(&self) {
        // SAFETY: operands were checked against their buffers when the step was built, and
        // the exports in `_keep` keep that memory alive.
        unsafe {
            match &self.kernel {
                Kernel::FlashAttn(fa) => fa.run(self.threads),
                Kernel::Row(op) => op.run(self.threads),
            }
        }
    }
}

#[pymethods]
impl NativeStep {
    fn __call__(&self, py: Python<'_>) {
        py.detach(|| self.run());
    }
}

/// Run consecutive native steps in one detached call.
#[pyfunction]
pub fn run_steps(py: Python<'_>, steps: Vec<Py<NativeStep>>) {
    let steps: Vec<&NativeStep> = steps.iter().map(|s| s.get()).collect();
    py.detach(|| steps.iter().for_each(|s| s.run()));
}

/// Use only the portable (non-SIMD) paths of these kernels from now on (tests).
#[pyfunction]
pub fn native_ops_portable(on: bool) {
    f16vec::set_portable_only(on);
}

/// Holds exports and turns tensor arguments into checked operands.
struct Operands {
    keep: Vec<PyBuffer<u8>>,
}

impl Operands {
    fn new() -> Self {
        Self { keep: Vec::new() }
    }

    /// Check that every element of a tensor of `elem`-byte elements (rows contiguous) lies
    /// inside its buffer; `writable` for outputs.
    fn take(
        &mut self,
        arg: &TensorArg<'_>,
        elem: usize,
        writable: bool,
        what: &str,
    ) -> PyResult<Operand> {
        let (obj, offset, ne, nb) = arg;
        let buf = PyBuffer::<u8>::get(obj)?;
        let bad = |why: String| Err(PyValueError::new_err(format!("{what}: {why}")));
        if !buf.is_c_contiguous() {
            return bad("buffer must be C-contiguous".into());
        }
        if writable && buf.readonly() {
            return bad("buffer must be writable".into());
        }
        if nb[0] != elem {
            return bad(format!("rows must be contiguous ({}-byte elements)", elem));
        }
        let mut last = *offset;
        for d in 0..4 {
            if ne[d] == 0 {
                return bad("empty tensor".into());
            }
            last = (ne[d] - 1)
                .checked_mul(nb[d])
                .and_then(|x| x.checked_add(last))
                .ok_or_else(|| PyValueError::new_err(format!("{what}: extent overflows")))?;
        }
        let end = last.saturating_add(elem);
        if end > buf.len_bytes() {
            return bad(format!(
                "extent {end} exceeds the buffer ({} bytes)",
                buf.len_bytes()
            ));
        }
        // SAFETY: offset < end <= len, within the export.
        let ptr = unsafe { (buf.buf_ptr() as *const u8).add(*offset) };
        self.keep.push(buf);
        Ok(Operand {
            ptr,
            ne: *ne,
            nb: *nb,
        })
    }
}

/// FLASH_ATTN_EXT with f32 q, f16 k/v, optional f16 mask and f32 sinks into contiguous f32 out.
#[pyfunction]
#[pyo3(signature = (q, k, v, mask, sinks, out, scale, max_bias, softcap, threads = 1))]
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_ext_f16_step(
    q: TensorArg<'_>,
    k: TensorArg<'_>,
    v: TensorArg<'_>,
    mask: Option<TensorArg<'_>>,
    sinks: Option<TensorArg<'_>>,
    out: TensorArg<'_>,
    scale: f32,
    max_bias: f32,
    softcap: f32,
    threads: usize,
) -> PyResult<NativeStep> {
    let mut ops = Operands::new();
    let q = ops.take(&q, 4, false, "q")?;
    let k = ops.take(&k, 2, false, "k")?;
    let v = ops.take(&v, 2, false, "v")?;
    let mask = mask.map(|m| ops.take(&m, 2, false, "mask")).transpose()?;
    let sinks = match sinks {
        Some(s) => {
            let op = ops.take(&s, 4, false, "sinks")?;
            if op.ne.iter().product::<usize>() < q.ne[2] {
                return Err(PyValueError::new_err("sinks: fewer values than heads"));
            }
            if op.ne[1] * op.ne[2] * op.ne[3] != 1 {
                return Err(PyValueError::new_err("sinks must be one row"));
            }
            Some(op.ptr as *const f32)
        }
        None => None,
    };
    let o = ops.take(&out, 4, true, "out")?;
    let [dk, n_q, n_head, n3] = q.ne;
    let dv = v.ne[0];
    let expected = [dv, n_head, n_q, n3];
    if o.ne != expected
        || o.nb[1] != dv * 4
        || o.nb[2] != o.nb[1] * n_head
        || o.nb[3] != o.nb[2] * n_q
    {
        return Err(PyValueError::new_err(format!(
            "out must be contiguous f32 {expected:?}, got ne {:?} nb {:?}",
            o.ne, o.nb
        )));
    }
    let _ = dk;
    let fa = FlashAttn {
        q,
        k,
        v,
        mask,
        sinks,
        out: o.ptr as *mut u8,
        out_row: o.nb[1],
        scale,
        max_bias,
        softcap,
    };
    fa.check().map_err(|e| PyValueError::new_err(e.reason))?;
    Ok(NativeStep {
        kernel: Kernel::FlashAttn(Box::new(fa)),
        threads: threads.max(1),
        _keep: ops.keep,
    })
}
