//! Error values of the pure-Rust core. Each one carries a human-readable `reason`; the pyo3
//! layer maps them onto the narrow Python exception classes (`FrameError`, `TensorError`,
//! `GraphError`) and copies the fields over.

use std::fmt;

/// A request header (cmd byte + u64 size) that must be refused before reading the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError {
    pub cmd: u64,
    pub size: u64,
    pub reason: String,
}

impl FrameError {
    pub fn new(cmd: u64, size: u64, reason: impl Into<String>) -> Self {
        Self {
            cmd,
            size,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (cmd={}, size={})", self.reason, self.cmd, self.size)
    }
}

impl std::error::Error for FrameError {}

/// Declares an error type that carries only a human-readable `reason`, displayed as is.
macro_rules! reason_error {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name {
            pub reason: String,
        }

        impl $name {
            pub fn new(reason: impl Into<String>) -> Self {
                Self {
                    reason: reason.into(),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.reason)
            }
        }

        impl std::error::Error for $name {}
    };
}
pub(crate) use reason_error;

reason_error!(
    /// An invalid `rpc_tensor`, type, size computation or out-of-bounds region.
    TensorError
);

reason_error!(
    /// A malformed GRAPH_COMPUTE payload.
    GraphError
);

/// Shorthand used by the region checks: fail with `reason` unless `ok`.
pub(crate) fn ensure(ok: bool, reason: impl FnOnce() -> String) -> Result<(), TensorError> {
    if ok {
        Ok(())
    } else {
        Err(TensorError::new(reason()))
    }
}
