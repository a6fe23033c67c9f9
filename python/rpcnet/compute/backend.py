"""Device memory behind one interface: allocation, views, transfers, fills, copies.

`Backend` is the protocol every device implements; buffers, views and transfers go through it,
so the same session code serves host memory and GPU memory. `CpuBackend` (`CPU`) keeps buffers
as NumPy uint8 arrays in host memory; the GPU's is `CudaBackend` in `rpcnet.compute.cuda.device`
(CuPy arrays, its own streams).

A received payload goes through a `HostSink`: host memory that the socket (or a cache file)
fills, in pieces. On the CPU the one piece is the buffer region itself (`DirectSink`: zero-copy
receive); the GPU's sink hands out pinned staging slots and copies each to the device while the
next one arrives.

Shared weights (`compute/shared_content.py`) go through the backend too: `hold` makes the one
immutable copy of uploaded bytes, `same` compares held content with an upload, `window`
addresses held content by buffer offsets, and `drop_pages`/`restore_pages` give a shared
range's own memory back and take it again for a copy on write (host pages on the CPU, whole
granules of a reserved range on a GPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from rpcnet.compute import host_pages


class HostSink(Protocol):
    """Destination of `n` received bytes at a buffer offset.

    Either iterate `pieces()` and fill each yielded view completely before asking for the next
    (the bytes arrive in order), or fill `whole()` at once and call `commit()`.
    """

    nbytes: int

    def pieces(self) -> Iterator[memoryview]: ...
    def whole(self) -> memoryview: ...
    def commit(self) -> None: ...


class Backend(Protocol):
    """One device's memory operations; `mem` is what `allocate` returned."""

    name: str  # the kernel registry's device key: "cpu", "cuda"
    host_resident: bool  # mem is host memory: host views of it are zero-copy

    def allocate(self, nbytes: int) -> Any | None: ...
    def free(self, mem: Any) -> None: ...
    def view(
        self, mem: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any
    ) -> Any: ...
    def to_device(self, mem: Any, offset: int, data: Any) -> None: ...
    def to_host(self, mem: Any, offset: int, nbytes: int) -> memoryview: ...
    def fill(self, mem: Any, offset: int, nbytes: int, value: int) -> None: ...
    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None: ...
    def synchronize(self) -> None: ...
    def host_sink(self, mem: Any, offset: int, nbytes: int) -> HostSink: ...

    # shared weights
    shares: bool  # buffers of this device may point ranges at shared content

    def can_share(self, mem: Any) -> bool:
        """Whether the memory of a shared range of `mem` can be given back."""
        ...

    def drop_pages(self, mem: Any, start: int, end: int) -> None:
        """Give back the memory of the whole pages (granules) of mem[start:end]."""
        ...

    def restore_pages(self, mem: Any, start: int, end: int) -> bool:
        """Back mem[start:end] with memory again (its content is undefined until written);
        False when the device has none."""
        ...

    def hold(self, data: Any) -> Any | None:
        """The one read-only copy of host uint8 `data` as shared content; None: no room."""
        ...

    def same(self, held: Any, data: Any) -> bool:
        """Whether `held` (from `hold`) has the bytes of host uint8 `data`."""
        ...

    def window(self, held: Any, start: int) -> Any:
        """`held` as a uint8 array addressed by buffer offsets: its byte i at `start + i`."""
        ...


class DirectSink:
    """The buffer region itself: bytes land in device memory with no copy (host backends)."""

    def __init__(self, region: Any) -> None:
        self.region = region
        self.nbytes = len(region)

    def pieces(self) -> Iterator[memoryview]:
        if self.nbytes:
            yield memoryview(self.region)

    def whole(self) -> memoryview:
        return memoryview(self.region)

    def commit(self) -> None:
        pass


class CpuBackend:
    """Host memory as NumPy uint8 arrays; every operation is immediate."""

    name = "cpu"
    host_resident = True

    def allocate(self, nbytes: int) -> Any | None:
        try:
            return np.empty(nbytes, dtype=np.uint8)
        except MemoryError:
            return None

    def free(self, mem: Any) -> None:
        pass  # the array goes when its last view does

    def view(
        self, mem: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any
    ) -> Any:
        return np.ndarray(shape, dtype=dtype, buffer=mem, offset=offset, strides=strides)

    def to_device(self, mem: Any, offset: int, data: Any) -> None:
        src = np.frombuffer(data, dtype=np.uint8)
        mem[offset : offset + src.size] = src

    def to_host(self, mem: Any, offset: int, nbytes: int) -> memoryview:
        return memoryview(mem[offset : offset + nbytes])  # zero-copy

    def fill(self, mem: Any, offset: int, nbytes: int, value: int) -> None:
        mem[offset : offset + nbytes].fill(value)

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        dst[dst_offset : dst_offset + nbytes] = src[src_offset : src_offset + nbytes]

    def synchronize(self) -> None:
        pass

    def host_sink(self, mem: Any, offset: int, nbytes: int) -> HostSink:
        return DirectSink(mem[offset : offset + nbytes])

    # ---- shared weights: host pages ----------------------------------------------------
    shares = True

    def can_share(self, mem: Any) -> bool:
        return True

    def drop_pages(self, mem: Any, start: int, end: int) -> None:
        host_pages.drop_pages(mem, start, end)

    def restore_pages(self, mem: Any, start: int, end: int) -> bool:
        return True  # a dropped page comes back (zeroed) when it is written

    def hold(self, data: Any) -> Any | None:
        data.flags.writeable = False  # the received array itself: no copy
        return data

    def same(self, held: Any, data: Any) -> bool:
        return host_pages.same_bytes(held, data)

    def window(self, held: Any, start: int) -> Any:
        return host_pages.window(held, start)


CPU = CpuBackend()
