"""Pinned host staging for uploads/downloads: bounded, double-buffered, chunked.

An upload of N bytes is cut into chunks of at most `chunk` bytes. Chunk i is received into
pinned slot i % 2 while chunk i-1 is still being copied to the device from the other slot; a slot
is reused only after the copy out of it has finished (its event). So at most 2 * chunk bytes of
pinned memory are held per transfer, and the socket and the copy engine overlap.

The copy engine is behind `Copier`, so this bookkeeping runs (and is tested) without a GPU; the
CuPy implementation is `rpcnet.compute.cuda.device.CupyCopier`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

DEFAULT_CHUNK = 8 << 20  # 8 MiB: large enough to reach copy-engine speed, small to overlap


def chunks(total: int, chunk: int) -> Iterator[tuple[int, int]]:
    """(offset, size) pieces covering [0, total), each at most `chunk` bytes."""
    if chunk <= 0:
        raise ValueError("chunk must be positive")
    offset = 0
    while offset < total:
        size = min(chunk, total - offset)
        yield offset, size
        offset += size


class Copier(Protocol):
    def pinned(self, nbytes: int) -> memoryview: ...
    def to_device_async(self, dst: int, src: memoryview, nbytes: int) -> object: ...
    def to_host_async(self, dst: memoryview, src: int, nbytes: int) -> object: ...
    def wait(self, token: object) -> None: ...


class Staging:
    """Two pinned slots of `chunk` bytes, reused across transfers (one transfer at a time)."""

    def __init__(self, copier: Copier, chunk: int = DEFAULT_CHUNK) -> None:
        self.copier = copier
        self.chunk = chunk
        self.slots = [copier.pinned(chunk), copier.pinned(chunk)]
        self.pending: list[object | None] = [None, None]

    @property
    def pinned_bytes(self) -> int:
        return 2 * self.chunk

    def _take(self, slot: int) -> memoryview:
        token = self.pending[slot]
        if token is not None:
            self.copier.wait(token)
            self.pending[slot] = None
        return self.slots[slot]

    def upload(self, dst: int, total: int, fill: Callable[[memoryview], None]) -> None:
        """Copy `total` bytes to device address `dst`; `fill(view)` must fill the whole view
        (e.g. socket.recv_into until full) with the next bytes of the payload."""
        for i, (offset, size) in enumerate(chunks(total, self.chunk)):
            slot = i % 2
            view = self._take(slot)[:size]
            fill(view)
            self.pending[slot] = self.copier.to_device_async(dst + offset, view, size)
        self.drain()

    def upload_pieces(self, dst: int, total: int) -> Iterator[memoryview]:
        """`upload` turned inside out for an event loop: yields the slot view each chunk is to be
        received into; resuming the generator starts that chunk's copy to the device. When it is
        exhausted every copy has finished."""
        for i, (offset, size) in enumerate(chunks(total, self.chunk)):
            slot = i % 2
            view = self._take(slot)[:size]
            yield view
            self.pending[slot] = self.copier.to_device_async(dst + offset, view, size)
        self.drain()

    def download(self, src: int, total: int, emit: Callable[[memoryview], None]) -> None:
        """Copy `total` bytes from device address `src`, handing each chunk to `emit` in order.
        The copy of chunk i+1 is started before chunk i is emitted."""
        pieces = list(chunks(total, self.chunk))
        if not pieces:
            return
        for i, (offset, size) in enumerate(pieces[:2]):
            view = self._take(i % 2)[:size]
            self.pending[i % 2] = self.copier.to_host_async(view, src + offset, size)
        for i in range(len(pieces)):
            slot = i % 2
            view = self._take(slot)[: pieces[i][1]]
            emit(view)
            nxt = i + 2
            if nxt < len(pieces):
                offset, size = pieces[nxt]
                self.pending[slot] = self.copier.to_host_async(
                    self.slots[slot][:size], src + offset, size
                )

    def drain(self) -> None:
        for slot in (0, 1):
            self._take(slot)


class StagingPool:
    """Staging slot pairs for concurrent transfers (one per connection mid-transfer): a transfer
    takes a pair for its duration; at most `keep` idle pairs stay allocated."""

    def __init__(self, copier: Copier, chunk: int = DEFAULT_CHUNK, keep: int = 2) -> None:
        self.copier = copier
        self.chunk = chunk
        self.keep = keep
        self._idle: list[Staging] = []
        self.in_use = 0
        self._lock = threading.Lock()  # cache hits upload from a thread

    @property
    def pinned_bytes(self) -> int:
        return (len(self._idle) + self.in_use) * 2 * self.chunk

    def acquire(self) -> Staging:
        with self._lock:
            self.in_use += 1
            if self._idle:
                return self._idle.pop()
        return Staging(self.copier, self.chunk)

    def release(self, staging: Staging) -> None:
        with self._lock:
            self.in_use -= 1
            if len(self._idle) < self.keep:
                self._idle.append(staging)


class StagedSink:
    """backend.HostSink of a staged backend: payload pieces land in the pinned slots and are
    copied to device address `dst` while the next piece arrives.

    `whole()` (a cache-file read, verified before use) is a plain host buffer of all the bytes,
    uploaded through the slots by `commit()`.
    """

    def __init__(self, pool: StagingPool, dst: int, nbytes: int) -> None:
        self.pool = pool
        self.dst = dst
        self.nbytes = nbytes
        self._whole: Any = None

    def pieces(self) -> Iterator[memoryview]:
        staging = self.pool.acquire()
        try:
            yield from staging.upload_pieces(self.dst, self.nbytes)
        finally:
            staging.drain()  # also when the receive failed half-way: no copy left in flight
            self.pool.release(staging)

    def whole(self) -> memoryview:
        self._whole = bytearray(self.nbytes)
        return memoryview(self._whole)

    def commit(self) -> None:
        if self._whole is None:
            return
        data, self._whole = memoryview(self._whole), None
        pos = 0

        def fill(view: memoryview) -> None:
            nonlocal pos
            view[:] = data[pos : pos + len(view)]
            pos += len(view)

        staging = self.pool.acquire()
        try:
            staging.upload(self.dst, self.nbytes, fill)
        finally:
            self.pool.release(staging)
