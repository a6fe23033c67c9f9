"""Identical weights held once: shared, immutable, reference-counted copies of content.

When the bytes a client loads into a range of its buffer (SET_TENSOR, SET_TENSOR_HASH answered
by the cache, a model directory or memory) equal bytes the server already holds, the range
points at one `SharedContent` (`compute/shared_ranges.py` keeps each buffer's ranges): the
received array itself on the CPU, one device allocation on a GPU (`backend.hold`). The
buffer's own pages there are never written (their memory is given back: `backend.drop_pages`,
on a GPU whole granules of a reserved range), and their bytes go back to the device's pool. A
write into such a range copies the content back into the buffer first (copy on write,
`DeviceBuffer.own`).

Identity is by the bytes the server holds. Every content has a cheap key (its size and a
BLAKE2b of 16 spread 4 KiB samples); an upload whose key matches a held content's is compared
with it byte for byte (memcmp, ~5 GB/s: exact, and cheaper than hashing both; a GPU's
content is read back through the staging buffers chunk by chunk, so no host copy of it is
kept and an equal upload never reaches the GPU). A content whose
SHA-256 the hash cache verified (a cache store, a verified hit) is also indexed by it, so a
verified hit with that SHA-256 is the same content without a comparison. A first load therefore
reads only the samples. The FNV-1a-64 of SET_TENSOR_HASH names a content only once the server
computed or verified it (a cache store or a verified cache or model-dir hit), together with the
origins (cache namespaces, model dirs) a client must trust to be answered by it; the same
FNV-1a with other bytes is a collision: logged, never shared.

`RPCNET_SHARE_WEIGHTS=0` turns sharing off (every range holds its own bytes).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("rpcnet.shared")

SHARE_MIN = 256 << 10  # smaller uploads (a step's inputs, norms) keep their own bytes
SAMPLES = 16
SAMPLE_BYTES = 4096


def enabled() -> bool:
    return os.environ.get("RPCNET_SHARE_WEIGHTS", "1") != "0"


def sample_key(data: Any) -> bytes:
    """A cheap digest of `data`: its size and SAMPLES blocks spread over it (first and last
    included). Equal content has equal keys; unequal keys mean unequal content."""
    view = memoryview(data).cast("B")
    n = view.nbytes
    hasher = hashlib.blake2b(n.to_bytes(8, "little"), digest_size=16)
    span = max(0, n - SAMPLE_BYTES)
    for i in range(SAMPLES):
        at = span * i // (SAMPLES - 1)
        hasher.update(view[at : at + SAMPLE_BYTES])
    return hasher.digest()


@dataclass(eq=False)
class SharedContent:
    array: Any  # uint8, read-only: the one copy, in the device's memory (`backend.hold`)
    sample: bytes
    store: SharedStore
    strong: bytes | None = None  # SHA-256, where the hash cache computed or verified it
    fnv: int | None = None  # FNV-1a-64, once computed or verified by the server
    origins: set[str] = field(default_factory=set)  # who vouches for `fnv` (trust labels)
    users: int = 1  # buffer ranges pointing at it

    @property
    def nbytes(self) -> int:
        return int(self.array.nbytes)

    def release(self) -> None:
        self.store.release(self)


class SharedStore:
    """The shared contents of one device, indexed by cheap key, SHA-256 and FNV-1a. Charged to
    the device's pool once each; thread-safe (cache loads run on threads). Uploads arrive as
    host bytes; the device's backend holds the contents (`hold`) and compares them (`same`)."""

    def __init__(self, pool: Any, backend: Any) -> None:
        self.pool = pool
        self.backend = backend
        self._lock = threading.Lock()
        self._by_sample: dict[bytes, list[SharedContent]] = {}
        self._by_strong: dict[bytes, SharedContent] = {}
        self._by_fnv: dict[int, SharedContent] = {}
        self.collisions = 0
        self.seconds = 0.0  # spent identifying uploads (keys, comparisons, lookups)
        self.compared = 0  # bytes compared with held candidates
        self.answered = 0  # SET_TENSOR_HASH lookups answered from memory

    # ------------------------------------------------------------------ queries

    def by_fnv(self, fnv: int, trusted: frozenset[str]) -> SharedContent | None:
        """A content named `fnv` that a client trusting `trusted` may be answered with (a new
        user of it: `release` it when done), or None."""
        with self._lock:
            content = self._by_fnv.get(fnv)
            if content is None or not content.origins & trusted:
                return None
            content.users += 1
            self.answered += 1
            return content

    def stats(self) -> tuple[int, int, int]:
        """(bytes held once for several users, bytes those users would hold alone beyond
        that, contents held)."""
        with self._lock:
            contents = [c for group in self._by_sample.values() for c in group]
            shared = sum(c.nbytes for c in contents if c.users > 1)
            saved = sum(c.nbytes * (c.users - 1) for c in contents)
            return shared, saved, len(contents)

    # ------------------------------------------------------------------ adding users

    def adopt(
        self,
        array: Any,
        strong: bytes | None = None,
        fnv: int | None = None,
        origin: str | None = None,
    ) -> SharedContent | None:
        """The content equal to host uint8 `array` (a new user of it), else a new content
        holding its bytes (charged to the pool; None when the device has no room for it).
        With `fnv` (verified by the caller) the content is named by it for clients trusting
        `origin`, unless `fnv` already names other bytes: a collision, logged; the content is
        then shared by its bytes only, and that hash never answers with it."""
        started = time.perf_counter()
        try:
            return self._adopt(array, strong, fnv, origin)
        finally:
            with self._lock:
                self.seconds += time.perf_counter() - started

    def _adopt(
        self, array: Any, strong: bytes | None, fnv: int | None, origin: str | None
    ) -> SharedContent | None:
        sample = sample_key(array)
        with self._lock:
            found = self._find(array, sample, strong)
            if fnv is not None and self._names_other(
                fnv,
                found,
                "content with this hash but other bytes than the content held under it; never "
                "shared under this hash",
            ):
                fnv = None
            if found is None:
                held = self.backend.hold(array)
                if held is None:
                    return None
                found = SharedContent(held, sample, self, strong=strong)
                self._by_sample.setdefault(sample, []).append(found)
                if strong is not None:
                    self._by_strong.setdefault(strong, found)
                self.pool.charge(found.nbytes)
            else:
                found.users += 1
            if fnv is not None and origin is not None:
                self._name(found, fnv, origin)
            return found

    def _names_other(self, fnv: int, content: SharedContent | None, what: str) -> bool:
        """True (a collision, counted and logged) when `fnv` names held content other than
        `content`."""
        named = self._by_fnv.get(fnv)
        if named is None or named is content:
            return False
        self.collisions += 1
        log.warning("shared weights: FNV-1a collision on %016x: %s", fnv, what)
        return True

    def _find(self, array: Any, sample: bytes, strong: bytes | None) -> SharedContent | None:
        """The held content equal to `array`: by a verified SHA-256, else compared byte for
        byte with those of its cheap key."""
        if strong is not None and strong in self._by_strong:
            return self._by_strong[strong]
        for content in self._by_sample.get(sample, ()):
            self.compared += content.nbytes
            if self.backend.same(content.array, array):
                if strong is not None and content.strong is None:
                    content.strong = strong
                    self._by_strong.setdefault(strong, content)
                return content
        return None

    def vouch(self, content: SharedContent, fnv: int, strong: bytes, origin: str) -> None:
        """Name `content` by `fnv` for clients trusting `origin`; both hashes were computed
        from its bytes (a hash-cache store)."""
        with self._lock:
            if content.strong is None:
                content.strong = strong
                self._by_strong.setdefault(strong, content)
            if self._names_other(
                fnv, content, "two held contents have this hash; the second is not named by it"
            ):
                return
            self._name(content, fnv, origin)

    def _name(self, content: SharedContent, fnv: int, origin: str) -> None:
        if content.fnv is None:
            content.fnv = fnv
            self._by_fnv[fnv] = content
        if content.fnv == fnv:
            content.origins.add(origin)

    # ------------------------------------------------------------------ dropping users

    def release(self, content: SharedContent) -> None:
        """One user fewer; the last one frees the content (its pool charge with it)."""
        with self._lock:
            content.users -= 1
            if content.users > 0:
                return
            group = self._by_sample.get(content.sample, [])
            if content in group:
                group.remove(content)
            if not group:
                self._by_sample.pop(content.sample, None)
            if content.strong is not None and self._by_strong.get(content.strong) is content:
                del self._by_strong[content.strong]
            if content.fnv is not None and self._by_fnv.get(content.fnv) is content:
                del self._by_fnv[content.fnv]
        self.pool.release(content.nbytes)


_STORES_LOCK = threading.Lock()


def device_sharing(device: Any) -> dict[str, float]:
    """For metrics: bytes held once for several users, bytes that saves, contents held, FNV-1a
    collisions, seconds spent identifying uploads, bytes compared for it and hash lookups
    answered from memory, on `device` (zeros before its first shared upload)."""
    store = getattr(device, "shared_store", None)
    if store is None:
        keys = ("shared", "saved", "contents", "collisions", "seconds", "compared", "answered")
        return dict.fromkeys(keys, 0)
    shared, saved, contents = store.stats()
    return {
        "shared": shared,
        "saved": saved,
        "contents": contents,
        "collisions": store.collisions,
        "seconds": store.seconds,
        "compared": store.compared,
        "answered": store.answered,
    }


def store_of(device: Any) -> SharedStore:
    """The device's store, made on first use (one per device: its pool is shared by all)."""
    store = getattr(device, "shared_store", None)
    if store is None:
        with _STORES_LOCK:
            store = getattr(device, "shared_store", None)
            if store is None:
                store = SharedStore(device.memory, device.backend)
                device.shared_store = store
    return store
