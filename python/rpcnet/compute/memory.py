"""Device memory accounting: one pool per device, shared by buffers and derived caches."""

from __future__ import annotations

import threading


class MemoryPool:
    """Capacity bookkeeping for one device; thread-safe because workers may cache derived data."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int) -> bool:
        with self._lock:
            if nbytes > self.capacity - self._held:
                return False
            self._held += nbytes
            return True

    def charge(self, nbytes: int) -> None:
        """Count `nbytes` even past capacity: bytes that move from one holder to another (a
        buffer range's bytes refunded as they become one shared copy) are never refused."""
        with self._lock:
            self._held += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self._held -= nbytes
            assert self._held >= 0, "memory pool released more than it held"

    @property
    def held(self) -> int:
        return self._held

    @property
    def free(self) -> int:
        return max(0, self.capacity - self._held)
