"""`--device` with cuda in it: check the machine, then build the protocol devices."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from rpcnet.compute.cuda.probe import CudaUnavailable, check_cuda, parse_device_spec

#: Serve cuda although SERVING_READY is False (for the GPU device check: docs/gpu.md).
EXPERIMENTAL_ENV = "RPCNET_CUDA_EXPERIMENTAL"
CUDA_ALIGNMENT = 128  # what ggml-cuda's buffer type reports


def make_cuda_devices(
    spec: str,
    capacity: int | None,
    threads: int | None,
    max_scratch: int | None = None,
    cupy: ModuleType | None = None,
    ready: bool | None = None,
) -> list:
    """Devices for a `--device` spec naming cuda (e.g. `cuda`, `cuda:0,cuda:1`, `cuda:0,cpu`),
    in the order given; `capacity` (--mem) caps each one.

    Raises CudaUnavailable (a ValueError: the CLI prints its one line and exits 2) when CuPy,
    the driver or the GPUs are missing, or while cuda serving is not ready, and ValueError for
    a malformed spec. `cupy` and `ready` are for tests (a stand-in CuPy).
    """
    from rpcnet.compute.cuda.device import SERVING_READY, CudaBackend

    wanted = parse_device_spec(spec)
    cuda_indices = [index for kind, index in wanted if kind == "cuda"]
    cupy, chosen = check_cuda(cuda_indices, cupy)
    backends: dict[int, Any] = {}
    order: list[tuple[str, int | None]] = []
    for kind, index in wanted:
        if kind == "cpu":
            order.append(("cpu", None))
            continue
        for i in chosen if index is None else [index]:
            if i not in backends:
                backends[i] = CudaBackend(i, cupy)
                order.append(("cuda", i))
    if ready is None:
        ready = SERVING_READY or os.environ.get(EXPERIMENTAL_ENV) == "1"
    if not ready:
        names = ", ".join(f"CUDA{i} ({be.info.name})" for i, be in backends.items())
        raise CudaUnavailable(
            f"--device cuda: found {names}, but graph execution on cuda has not yet run on a "
            f"GPU (docs/gpu.md; {EXPERIMENTAL_ENV}=1 to try it); serve --device cpu meanwhile"
        )
    for backend in backends.values():
        backend.kernels.warm()  # compile before the first client, not in its first graph
    return [
        _device(pos, kind, None if i is None else backends[i], capacity, threads, max_scratch)
        for pos, (kind, i) in enumerate(order)
    ]


def _device(
    pos: int,
    kind: str,
    backend: Any,
    capacity: int | None,
    threads: int | None,
    max_scratch: int | None,
) -> Any:
    from rpcnet.compute.cuda.device import CupyCapturer
    from rpcnet.compute.cuda.execute import PlanRunner
    from rpcnet.compute.cuda.launch import launch_count
    from rpcnet.compute.device import Device, cpu_device
    from rpcnet.compute.memory import MemoryPool

    if kind == "cpu":
        return cpu_device(pos, capacity=capacity, threads=threads, max_scratch=max_scratch)
    total = backend.info.total
    return Device(
        index=pos,
        name=f"CUDA{backend.index}",
        description=backend.info.name,
        memory=MemoryPool(min(total, capacity) if capacity else total),
        alignment=CUDA_ALIGNMENT,
        backend=backend,
        runner=PlanRunner(backend, CupyCapturer(backend.stream), kernel_count=launch_count),
        live_memory=backend.free_memory,
        max_scratch=max_scratch,
    )
