//! The error the kernels return for inconsistent sizes.

use std::fmt;

/// Inconsistent sizes handed to a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    pub reason: String,
}

impl KernelError {
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for KernelError {}
