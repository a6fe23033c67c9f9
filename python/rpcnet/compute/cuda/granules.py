"""A GPU buffer as a reserved address range backed granule by granule (CUDA VMM, `vmm.py`).

Each granule (2 MiB on current GPUs) has its own physical allocation, so the granules that
only shared ranges cover can be unmapped and their memory released, and mapped again (with
new, undefined memory) when a copy on write needs them. The address range never changes:
plans and captured graphs that point into the buffer stay valid.
"""

from __future__ import annotations

import threading

from rpcnet.compute.cuda.vmm import VmmDriver


class GranuleMap:
    """The physical side of one reserved range: a handle per granule, None where unmapped."""

    def __init__(self, driver: VmmDriver, device: int, base: int, size: int, granule: int):
        self.driver = driver
        self.device = device
        self.base = base
        self.size = size  # reserved: a multiple of `granule`
        self.granule = granule
        self.handles: list[int | None] = [None] * (size // granule)
        self._lock = threading.Lock()  # uploads identify on threads; finalizers run anywhere
        self._closed = False

    @property
    def mapped(self) -> int:
        """Granules backed by memory now."""
        return sum(h is not None for h in self.handles)

    def map(self, lo: int, hi: int) -> bool:
        """Back granules [lo, hi) (those not backed yet) with new memory; False when the GPU
        has none left (the ones mapped before that stay mapped)."""
        g, driver = self.granule, self.driver
        with self._lock:
            for i in range(lo, hi):
                if self.handles[i] is not None:
                    continue
                handle = driver.create(g, self.device)
                if handle is None:
                    return False
                ptr = self.base + i * g
                try:
                    driver.map(ptr, g, handle)
                except BaseException:
                    driver.release(handle)
                    raise
                self.handles[i] = handle
                driver.set_access(ptr, g, self.device)
        return True

    def unmap(self, lo: int, hi: int) -> None:
        """Give back the memory of granules [lo, hi) (the mapped ones)."""
        with self._lock:
            self._unmap(lo, hi)

    def _unmap(self, lo: int, hi: int) -> None:
        g = self.granule
        for i in range(lo, hi):
            handle = self.handles[i]
            if handle is None:
                continue
            self.driver.unmap(self.base + i * g, g)
            self.driver.release(handle)
            self.handles[i] = None

    def close(self) -> None:
        """Unmap and release everything, then the address range (the buffer is gone)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._unmap(0, len(self.handles))
            self.driver.free_range(self.base, self.size)


def reserve(driver: VmmDriver, device: int, nbytes: int, granule: int) -> GranuleMap | None:
    """A range of at least `nbytes`, every granule mapped; None when the GPU cannot hold it."""
    size = -(-max(nbytes, 1) // granule) * granule
    gm = GranuleMap(driver, device, driver.reserve(size, granule), size, granule)
    try:
        if gm.map(0, len(gm.handles)):
            return gm
    except BaseException:
        gm.close()
        raise
    gm.close()
    return None
