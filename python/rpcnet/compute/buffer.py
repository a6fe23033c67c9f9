"""Device memory holding tensors: the storage a graph tensor's bytes live in.

Every byte the server moves in or out of a buffer goes through these methods, which go through
the device's backend (`compute/backend.py`): the server never slices the raw array.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotation only: device -> derived -> tensor -> buffer at run time
    from rpcnet.compute.backend import HostSink
    from rpcnet.compute.device_description import DeviceDescription

_SERIALS = itertools.count(1)


@dataclass(eq=False)
class DeviceBuffer:
    handle: int
    device: DeviceDescription
    base: int
    size: int
    array: Any  # uint8 device array of `size` bytes (what the backend allocated)
    generation: int = 0  # rises on every write; derived caches compare against it
    derived_keys: set = field(default_factory=set)
    # never reused in this process (handles are per connection, ids of freed objects recur)
    serial: int = field(default_factory=lambda: next(_SERIALS))

    def touched(self) -> None:
        self.generation += 1

    def release(self) -> None:
        """Give the memory back to the device (FREE_BUFFER, connection close)."""
        if self.array is not None:
            self.device.release(self.size, self.array)
            self.array = None

    def host_sink(self, offset: int, nbytes: int) -> HostSink:
        """Where `nbytes` received for [offset, offset+nbytes) go (zero-copy on the CPU)."""
        return self.device.backend.host_sink(self.array, offset, nbytes)

    def read(self, offset: int, nbytes: int) -> memoryview:
        """The bytes at [offset, offset+nbytes) on the host (zero-copy on the CPU)."""
        return self.device.backend.to_host(self.array, offset, nbytes)

    def write(self, offset: int, data: Any) -> None:
        self.device.backend.to_device(self.array, offset, data)

    def fill(self, offset: int, nbytes: int, value: int) -> None:
        if nbytes:
            self.device.backend.fill(self.array, offset, nbytes, value)

    def copy_from(self, offset: int, src: DeviceBuffer, src_offset: int, nbytes: int) -> None:
        if not nbytes:
            return
        if src.device.backend is self.device.backend:
            self.device.backend.copy(self.array, offset, src.array, src_offset, nbytes)
        else:  # between devices (cuda:0 -> cpu, cuda:0 -> cuda:1): through the host
            self.write(offset, src.read(src_offset, nbytes))

    def host_array(self, offset: int, nbytes: int) -> Any:
        """A writable host uint8 array of the region: the memory itself on host backends, else
        a copy that `write_back` stores."""
        if self.device.backend.host_resident:
            return self.array[offset : offset + nbytes]
        import numpy as np

        return np.frombuffer(self.read(offset, nbytes), dtype=np.uint8).copy()

    def write_back(self, offset: int, host: Any) -> None:
        """Store what `host_array` returned, after it was changed (no-op on host backends)."""
        if not self.device.backend.host_resident:
            self.write(offset, host)
