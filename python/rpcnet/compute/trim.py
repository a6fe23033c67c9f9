"""Give freed heap memory back to the OS.

Device buffers, derived copies and NumPy temporaries below glibc's mmap threshold (which rises
up to 32 MiB after large frees) live in malloc arenas; freeing them keeps the pages mapped, so
RSS stays near its peak after the last client has left. `malloc_trim(0)` releases the free
pages of every arena (glibc ≥ 2.8 also frees the middle of heaps with MADV_DONTNEED).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
from collections.abc import Callable

log = logging.getLogger("rpcnet.compute")


def _load_malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim  # glibc only; musl and others lack it
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_MALLOC_TRIM = _load_malloc_trim()


def release_free_memory() -> bool:
    """Collect unreachable cycles (plans, closures) and trim the malloc heaps; True if trimmed."""
    gc.collect()
    if _MALLOC_TRIM is None:
        return False
    return bool(_MALLOC_TRIM(0))
