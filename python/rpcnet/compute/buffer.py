"""Device memory holding tensors: the storage a graph tensor's bytes live in.

Every byte the server moves in or out of a buffer goes through these methods, which go through
the device's backend (`compute/backend.py`): the server never slices the raw array.

Ranges of a buffer may point at shared content (`compute/shared_content.py`): reads come from
the shared copy, and every write first gives the buffer its own copy of what it overlaps
(`own`: charged to the pool again, its pages backed again and the content copied back on the
device). The memory of whole pages (on a GPU: granules) that only shared ranges cover is given
back (`backend.drop_pages`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rpcnet.compute.errors import ComputeError

if TYPE_CHECKING:  # annotation only: device -> derived -> tensor -> buffer at run time
    from rpcnet.compute.backend import HostSink
    from rpcnet.compute.device_description import DeviceDescription
    from rpcnet.compute.shared_content import SharedContent
    from rpcnet.compute.shared_ranges import SharedRanges

_SERIALS = itertools.count(1)


class SharedMemoryFull(ComputeError):
    """A copy on write found no room in the device's memory: the writer's connection closes."""


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
    shares: SharedRanges | None = None  # ranges that point at shared content
    layout: int = 0  # rises whenever `shares` changes: plans resolved before are stale
    graph_written: bool = False  # a plan writes into it: its uploads are never shared

    def touched(self) -> None:
        self.generation += 1

    def release(self) -> None:
        """Give the memory back to the device (FREE_BUFFER, connection close)."""
        if self.array is not None:
            shares = self.shares
            refunded = shares.nbytes if shares is not None else 0
            self.device.release(self.size - refunded, self.array)
            self.array = None
            for share in shares or ():
                shares.remove(share)  # type: ignore[union-attr]
                share.content.release()

    # ------------------------------------------------------------------ shared ranges

    def resolve(self, offset: int, nbytes: int) -> Any:
        """The array a tensor at [offset, offset+nbytes) is read through, at that same offset:
        the buffer's own, or the shared content's window when the tensor lies inside a shared
        range. A plan resolves its tensors once, when it is compiled."""
        shares = self.shares
        if not shares or nbytes <= 0:
            return self.array
        share = shares.containing(offset, offset + nbytes)
        if share is not None:
            return share.window()
        if shares.overlapping(offset, offset + nbytes):
            raise ComputeError(f"tensor at {offset:#x}+{nbytes} overlaps a shared range partly")
        return self.array

    def own(self, offset: int, nbytes: int, keep: bool = True, partial_only: bool = False) -> None:
        """Copy on write: the shared ranges overlapping [offset, offset+nbytes) become this
        buffer's own bytes again, charged to the device's pool (`SharedMemoryFull` when it has
        no room). `keep=False`: the caller overwrites the whole span, so ranges inside it are
        not copied. `partial_only`: only ranges that stick out of the span."""
        shares = self.shares
        if not shares or nbytes <= 0:
            return
        end = offset + nbytes
        backend = self.device.backend
        for share in shares.overlapping(offset, end):
            inside = offset <= share.start and share.end <= end
            if partial_only and inside:
                continue
            pool = self.device.memory  # type: ignore[attr-defined]
            full = f"copy on write of {share.nbytes} shared bytes: device memory is full"
            if not pool.reserve(share.nbytes):
                raise SharedMemoryFull(f"{full} (--mem)")
            if not backend.restore_pages(self.array, share.start, share.end):
                pool.release(share.nbytes)
                raise SharedMemoryFull(full)
            if keep or not inside:
                backend.copy(self.array, share.start, share.content.array, 0, share.nbytes)
            shares.remove(share)
            share.content.release()
            self.layout += 1

    def attach(self, start: int, content: SharedContent) -> None:
        """Point [start, start+content.nbytes) at `content` (a user of it already counted):
        ranges inside are replaced, the buffer's whole pages (granules) that shared ranges
        cover go back to the OS (the GPU) and the bytes not held twice any more go back to the
        pool."""
        from rpcnet.compute.shared_ranges import Share, SharedRanges

        end = start + content.nbytes
        self.own(start, content.nbytes, partial_only=True)
        if self.shares is None:
            self.shares = SharedRanges()
        replaced = self.shares.overlapping(start, end)
        for share in replaced:
            self.shares.remove(share)
            share.content.release()
        self.shares.add(Share(start, content))
        self.device.memory.release(content.nbytes - sum(s.nbytes for s in replaced))  # type: ignore[attr-defined]
        # with the shares it touches end to end: a page (granule) across their edge is theirs
        self.device.backend.drop_pages(self.array, *self.shares.covered(start, end))
        self.layout += 1
        self.touched()

    def write_held(self, start: int, held: Any) -> None:
        """Copy held shared content (`SharedContent.array`) into [start, start+len) on the
        device."""
        nbytes = int(held.nbytes)
        self.own(start, nbytes, keep=False)
        self.device.backend.copy(self.array, start, held, 0, nbytes)

    def shared_at(self, offset: int, nbytes: int) -> bool:
        shares = self.shares
        return bool(shares) and bool(shares.overlapping(offset, offset + nbytes))  # type: ignore[union-attr]

    # ------------------------------------------------------------------ bytes in and out

    def host_sink(self, offset: int, nbytes: int) -> HostSink:
        """Where `nbytes` received for [offset, offset+nbytes) go (zero-copy on the CPU)."""
        self.own(offset, nbytes, keep=False)
        return self.device.backend.host_sink(self.array, offset, nbytes)

    def read(self, offset: int, nbytes: int) -> memoryview:
        """The bytes at [offset, offset+nbytes) on the host (zero-copy on the CPU, also from a
        shared range; a read across a range's edge is assembled in a copy, each part from
        where it lives: the buffer's own pages there may be gone)."""
        backend = self.device.backend
        if not self.shared_at(offset, nbytes):
            return backend.to_host(self.array, offset, nbytes)
        shares = self.shares
        assert shares is not None
        end = offset + nbytes
        share = shares.containing(offset, end)
        if share is not None:
            return backend.to_host(share.content.array, offset - share.start, nbytes)
        out = bytearray(nbytes)
        at = offset
        for share in [*shares.overlapping(offset, end), None]:
            lo = min(share.start, end) if share is not None else end
            if lo > at:  # the buffer's own bytes before this share
                out[at - offset : lo - offset] = backend.to_host(self.array, at, lo - at)
            if share is None:
                break
            lo, hi = max(offset, share.start), min(end, share.end)
            part = backend.to_host(share.content.array, lo - share.start, hi - lo)
            out[lo - offset : hi - offset] = part
            at = hi
        return memoryview(out)

    def write(self, offset: int, data: Any) -> None:
        self.own(offset, memoryview(data).nbytes, keep=False)
        self.device.backend.to_device(self.array, offset, data)

    def fill(self, offset: int, nbytes: int, value: int) -> None:
        if nbytes:
            self.own(offset, nbytes, keep=False)
            self.device.backend.fill(self.array, offset, nbytes, value)

    def copy_from(self, offset: int, src: DeviceBuffer, src_offset: int, nbytes: int) -> None:
        if not nbytes:
            return
        if src.shared_at(src_offset, nbytes):
            shares = src.shares
            assert shares is not None
            share = shares.containing(src_offset, src_offset + nbytes)
            if share is not None and src.device.backend is self.device.backend:
                held = share.content.array  # alive past the own() below (this buffer's share?)
                self.own(offset, nbytes, keep=False)
                at = src_offset - share.start
                self.device.backend.copy(self.array, offset, held, at, nbytes)
                return
            data = src.read(src_offset, nbytes)  # keeps its bytes alive past the own() below
            self.own(offset, nbytes, keep=False)
            self.device.backend.to_device(self.array, offset, data)
            return
        self.own(offset, nbytes, keep=False)
        if src.device.backend is self.device.backend:
            self.device.backend.copy(self.array, offset, src.array, src_offset, nbytes)
        else:  # between devices (cuda:0 -> cpu, cuda:0 -> cuda:1): through the host
            self.write(offset, src.read(src_offset, nbytes))

    def host_array(self, offset: int, nbytes: int) -> Any:
        """A writable host uint8 array of the region: the memory itself on host backends, else
        a copy that `write_back` stores."""
        self.own(offset, nbytes)  # the caller reads and writes it
        if self.device.backend.host_resident:
            return self.array[offset : offset + nbytes]
        import numpy as np

        return np.frombuffer(self.read(offset, nbytes), dtype=np.uint8).copy()

    def write_back(self, offset: int, host: Any) -> None:
        """Store what `host_array` returned, after it was changed (no-op on host backends)."""
        if not self.device.backend.host_resident:
            self.write(offset, host)
