"""Uploads that may be held once (compute/shared_content.py), as the session receives them.

A SET_TENSOR or a cache-answered SET_TENSOR_HASH of at least SHARE_MIN bytes into a buffer that
no plan writes (and whose memory can be given back: any CPU buffer, a GPU buffer of reserved
granules) is received into a fresh host array instead of the buffer; when the bytes are complete
the device's store either finds the equal content it already holds (the array is then dropped:
on a GPU those bytes never cross the bus) or keeps them as a new content (on the CPU the array
itself, on a GPU one device allocation), and the buffer range points at it. A
SET_TENSOR_HASH whose FNV-1a names a held content that the client trusts (the same origins its
cache lookups see) is answered from memory: no bytes are read at all.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from rpcnet.compute.backend import DirectSink
from rpcnet.compute.buffer import DeviceBuffer
from rpcnet.compute.shared_content import (
    SHARE_MIN,
    SharedContent,
    enabled,
    store_of,
)


def shareable(buf: DeviceBuffer, nbytes: int) -> bool:
    """Whether an upload of `nbytes` into `buf` goes through the shared store."""
    return (
        nbytes >= SHARE_MIN
        and not buf.graph_written
        and enabled()
        and buf.array is not None
        and buf.device.backend.can_share(buf.array)
    )


class HostBudget:
    """Bytes of uploads a GPU device's clients may have in host memory at once, waiting to be
    identified: one that does not fit goes straight to the device and keeps its own bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.used + nbytes > self.limit:
                return False
            self.used += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.used -= nbytes


def _ram() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return 8 << 30


HOST_IN_FLIGHT = HostBudget(_ram() // 8)


def fresh(buf: DeviceBuffer, nbytes: int) -> Any | None:
    """A new uint8 array to receive an upload into (None: no memory, use the buffer). Its own
    anonymous mapping, so that dropping it (its bytes were already held) gives the pages back
    to the OS at once: malloc would keep them in its heap for the next allocation. For a GPU
    the array only waits to be identified: such arrays together stay within HOST_IN_FLIGHT."""
    budget = None if buf.device.backend.host_resident else HOST_IN_FLIGHT
    if budget is not None and not budget.take(nbytes):
        return None
    try:
        array = np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE), dtype=np.uint8)
    except (OSError, ValueError, MemoryError):
        array = None
    if budget is not None:
        if array is None:
            budget.give(nbytes)
        else:  # given back when the array goes (identified, or the connection closed)
            weakref.finalize(array, budget.give, nbytes)
    return array


def settle(
    buf: DeviceBuffer,
    start: int,
    array: Any,
    strong: bytes | None = None,
    fnv: int | None = None,
    origin: str | None = None,
) -> None:
    """`array` (complete, verified) is the new content of buf[start:start+len]: held once
    with equal bytes, or kept as a new content (or, when the device has no room for one,
    written into the buffer)."""
    content = store_of(buf.device).adopt(array, strong, fnv, origin)
    if content is None:
        buf.write(start, array)
        return
    try:
        buf.attach(start, content)
    except BaseException:
        content.release()
        raise


def attach_held(buf: DeviceBuffer, start: int, content: SharedContent) -> None:
    """Point buf[start:...] at `content` (already counted as a user), or copy it in when the
    buffer does not share."""
    if shareable(buf, content.nbytes):
        try:
            buf.attach(start, content)
        except BaseException:
            content.release()
            raise
    else:
        try:
            buf.write_held(start, content.array)
        finally:
            content.release()


def share_at(buf: DeviceBuffer, start: int, nbytes: int) -> SharedContent | None:
    """The content buf[start:start+nbytes] points at exactly, if it does."""
    shares = buf.shares
    share = shares.containing(start, start + nbytes) if shares else None
    if share is None or share.start != start or share.nbytes != nbytes:
        return None
    return share.content


def vouch(buf: DeviceBuffer, start: int, nbytes: int, stored: Any) -> None:
    """A cache store of buf[start:start+nbytes] computed (FNV-1a, SHA-256, label): the content
    there, if shared, is named by that FNV-1a for clients trusting the label."""
    content = share_at(buf, start, nbytes)
    if content is None or stored is None:
        return
    fnv, strong, label = stored
    content.store.vouch(content, fnv, strong, label)


class UploadSink(DirectSink):
    """A HostSink over a fresh 1-D byte array; `commit()`, once all bytes are in, runs
    `done(array)` (the connection calls it on a thread: identifying may hash the whole array)."""

    def __init__(self, array: Any, done: Callable[[Any], None]) -> None:
        super().__init__(array)
        self._done: Callable[[Any], None] | None = done

    def commit(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            done(self.region)


def trusted(cache: Any) -> frozenset[str]:
    """Trust labels of what `cache` (the connection's HashCache-like) answers with."""
    origins = getattr(cache, "origins", None)
    return frozenset(origins()) if origins is not None else frozenset()


def load_traced(cache: Any, digest: int, target: Callable[[int], Any]) -> Any:
    """`cache.load_traced`: on a hit (trust label, SHA-256 or None), else None."""
    traced = getattr(cache, "load_traced", None)
    if traced is not None:
        return traced(digest, target)
    return ("", None) if cache.load_into(digest, target) else None
