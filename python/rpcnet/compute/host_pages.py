"""Host memory helpers of the CPU backend's shared weights: page release, memcmp, windows."""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_MADV_DONTNEED = 4

_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.memcmp.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_LIBC.memcmp.restype = ctypes.c_int


def same_bytes(a: Any, b: Any) -> bool:
    """Whether two uint8 arrays hold the same bytes (memcmp; ctypes releases the GIL)."""
    n = int(a.nbytes)
    if n != int(b.nbytes):
        return False
    return n == 0 or _LIBC.memcmp(int(a.ctypes.data), int(b.ctypes.data), n) == 0


def drop_pages(array: Any, start: int, end: int) -> None:
    """Give the whole pages of array[start:end] back to the OS (MADV_DONTNEED): a shared range's
    own bytes are never read, and its pages must not stay resident."""
    base = int(array.ctypes.data)
    lo = (base + start + PAGE - 1) // PAGE * PAGE
    hi = (base + end) // PAGE * PAGE
    if hi > lo:
        _LIBC.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED)


class _Window:
    """`__array_interface__` of a uint8 array whose byte `start + i` is `held`'s byte `i`: a
    tensor at buffer offset `o` inside a shared range reads the content through the same offset
    `o` its kernels already use. Bytes below `start` are never addressed (a tensor is resolved
    to a window only when it lies wholly inside the range). Read-only: a kernel that would
    write through it fails instead of changing shared bytes."""

    def __init__(self, held: Any, start: int) -> None:
        self.held = held  # keeps the bytes alive as long as a view of the window lives
        self.__array_interface__ = {
            "data": (int(held.ctypes.data) - start, True),
            "shape": (start + int(held.nbytes),),
            "typestr": "|u1",
            "version": 3,
        }


def window(held: Any, start: int) -> Any:
    return np.asarray(_Window(held, start))
