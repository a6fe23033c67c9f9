//! Row-wise ops (norms, rope, glu, softmax, row copies) computed like ggml's CPU backend.

/// One prepared row-wise node.
#[derive(Clone, Copy, Debug)]
pub enum RowOp {}

// SAFETY: see NativeStep; the pointers are only used by the threads of one call.
unsafe impl Send for RowOp {}
unsafe impl Sync for RowOp {}

impl RowOp {
    /// # Safety
    /// Operands must be valid for their shapes and strides during the call.
    pub unsafe fn run(&self, _threads: usize) {
        match *self {}
    }
}
