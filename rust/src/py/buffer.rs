//! Zero-copy, read-only access to any object exporting the buffer protocol (bytes, bytearray,
//! memoryview, numpy arrays, mmap ...).

use std::sync::atomic::AtomicU8;

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// A held buffer export. While it lives the exporter keeps the memory alive and refuses to
/// resize it (bytearray, array, mmap all enforce this).
pub struct ByteView {
    buf: PyUntypedBuffer,
    immutable: bool,
}

impl ByteView {
    pub fn new(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let buf = PyUntypedBuffer::get(obj)?;
        if !buf.is_c_contiguous() {
            return Err(PyBufferError::new_err("buffer must be C-contiguous"));
        }
        Ok(Self {
            buf,
            immutable: obj.is_exact_instance_of::<PyBytes>(),
        })
    }

    pub fn len(&self) -> usize {
        self.buf.len_bytes()
    }

    /// The bytes as a plain slice. Requires the interpreter to be attached (the `Python` token),
    /// so no Python code can write to the buffer while the slice is in use.
    pub fn as_slice<'a>(&'a self, _py: Python<'a>) -> &'a [u8] {
        // SAFETY: for len > 0 the export guarantees `len` readable, contiguous bytes at
        // `buf_ptr` for as long as `self` lives; being attached, no Python thread runs, and
        // the slice cannot outlive the token's lifetime.
        unsafe { self.raw_slice() }
    }

    /// The bytes as a plain slice that may be used while detached. Only for `bytes` objects,
    /// whose contents never change.
    pub fn as_immutable_slice(&self) -> Option<&[u8]> {
        // SAFETY: see `as_slice`; an exact `bytes` object is immutable, so no writer can exist.
        self.immutable.then(|| unsafe { self.raw_slice() })
    }

    /// The bytes viewed as atomics, usable while detached from the interpreter: another thread
    /// may then write the buffer (e.g. a bytearray), which must not be a data race on `&[u8]`.
    pub fn as_shared(&self) -> &[AtomicU8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: AtomicU8 has the size and alignment of u8; the export keeps `len` bytes alive
        // at `buf_ptr` for as long as `self` lives, and shared atomics permit concurrent writes.
        unsafe { std::slice::from_raw_parts(self.buf.buf_ptr() as *const AtomicU8, self.len()) }
    }

    /// # Safety
    /// Caller must rule out concurrent writes for the lifetime of the returned slice.
    pub(super) unsafe fn raw_slice(&self) -> &[u8] {
        if self.len() == 0 {
            return &[];
        }
        // SAFETY: non-null, contiguous and `len` bytes long per the buffer export (above).
        unsafe { std::slice::from_raw_parts(self.buf.buf_ptr() as *const u8, self.len()) }
    }
}
