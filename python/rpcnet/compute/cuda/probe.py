"""Can this machine serve `--device cuda`? One clear line when it cannot, before anything starts.

Checks, in order: CuPy importable (exactly one CuPy distribution), an NVIDIA driver new enough
for CuPy's CUDA runtime, and the GPUs asked for. Never imports CuPy at module import time.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from types import ModuleType

INSTALL_HINT = (
    "pip install 'rpcnet[cuda12]' (NVIDIA driver for CUDA 12) "
    "or 'rpcnet[cuda13]' (CUDA 13); install only one"
)

CUPY_DISTRIBUTIONS = ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy")


class CudaUnavailable(ValueError):
    """`--device cuda` cannot be served here; the message is one line saying why and what to do."""


def installed_cupy_distributions() -> list[str]:
    found = []
    for name in CUPY_DISTRIBUTIONS:
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def import_cupy() -> ModuleType:
    dists = installed_cupy_distributions()
    if len(dists) > 1:
        raise CudaUnavailable(
            f"--device cuda: several CuPy packages are installed ({', '.join(dists)}); "
            f"uninstall all but one ({INSTALL_HINT})"
        )
    try:
        return importlib.import_module("cupy")
    except ImportError as exc:
        raise CudaUnavailable(
            f"--device cuda needs CuPy, which is not installed or does not import ({exc}): "
            f"{INSTALL_HINT}"
        ) from None


def _fmt_cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def gpu_count(cupy: ModuleType) -> int:
    """Visible GPUs; raises CudaUnavailable when there is no usable driver or no GPU."""
    runtime = cupy.cuda.runtime
    try:
        driver = runtime.driverGetVersion()
    except Exception as exc:  # noqa: BLE001 - any failure here means "no usable driver"
        driver, why = 0, f" ({exc})"
    else:
        why = ""
    if driver == 0:
        raise CudaUnavailable(
            f"--device cuda: no NVIDIA driver found{why}; install the NVIDIA driver "
            "(libcuda) for your GPU, then check `nvidia-smi`"
        )
    try:
        built_for = runtime.runtimeGetVersion()
    except Exception:  # noqa: BLE001
        built_for = 0
    try:
        count = runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        if built_for > driver:
            raise CudaUnavailable(
                f"--device cuda: the NVIDIA driver supports CUDA {_fmt_cuda_version(driver)} but "
                f"CuPy needs {_fmt_cuda_version(built_for)}; update the driver or "
                f"{INSTALL_HINT}"
            ) from None
        raise CudaUnavailable(f"--device cuda: no CUDA GPU is visible ({exc})") from None
    if count == 0:
        raise CudaUnavailable(
            "--device cuda: no CUDA GPU is visible (check `nvidia-smi` and CUDA_VISIBLE_DEVICES)"
        )
    return count


def parse_device_spec(spec: str) -> list[tuple[str, int | None]]:
    """`cpu`, `cuda`, `cuda:0,cuda:1`, `cuda:0,cpu` -> [(kind, index or None for all GPUs)]."""
    out: list[tuple[str, int | None]] = []
    for part in (p.strip() for p in spec.split(",")):
        kind, _, index = part.partition(":")
        if kind not in ("cpu", "cuda") or (kind == "cpu" and index):
            raise ValueError(f"unknown device {part!r} (available: cpu, cuda, cuda:N)")
        if index and not index.isdigit():
            raise ValueError(f"bad GPU index in device {part!r}")
        out.append((kind, int(index) if index else None))
    if not out:
        raise ValueError("empty --device")
    return out


def check_cuda(
    indices: list[int | None], cupy: ModuleType | None = None
) -> tuple[ModuleType, list[int]]:
    """CuPy and the concrete GPU indices to serve; CudaUnavailable with one line otherwise.
    (`cupy`: a stand-in module, for tests.)"""
    cupy = cupy if cupy is not None else import_cupy()
    count = gpu_count(cupy)
    chosen: list[int] = []
    for index in indices:
        if index is None:
            chosen.extend(range(count))
        elif index >= count:
            raise CudaUnavailable(
                f"--device cuda:{index}: only {count} GPU(s) visible (cuda:0..cuda:{count - 1})"
            )
        else:
            chosen.append(index)
    return cupy, list(dict.fromkeys(chosen))
