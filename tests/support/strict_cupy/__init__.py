"""A strict stand-in for CuPy, for the CUDA backend's host logic in CI (no GPU).

The real `CudaBackend`, `CupyCopier`, `CupyCapturer`, kernel library and launchers run on it
unchanged (`cupy=StrictCupy()`); kernels execute on the CPU emulator. It enforces, and records
as violations that fail the test:

- stream ordering: memory used on one stream after another wrote it (or a write after another
  stream's read), with no event or synchronize between them;
- capture rules: no allocation, synchronize, host copy or legacy-stream use while capturing;
  a capturing stream's operations are recorded and run at each graph launch;
- every launch recorded (`launches`), its grid, block and pointer arguments checked;
- CUDA virtual memory management (`vmm.py`): granule rules, access, unmapped addresses.
"""

from support.strict_cupy.api import GIB, Launch, OutOfMemoryError, StrictCupy
from support.strict_cupy.devices import strict_cuda_backend, strict_cuda_device
from support.strict_cupy.streams import CudaRuntimeError
from support.strict_cupy.timeline import (
    CaptureError,
    LaunchError,
    MemoryFault,
    StreamOrderError,
    StrictViolation,
)
from support.strict_cupy.vmm import GRANULE, StrictVmm, VmmMisuse

__all__ = [
    "GIB",
    "GRANULE",
    "CaptureError",
    "CudaRuntimeError",
    "Launch",
    "LaunchError",
    "MemoryFault",
    "OutOfMemoryError",
    "StreamOrderError",
    "StrictCupy",
    "StrictViolation",
    "StrictVmm",
    "VmmMisuse",
    "strict_cuda_backend",
    "strict_cuda_device",
]
