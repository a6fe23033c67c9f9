"""What storage and plans need to know of a device: its backend and its memory accounting.

`compute.device.Device` (the worker that runs plans) satisfies it; buffers, tensors and derived
caches depend on this description only, never on the worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rpcnet.compute.backend import Backend


class DerivedStore(Protocol):
    """The device's cache of values derived from stable tensors (compute.derived.DerivedCache);
    tensors and buffers are `Any` here, as this module sits below them."""

    def get(self, t: Any, kind: str, make: Callable[[], Any]) -> Any: ...

    def drop_buffer(self, buf: Any) -> None: ...


class DeviceDescription(Protocol):
    index: int
    name: str

    @property
    def backend(self) -> Backend: ...

    @property
    def derived(self) -> DerivedStore: ...

    @property
    def kind(self) -> str: ...

    def release(self, nbytes: int, array: Any, /) -> None:
        """Give back `nbytes` of the device's memory (the buffer holding `array` is freed)."""
