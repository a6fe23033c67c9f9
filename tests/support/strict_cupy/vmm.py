"""CUDA virtual memory management on the strict stand-in: `rpcnet.compute.cuda.vmm.VmmDriver`
with the driver's rules, refused (a `VmmMisuse`, recorded as a violation) when broken.

- a reservation, a physical handle, a mapping and an unmap are whole multiples of the
  granularity, at granule-aligned addresses; a mapping lies inside one reservation;
- a handle is mapped whole (offset 0) at one address at a time; mapping over a mapped granule
  is an error, and so is unmapping a range that is not exactly whole mappings;
- a new mapping has no access until `set_access`: any use of it before is a `MemoryFault`, as
  is any use of an unmapped address (the timeline's `find` asks `mapped`);
- a handle's memory lives while it is mapped or not released (`timeline.physical`, which
  memGetInfo reports); a reservation is freed exactly, with nothing mapped in it.

Bytes live at their virtual address (the reservation's NumPy bytes). An unmapped granule is
filled with POISON (a kernel reading past its first pointer reads garbage, not old bytes); a
handle keeps its bytes while unmapped, and a new handle's memory is FRESH, never zeros: a copy
on write that forgets to copy the content back shows.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from support.strict_cupy.timeline import Allocation, StrictViolation

if TYPE_CHECKING:
    from support.strict_cupy.api import StrictCupy

GRANULE = 2 << 20
POISON = 0xFD
FRESH = 0xCB


class VmmMisuse(StrictViolation):
    """A VMM call the driver refuses (CUDA_ERROR_INVALID_VALUE and friends)."""


@dataclass
class _Handle:
    size: int
    data: np.ndarray | None = None  # its bytes while unmapped (None: never written)
    at: int | None = None  # the address it is mapped at
    released: bool = False


@dataclass
class _Reservation:
    base: int
    size: int
    raw: np.ndarray
    granule: int
    handles: list[int | None] = field(default_factory=list)  # per granule: mapped handle
    access: list[bool] = field(default_factory=list)  # per granule: set_access done

    def granules(self, addr: int, nbytes: int) -> range:
        lo = (addr - self.base) // self.granule
        return range(lo, (addr + nbytes - self.base - 1) // self.granule + 1)

    def accessible(self, addr: int, nbytes: int) -> bool:
        return all(self.access[i] for i in self.granules(addr, nbytes))


class StrictVmm:
    """The VMM calls of one stand-in machine (every GPU the same granularity)."""

    def __init__(self, owner: StrictCupy, granularity: int = GRANULE) -> None:
        self.owner = owner
        self.granule = granularity
        self._reservations: dict[int, _Reservation] = {}
        self._handles: dict[int, _Handle] = {}
        self._ids = itertools.count(0x1000)
        self.calls: list[str] = []  # the names of the calls made, in order

    # ---- what tests look at ------------------------------------------------------------
    def reservation(self, addr: int) -> _Reservation | None:
        for res in self._reservations.values():
            if res.base <= addr < res.base + res.size:
                return res
        return None

    def mapped_granules(self, addr: int) -> list[bool]:
        """Per granule of the reservation at `addr`: whether memory backs it."""
        res = self.reservation(addr)
        assert res is not None, f"{addr:#x} is in no reservation"
        return [h is not None for h in res.handles]

    # ---- VmmDriver -----------------------------------------------------------------------
    def _fail(self, what: str) -> VmmMisuse:
        return self.owner.timeline.fail(VmmMisuse(what))  # type: ignore[return-value]

    def _whole(self, what: str, addr: int, nbytes: int) -> None:
        g = self.granule
        if nbytes <= 0 or nbytes % g or addr % g:
            raise self._fail(f"{what}: {addr:#x}+{nbytes:#x} is not whole granules of {g:#x}")

    def supported(self, device: int) -> bool:
        return True

    def granularity(self, device: int) -> int:
        return self.granule

    def reserve(self, nbytes: int, alignment: int) -> int:
        self.calls.append("reserve")
        self.owner.timeline.forbid_in_capture("cuMemAddressReserve")
        self._whole("cuMemAddressReserve", 0, nbytes)
        if alignment % self.granule:
            raise self._fail(f"cuMemAddressReserve: alignment {alignment:#x}")
        raw = self.owner.buffers.allocate(nbytes, align=self.granule)
        raw[:] = POISON
        base = int(raw.ctypes.data)
        n = nbytes // self.granule
        res = _Reservation(base, nbytes, raw, self.granule, [None] * n, [False] * n)
        self._reservations[base] = res
        self.owner.timeline.register(Allocation(base, nbytes, raw, "device", mapped=res.accessible))
        return base

    def free_range(self, ptr: int, nbytes: int) -> None:
        self.calls.append("free_range")
        res = self._reservations.get(ptr)
        if res is None or res.size != nbytes:
            raise self._fail(f"cuMemAddressFree: {ptr:#x}+{nbytes:#x} is not a reservation")
        if any(h is not None for h in res.handles):
            raise self._fail("cuMemAddressFree: the range still has mappings")
        del self._reservations[ptr]
        self.owner.timeline.unregister(ptr)

    def create(self, nbytes: int, device: int) -> int | None:
        self.calls.append("create")
        self.owner.timeline.forbid_in_capture("cuMemCreate")
        self._whole("cuMemCreate", 0, nbytes)
        tl = self.owner.timeline
        if tl.device_bytes() + nbytes > self.owner.total:
            return None  # CUDA_ERROR_OUT_OF_MEMORY
        handle = next(self._ids)
        self._handles[handle] = _Handle(nbytes)
        with tl.lock:
            tl.physical += nbytes
        return handle

    def _live(self, what: str, handle: int) -> _Handle:
        h = self._handles.get(handle)
        if h is None or h.released:
            raise self._fail(f"{what}: handle {handle:#x} is not a live allocation")
        return h

    def release(self, handle: int) -> None:
        self.calls.append("release")
        h = self._live("cuMemRelease", handle)
        h.released = True
        if h.at is None:
            self._forget(handle)

    def _forget(self, handle: int) -> None:
        h = self._handles.pop(handle)
        tl = self.owner.timeline
        with tl.lock:
            tl.physical -= h.size

    def _reservation_of(self, what: str, ptr: int, nbytes: int) -> _Reservation:
        res = self.reservation(ptr)
        if res is None or ptr + nbytes > res.base + res.size:
            raise self._fail(f"{what}: {ptr:#x}+{nbytes:#x} is not inside one reservation")
        return res

    def map(self, ptr: int, nbytes: int, handle: int) -> None:
        self.calls.append("map")
        self.owner.timeline.forbid_in_capture("cuMemMap")
        self._whole("cuMemMap", ptr, nbytes)
        h = self._live("cuMemMap", handle)
        if h.at is not None:
            raise self._fail(f"cuMemMap: handle {handle:#x} is mapped at {h.at:#x} already")
        if nbytes != h.size:
            raise self._fail(f"cuMemMap: {nbytes:#x} bytes of a handle of {h.size:#x}")
        res = self._reservation_of("cuMemMap", ptr, nbytes)
        span = res.granules(ptr, nbytes)
        if any(res.handles[i] is not None for i in span):
            raise self._fail(f"cuMemMap: {ptr:#x}+{nbytes:#x} is mapped already")
        for i in span:
            res.handles[i] = handle
        h.at = ptr
        view = res.raw[ptr - res.base : ptr - res.base + nbytes]
        view[:] = h.data if h.data is not None else FRESH

    def set_access(self, ptr: int, nbytes: int, device: int) -> None:
        self.calls.append("set_access")
        self._whole("cuMemSetAccess", ptr, nbytes)
        res = self._reservation_of("cuMemSetAccess", ptr, nbytes)
        span = res.granules(ptr, nbytes)
        if any(res.handles[i] is None for i in span):
            raise self._fail(f"cuMemSetAccess: {ptr:#x}+{nbytes:#x} is not mapped")
        for i in span:
            res.access[i] = True

    def unmap(self, ptr: int, nbytes: int) -> None:
        self.calls.append("unmap")
        self.owner.timeline.forbid_in_capture("cuMemUnmap")
        self._whole("cuMemUnmap", ptr, nbytes)
        res = self._reservation_of("cuMemUnmap", ptr, nbytes)
        span = res.granules(ptr, nbytes)
        handles = {res.handles[i] for i in span}
        if None in handles:
            raise self._fail(f"cuMemUnmap: {ptr:#x}+{nbytes:#x} is not all mapped")
        for handle in handles:
            assert handle is not None
            h = self._handles[handle]
            if not (ptr <= h.at < ptr + nbytes and h.at + h.size <= ptr + nbytes):  # type: ignore[operator]
                raise self._fail(f"cuMemUnmap: {ptr:#x}+{nbytes:#x} cuts a mapping in part")
        with self.owner.timeline.lock:
            for i in span:
                res.handles[i] = None
                res.access[i] = False
            for handle in handles:
                assert handle is not None
                h = self._handles[handle]
                at = h.at - res.base  # type: ignore[operator]
                h.data = res.raw[at : at + h.size].copy() if not h.released else None
                res.raw[at : at + h.size] = POISON
                h.at = None
                if h.released:
                    self._forget(handle)


class UnownedMemory:
    """cupy.cuda.UnownedMemory over device memory the caller allocated (a VMM reservation):
    `owner` is kept alive with it."""

    def __init__(self, cupy: StrictCupy, ptr: int, size: int, owner: Any, device_id: int = -1):
        vmm = cupy.vmm
        res = vmm.reservation(ptr) if vmm is not None else None
        if res is None or ptr + size > res.base + res.size:
            raise cupy.timeline.fail(
                StrictViolation(f"UnownedMemory {ptr:#x}+{size:#x}: not a reserved range")
            )
        self.raw = res.raw[ptr - res.base : ptr - res.base + size]
        self.ptr = ptr
        self.size = size
        self.owner = owner
        import weakref

        cupy.memories[ptr] = weakref.ref(self)
