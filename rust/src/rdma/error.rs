//! The error every RDMA step returns: why there is no RDMA, or why a value is unusable.

use std::fmt;

/// Why there is no RDMA (or why caps / environment values are unusable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaError {
    pub reason: String,
}

impl RdmaError {
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }
}

impl fmt::Display for RdmaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for RdmaError {}
