"""The CUDA device as `--device cuda` builds it, on the strict stand-in: the real CudaBackend,
CupyCopier, CupyCapturer, kernel library and plan runner, kernels executed by the emulator."""

from __future__ import annotations

from typing import Any

from support.strict_cupy.api import StrictCupy


def strict_cuda_backend(cupy: StrictCupy | None = None) -> Any:
    """CudaBackend(0) on a stand-in (a new one unless given), its modules compiled."""
    from rpcnet.compute.cuda.device import CudaBackend

    backend = CudaBackend(0, cupy if cupy is not None else StrictCupy())
    backend.kernels.warm()
    return backend


def strict_cuda_device(capacity: int | None, cupy: StrictCupy | None = None) -> Any:
    """The protocol device CUDA0 that `make_cuda_devices("cuda:0", ...)` builds on a stand-in;
    its CuPy is `device.backend.cp` (for `assert_clean()`)."""
    from rpcnet.compute.cuda.serve import make_cuda_devices

    cp = cupy if cupy is not None else StrictCupy()
    (device,) = make_cuda_devices("cuda:0", capacity, None, cupy=cp, ready=True)  # type: ignore[arg-type]
    return device
