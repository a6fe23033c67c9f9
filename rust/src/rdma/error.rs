//! The error every RDMA step returns: why there is no RDMA, or why a value is unusable.

crate::errors::reason_error!(
    /// Why there is no RDMA (or why caps / environment values are unusable).
    RdmaError
);
