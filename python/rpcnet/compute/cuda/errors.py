"""CUDA error policy: which errors poison the whole context (exit) and which one client (close).

After a "sticky" error every later CUDA call in the process fails, so the server cannot go on
serving anyone: it logs the error and exits non-zero for its supervisor to restart it
(docs/gpu.md). Any other error fails only the graph (and closes its client).
"""

from __future__ import annotations

# cudaError_t values after which the context is unusable (CUDA runtime API documentation).
STICKY_ERRORS: dict[int, str] = {
    700: "cudaErrorIllegalAddress",
    701: "cudaErrorLaunchOutOfResources",  # not sticky by itself, but only after corruption
    702: "cudaErrorLaunchTimeout",
    714: "cudaErrorHardwareStackError",
    715: "cudaErrorIllegalInstruction",
    716: "cudaErrorMisalignedAddress",
    717: "cudaErrorInvalidAddressSpace",
    718: "cudaErrorInvalidPc",
    719: "cudaErrorLaunchFailure",
    999: "cudaErrorUnknown",
}
# 701 is a resource error of one launch; the context survives it.
STICKY_ERRORS.pop(701)


class CudaGraphError(RuntimeError):
    """A CUDA error that fails one client's graph; the server goes on."""


class CudaStickyError(RuntimeError):
    """The CUDA context is unusable; the server must exit (non-zero) and be restarted."""


def classify(status: int, what: str) -> RuntimeError:
    name = STICKY_ERRORS.get(status)
    if name is not None:
        return CudaStickyError(f"CUDA context lost: {name} ({status}) during {what}")
    return CudaGraphError(f"CUDA error {status} during {what}")


def error_status(exc: BaseException) -> int | None:
    """The cudaError_t of a CuPy CUDARuntimeError/CUDADriverError, else None."""
    status = getattr(exc, "status", None)
    return int(status) if isinstance(status, int) else None
