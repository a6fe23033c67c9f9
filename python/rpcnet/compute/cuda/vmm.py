"""CUDA virtual memory management: the driver calls behind a narrow interface.

A buffer that may share weights reserves its address range and maps physical memory granule
by granule (`compute/cuda/granules.py`), so that the granules of a shared range can be given
back. CuPy does not wrap these driver calls (cuMemAddressReserve, cuMemCreate, cuMemMap, ...),
so `CtypesVmm` calls libcuda.so.1 through ctypes. A stand-in CuPy (tests) brings its own
implementation of `VmmDriver` as `cupy.vmm_driver()`.

Errors become the backend's own: an out-of-memory `create` returns None (like a failed
cudaMalloc), anything else raises what `errors.classify` says (a sticky error exits the
server).
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Protocol

from rpcnet.compute.cuda.errors import classify

log = logging.getLogger("rpcnet.cuda")

CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class VmmDriver(Protocol):
    """The VMM calls a granule-mapped buffer needs, on one process's driver."""

    def supported(self, device: int) -> bool:
        """Whether `device` supports virtual memory management."""
        ...

    def granularity(self, device: int) -> int:
        """The size and alignment every reservation, handle and mapping is a multiple of."""
        ...

    def reserve(self, nbytes: int, alignment: int) -> int:
        """A new virtual address range of `nbytes`, nothing mapped."""
        ...

    def free_range(self, ptr: int, nbytes: int) -> None: ...

    def create(self, nbytes: int, device: int) -> int | None:
        """A physical allocation handle on `device`; None when its memory is full."""
        ...

    def release(self, handle: int) -> None: ...

    def map(self, ptr: int, nbytes: int, handle: int) -> None: ...

    def unmap(self, ptr: int, nbytes: int) -> None: ...

    def set_access(self, ptr: int, nbytes: int, device: int) -> None:
        """Let `device` read and write the mapped range (a new mapping has no access)."""
        ...


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class _AllocationProp(ctypes.Structure):
    """CUmemAllocationProp."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    ]


class _AccessDesc(ctypes.Structure):
    """CUmemAccessDesc."""

    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def _prop(device: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location = _Location(CU_MEM_LOCATION_TYPE_DEVICE, device)
    return prop


class CtypesVmm:
    """VmmDriver on libcuda.so.1 (the runtime CuPy uses has initialized the driver)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        u64, size_t = ctypes.c_uint64, ctypes.c_size_t
        lib.cuDeviceGetAttribute.argtypes = (
            ctypes.POINTER(ctypes.c_int),
            ctypes.c_int,
            ctypes.c_int,
        )
        lib.cuMemGetAllocationGranularity.argtypes = (
            ctypes.POINTER(size_t),
            ctypes.POINTER(_AllocationProp),
            ctypes.c_int,
        )
        lib.cuMemAddressReserve.argtypes = (ctypes.POINTER(u64), size_t, size_t, u64, u64)
        lib.cuMemAddressFree.argtypes = (u64, size_t)
        lib.cuMemCreate.argtypes = (
            ctypes.POINTER(u64),
            size_t,
            ctypes.POINTER(_AllocationProp),
            u64,
        )
        lib.cuMemRelease.argtypes = (u64,)
        lib.cuMemMap.argtypes = (u64, size_t, size_t, u64, u64)
        lib.cuMemUnmap.argtypes = (u64, size_t)
        lib.cuMemSetAccess.argtypes = (u64, size_t, ctypes.POINTER(_AccessDesc), size_t)

    @classmethod
    def open(cls) -> CtypesVmm | None:
        """The driver library, or None where it cannot be loaded."""
        try:
            return cls(ctypes.CDLL("libcuda.so.1"))
        except OSError:
            return None

    def _check(self, status: int, what: str) -> None:
        if status != CUDA_SUCCESS:
            raise classify(status, what)

    def supported(self, device: int) -> bool:
        value = ctypes.c_int(0)
        attr = CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        status = self.lib.cuDeviceGetAttribute(ctypes.byref(value), attr, device)
        return status == CUDA_SUCCESS and value.value != 0

    def granularity(self, device: int) -> int:
        out, prop = ctypes.c_size_t(0), _prop(device)
        status = self.lib.cuMemGetAllocationGranularity(
            ctypes.byref(out), ctypes.byref(prop), CU_MEM_ALLOC_GRANULARITY_MINIMUM
        )
        self._check(status, "cuMemGetAllocationGranularity")
        return int(out.value)

    def reserve(self, nbytes: int, alignment: int) -> int:
        ptr = ctypes.c_uint64(0)
        self._check(
            self.lib.cuMemAddressReserve(ctypes.byref(ptr), nbytes, alignment, 0, 0),
            "cuMemAddressReserve",
        )
        return int(ptr.value)

    def free_range(self, ptr: int, nbytes: int) -> None:
        self._check(self.lib.cuMemAddressFree(ptr, nbytes), "cuMemAddressFree")

    def create(self, nbytes: int, device: int) -> int | None:
        handle, prop = ctypes.c_uint64(0), _prop(device)
        status = self.lib.cuMemCreate(ctypes.byref(handle), nbytes, ctypes.byref(prop), 0)
        if status == CUDA_ERROR_OUT_OF_MEMORY:
            return None
        self._check(status, "cuMemCreate")
        return int(handle.value)

    def release(self, handle: int) -> None:
        self._check(self.lib.cuMemRelease(handle), "cuMemRelease")

    def map(self, ptr: int, nbytes: int, handle: int) -> None:
        self._check(self.lib.cuMemMap(ptr, nbytes, 0, handle, 0), "cuMemMap")

    def unmap(self, ptr: int, nbytes: int) -> None:
        self._check(self.lib.cuMemUnmap(ptr, nbytes), "cuMemUnmap")

    def set_access(self, ptr: int, nbytes: int, device: int) -> None:
        desc = _AccessDesc(
            _Location(CU_MEM_LOCATION_TYPE_DEVICE, device), CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        )
        self._check(self.lib.cuMemSetAccess(ptr, nbytes, ctypes.byref(desc), 1), "cuMemSetAccess")


def load(cupy: Any, device: int) -> tuple[VmmDriver, int] | None:
    """The VMM driver and its granularity for `device`, or None where the device (or the
    driver library) does not support it: buffers are then one cudaMalloc each and hold their
    own bytes."""
    hook = getattr(cupy, "vmm_driver", None)  # a stand-in CuPy's own
    driver: VmmDriver | None = hook() if hook is not None else CtypesVmm.open()
    if driver is None or not driver.supported(device):
        return None
    granule = driver.granularity(device)
    try:
        _round_trip(driver, device, granule)
    except Exception as exc:  # a driver that refuses the calls: plain allocations, no sharing
        log.warning(
            "cuda:%d: virtual memory management unusable (%s); weights not shared", device, exc
        )
        return None
    return driver, granule


def _round_trip(driver: VmmDriver, device: int, granule: int) -> None:
    """One granule reserved, backed, made accessible and given back: every call a granular
    buffer makes, tried once before any buffer depends on them."""
    ptr = driver.reserve(granule, granule)
    try:
        handle = driver.create(granule, device)
        if handle is None:
            return  # memory full right now: the calls themselves are not in question
        try:
            driver.map(ptr, granule, handle)
            driver.set_access(ptr, granule, device)
            driver.unmap(ptr, granule)
        finally:
            driver.release(handle)
    finally:
        driver.free_range(ptr, granule)
