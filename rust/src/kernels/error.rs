//! The error the kernels return for inconsistent sizes.

crate::errors::reason_error!(
    /// Inconsistent sizes handed to a kernel.
    KernelError
);
