"""Caches of data derived from weights (dequantized f32 copies), invalidated by any write.

Every buffer carries a `generation` that rises on each write to it: client commands (SET_TENSOR,
SET_TENSOR_2D, MEMSET, BUFFER_CLEAR, COPY_TENSOR, hash-cache fills) and graph runs whose nodes
write into it. An entry is valid only while its buffer's generation is the one it was made at.
Entries count against the device's memory pool and are bounded; the least recently used go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from rpcnet.compute.buffer import DeviceBuffer
from rpcnet.compute.memory import MemoryPool
from rpcnet.compute.tensor import Tensor


class DerivedCache:
    def __init__(self, pool: MemoryPool, limit: int) -> None:
        self.pool = pool
        self.limit = limit
        self.held = 0
        self._entries: OrderedDict[tuple, tuple[int, Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _key(t: Tensor, kind: str) -> tuple:
        return (id(t.buffer), t.offset, t.type, t.ne, t.nb, kind)

    def get(self, t: Tensor, kind: str, make: Callable[[], Any]) -> Any:
        """The cached derived array of `t`, making (and keeping, if room) it when stale."""
        buf = t.buffer
        if buf is None:
            return make()
        key = self._key(t, kind)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0] == buf.generation:
                self._entries.move_to_end(key)
                return hit[1]
            if hit is not None:
                self._drop(key)
        generation = buf.generation
        value = make()
        size = int(value.nbytes)
        with self._lock:
            if self._make_room(size) and self.pool.reserve(size):
                self._entries[key] = (generation, value, size)
                self.held += size
                buf.derived_keys.add(key)
        return value

    def _make_room(self, size: int) -> bool:
        if size > self.limit:
            return False
        while self._entries and (self.held + size > self.limit or self.pool.free < size):
            self._drop(next(iter(self._entries)))
        return True

    def _drop(self, key: tuple) -> None:
        _, _, size = self._entries.pop(key)
        self.held -= size
        self.pool.release(size)

    def drop_buffer(self, buf: DeviceBuffer) -> None:
        """Release everything derived from a buffer that is being freed."""
        with self._lock:
            for key in buf.derived_keys:
                if key in self._entries:
                    self._drop(key)
            buf.derived_keys.clear()

    def clear(self) -> None:
        with self._lock:
            for key in list(self._entries):
                self._drop(key)
