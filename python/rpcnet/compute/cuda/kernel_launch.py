"""Launching one kernel: CUDA's launch limits, checked before the launch, and the launch count.

Below the launchers (`launch.py`, `launch_fused.py`, `launch_attention.py`) and the parameter
block (`params.py`); it knows nothing of a backend but its `device` and streams.
"""

from __future__ import annotations

from typing import Any

#: CUDA's launch limits (every GPU since compute capability 3.0).
MAX_GRID_X = (1 << 31) - 1
MAX_GRID_YZ = 65535
MAX_BLOCK_THREADS = 1024


class LaunchLimitError(ValueError):
    """A launch a GPU would refuse (grid or block too large): the graph fails, not the GPU."""


def check_launch(grid: tuple, block: tuple) -> None:
    """Refuse what CUDA would refuse, with the numbers, before it becomes a CUDA error."""
    g = (*grid, 1, 1)[:3]
    b = (*block, 1, 1)[:3]
    if not (0 < g[0] <= MAX_GRID_X and 0 < g[1] <= MAX_GRID_YZ and 0 < g[2] <= MAX_GRID_YZ):
        raise LaunchLimitError(f"grid {g} outside CUDA's limits (x < 2^31, y and z <= 65535)")
    if min(b) <= 0 or b[0] * b[1] * b[2] > MAX_BLOCK_THREADS or b[2] > 64:
        raise LaunchLimitError(f"block {b} outside CUDA's limits (<= 1024 threads, z <= 64)")


_launches = [0]  # kernels launched by this process (the decode-step count reads it)


def launch_count() -> int:
    """Kernels launched so far (cuBLAS calls through CuPy not included)."""
    return _launches[0]


def launch(be: Any, fn: Any, grid: tuple, block: tuple, args: tuple, stream: Any = None) -> None:
    """Launch on `stream`, by default the backend's kernel stream (CuPy launches on the current
    stream)."""
    check_launch(grid, block)
    with be.device, stream if stream is not None else be.stream:
        fn(grid, block, args)
    _launches[0] += 1
