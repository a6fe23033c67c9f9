"""Device memory holding tensors: the storage a graph tensor's bytes live in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotation only: device -> derived -> tensor -> buffer at run time
    from rpcnet.compute.device import Device


@dataclass(eq=False)
class DeviceBuffer:
    handle: int
    device: Device
    base: int
    size: int
    array: Any  # uint8 device array of `size` bytes
    generation: int = 0  # rises on every write; derived caches compare against it
    derived_keys: set = field(default_factory=set)

    def touched(self) -> None:
        self.generation += 1

    def region(self, offset: int, length: int) -> Any:
        return self.array[offset : offset + length]
