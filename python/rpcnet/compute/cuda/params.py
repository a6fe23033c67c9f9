"""The parameter block: a step's small uploads applied with one copy.

A decode step's inputs (token ids, positions, the mask, the rows the KV cache takes) arrive as
several small SET_TENSORs. As staged copies each would cost a transfer and a wait. Instead they
are held on the host (`PendingWrites`, at most `CAPACITY` bytes in `ENTRIES` writes) and applied
together: a block holding a table of (destination, offset, size) and the bytes is copied to the
device in one transfer, and `rpc_scatter_params` (cpy.cu) puts each write in place.

- Before a plan runs, the writes into buffers the plan touches are loaded into the GPU's graph
  block, and the scatter is the plan's first kernel. It is captured with the rest, so a replayed
  decode step costs one copy and one graph launch. The graph block's address never changes, and
  its count is written before every run (0 when nothing is pending): a replay never scatters
  old bytes.
- Everything else that touches device memory (a read, a large upload, a copy, a fill) first
  applies every pending write (`CudaBackend.flush`), on the copy stream, before it returns.
- A freed buffer's pending writes are dropped: its memory may belong to another buffer next.

Writes into different buffers never overlap, and one session's writes into a buffer are
applied in order: a plan takes all of a buffer's pending writes or none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from rpcnet.compute.cuda.execute import checked
from rpcnet.compute.cuda.kernel_launch import launch

ENTRIES = 64  # RPC_PARAM_ENTRIES in cpy.cu: the scatter's grid
HEADER = 16  # u32 count, then padding
ENTRY = 16  # u64 destination, u32 offset of its bytes in the block, u32 byte count
TABLE = HEADER + ENTRIES * ENTRY
CAPACITY = 1 << 20  # bytes of pending writes at most (their 16-byte-aligned sizes)
SMALL = 256 << 10  # an upload of at most this many bytes waits in the block
_ALIGN = 16
_H2D = 1  # cudaMemcpyHostToDevice


def _padded(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


@dataclass(frozen=True, slots=True)
class Write:
    dst: int  # device address
    data: bytes | bytearray | memoryview


class PendingWrites:
    """Small uploads not yet on the device, in the order they arrived (thread-safe)."""

    def __init__(self, capacity: int = CAPACITY, entries: int = ENTRIES) -> None:
        self.capacity = capacity
        self.entries = entries
        self._writes: list[Write] = []
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._writes)

    def add(self, dst: int, data: bytes | bytearray | memoryview) -> bool:
        """Hold a write; False when the block has no room for it (flush, then add)."""
        size = _padded(len(data))
        with self._lock:
            if len(self._writes) >= self.entries or self._bytes + size > self.capacity:
                return False
            self._writes.append(Write(dst, data))
            self._bytes += size
            return True

    def take(self, within: Callable[[int], bool] | None = None) -> list[Write]:
        """Remove and return the writes whose destination satisfies `within` (all of them when
        it is None), in arrival order."""
        taken: list[Write] = []
        kept: list[Write] = []
        with self._lock:
            if within is None:
                taken, self._writes = self._writes, []
            else:
                for w in self._writes:
                    (taken if within(w.dst) else kept).append(w)
                self._writes = kept
            self._bytes -= sum(_padded(len(w.data)) for w in taken)
            return taken

    def discard(self, lo: int, hi: int) -> int:
        """Drop the writes into [lo, hi) (a freed buffer); returns how many."""
        return len(self.take(lambda dst: lo <= dst < hi))


def pack(writes: list[Write], out: np.ndarray) -> int:
    """Lay `writes` out as the scatter kernel reads them into `out` (uint8, at least TABLE +
    CAPACITY bytes); returns the bytes used (the header alone when there are none)."""
    if len(writes) > ENTRIES:
        raise ValueError(f"{len(writes)} writes: a block holds {ENTRIES}")
    table = out[HEADER:TABLE].view(np.uint32).reshape(ENTRIES, 4)
    out[:HEADER].view(np.uint32)[:] = (len(writes), 0, 0, 0)
    at = TABLE
    for e, w in enumerate(writes):
        n = len(w.data)
        table[e] = (w.dst & 0xFFFFFFFF, w.dst >> 32, at, n)
        out[at : at + n] = np.frombuffer(w.data, dtype=np.uint8)
        at += _padded(n)
    return at if writes else HEADER


def unpack(block: np.ndarray) -> Iterator[tuple[int, int, int]]:
    """(destination, offset, size) of each write in a packed block (for checks and tests)."""
    count = int(block[:4].view(np.uint32)[0])
    table = block[HEADER:TABLE].view(np.uint32).reshape(ENTRIES, 4)
    for lo, hi, at, n in table[:count].tolist():
        yield lo | hi << 32, at, n


class ParamBlock:
    """One device block and its pinned host image, used on one stream: `load` copies writes in,
    `scatter` (a kernel on the same stream) puts them in place."""

    def __init__(self, backend: Any, stream: Any) -> None:
        self.backend = backend
        self.stream = stream
        size = TABLE + CAPACITY
        with backend.device:
            device = backend.allocate(size)
            if device is None:
                raise MemoryError("no GPU memory for the parameter block")
            self.device = device
            mem = backend.cp.cuda.alloc_pinned_memory(size)
            self.host = np.frombuffer(mem, dtype=np.uint8, count=size)
        self._scatter = backend.kernels.function("cpy", "rpc_scatter_params")

    def load(self, writes: list[Write]) -> None:
        """Copy `writes` into the device block, on the stream (the host image may change only
        after the stream has passed this copy)."""
        used = pack(writes, self.host)
        cp = self.backend.cp
        with self.backend.device, checked(cp.cuda.runtime.CUDARuntimeError, "parameter upload"):
            cp.cuda.runtime.memcpyAsync(
                int(self.device.data.ptr),
                int(self.host.ctypes.data),
                used,
                _H2D,
                self.stream.ptr,
            )

    def scatter(self) -> None:
        launch(self.backend, self._scatter, (ENTRIES,), (256,), (self.device,), self.stream)


class DeferredSink:
    """backend.HostSink of a small upload: the bytes are received into host memory and join
    the pending writes when complete (a receive that fails half-way leaves nothing behind)."""

    def __init__(self, backend: Any, dst: int, nbytes: int) -> None:
        self.backend = backend
        self.dst = dst
        self.nbytes = nbytes
        self._whole: bytearray | None = None

    def pieces(self) -> Iterator[memoryview]:
        data = bytearray(self.nbytes)
        if self.nbytes:
            yield memoryview(data)
            self.backend.defer(self.dst, data)

    def whole(self) -> memoryview:
        self._whole = bytearray(self.nbytes)
        return memoryview(self._whole)

    def commit(self) -> None:
        if self._whole is not None and self.nbytes:
            data, self._whole = self._whole, None
            self.backend.defer(self.dst, data)
