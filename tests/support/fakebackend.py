"""A backend with the CUDA backend's transfer semantics on host memory, for tests without a GPU.

Memory is NumPy (so the CPU kernels compute on it), but every byte in or out goes the way the
CUDA backend moves it: payloads are received into two staging slots whose copies to "device"
memory only happen when the staging code waits for them (like an async copy completing), reads
are copies through the slots, and no host view of device memory is ever handed out. A server
whose devices use it must still produce the right bytes end to end.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from rpcnet.compute.backend import CpuBackend
from rpcnet.compute.cuda.staging import StagedSink, StagingPool

CHUNK = 64 << 10  # small, so real payloads take many chunks and both slots


class DeferredCopier:
    """staging.Copier whose copies run only when waited on (an async engine seen from the host)."""

    def __init__(self, memory: dict[int, Any]) -> None:
        self.memory = memory  # base address -> uint8 array
        self.copies = 0

    def pinned(self, nbytes: int) -> memoryview:
        return memoryview(bytearray(nbytes))

    def _locate(self, addr: int) -> tuple[Any, int]:
        for base, arr in self.memory.items():
            if base <= addr < base + max(arr.size, 1):
                return arr, addr - base
        raise AssertionError(f"address {addr:#x} is in no allocation")

    def to_device_async(self, dst: int, src: memoryview, nbytes: int) -> object:
        arr, off = self._locate(dst)
        data = src  # read at completion time: a slot reused too early would show
        return lambda: arr.__setitem__(slice(off, off + nbytes), np.frombuffer(data, np.uint8))

    def to_host_async(self, dst: memoryview, src: int, nbytes: int) -> object:
        arr, off = self._locate(src)
        return lambda: dst.__setitem__(slice(0, nbytes), arr[off : off + nbytes].tobytes())

    def wait(self, token: object) -> None:
        self.copies += 1
        token()  # type: ignore[operator]


class FakeStagedBackend(CpuBackend):
    """Registry key "cpu" (its kernels compute on NumPy), transfers like the CUDA backend."""

    host_resident = False

    def __init__(self, chunk: int = CHUNK) -> None:
        self._memory: dict[int, Any] = {}
        self.copier = DeferredCopier(self._memory)
        self.pool = StagingPool(self.copier, chunk)

    def allocate(self, nbytes: int) -> Any | None:
        mem = super().allocate(nbytes)
        if mem is not None:
            self._memory[self._addr(mem)] = mem
        return mem

    def free(self, mem: Any) -> None:
        self._memory.pop(self._addr(mem), None)

    @staticmethod
    def _addr(mem: Any) -> int:
        return int(mem.__array_interface__["data"][0])

    def host_sink(self, mem: Any, offset: int, nbytes: int) -> StagedSink:
        return StagedSink(self.pool, self._addr(mem) + offset, nbytes)

    def to_device(self, mem: Any, offset: int, data: Any) -> None:
        sink = self.host_sink(mem, offset, memoryview(data).nbytes)
        sink.whole()[:] = memoryview(data).cast("B")
        sink.commit()

    def to_host(self, mem: Any, offset: int, nbytes: int) -> memoryview:
        out = bytearray(nbytes)
        staging = self.pool.acquire()
        pos = 0

        def emit(view: memoryview) -> None:
            nonlocal pos
            out[pos : pos + len(view)] = view
            pos += len(view)

        try:
            staging.download(self._addr(mem) + offset, nbytes, emit)
        finally:
            self.pool.release(staging)
        return memoryview(out)
