"""Per-connection buffer table: opaque handles and synthetic, never-reused base addresses."""

from __future__ import annotations

import secrets

from rpcnet.compute.buffer import DeviceBuffer
from rpcnet.compute.device import Device

PAGE = 4096
# Synthetic addresses start high and never reuse a range within a connection, so a stale
# address from a freed buffer can never alias a live one.
_BASE_START = 0x7F00_0000_0000
_BASE_LIMIT = 0xFFFF_F000_0000_0000


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


class BufferTable:
    def __init__(self) -> None:
        self._buffers: dict[int, DeviceBuffer] = {}
        # handle -> (base, size) of every live buffer: what a graph walk checks tensors against.
        self.regions: dict[int, tuple[int, int]] = {}
        self._next_base = _BASE_START + secrets.randbelow(1 << 20) * PAGE

    def __len__(self) -> int:
        return len(self._buffers)

    def __iter__(self):
        return iter(list(self._buffers.values()))

    def _new_handle(self) -> int:
        while True:
            handle = secrets.randbits(64)
            if handle and handle not in self._buffers:
                return handle

    def allocate(self, device: Device, size: int) -> DeviceBuffer | None:
        """A new buffer, or None when the device has no room (the client sees an alloc failure)."""
        if size > _BASE_LIMIT - self._next_base:
            return None
        array = device.allocate(size)
        if array is None:
            return None
        base = 0
        if size:
            base = self._next_base
            self._next_base = align_up(base + size + PAGE, PAGE)
        buf = DeviceBuffer(self._new_handle(), device, base, size, array)
        self._buffers[buf.handle] = buf
        self.regions[buf.handle] = (base, size)
        return buf

    def get(self, handle: int) -> DeviceBuffer | None:
        return self._buffers.get(handle)

    def free(self, handle: int) -> DeviceBuffer | None:
        buf = self._buffers.pop(handle, None)
        self.regions.pop(handle, None)
        if buf is not None:
            buf.device.derived.drop_buffer(buf)
            buf.release()
        return buf

    def free_all(self) -> int:
        total = 0
        for handle in list(self._buffers):
            buf = self.free(handle)
            if buf is not None:
                total += buf.size
        return total

    @property
    def bytes_held(self) -> int:
        return sum(b.size for b in self._buffers.values())
