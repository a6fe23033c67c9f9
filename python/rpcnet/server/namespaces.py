"""Cache namespaces under `--tokens`: what each tenant's SET_TENSOR_HASH may load.

The FNV-1a-64 the protocol names weights by is not collision resistant: a client can make content
with the hash of another tenant's weights. So each tenant's uploads go to its own namespace
(`CACHE/tenants/NAME/`), and a tenant's lookups see only

1. its own namespace,
2. the namespaces the operator marks shared (`--cache-shared NAME[,NAME]`; `root` is the cache
   directory itself, which `rpcnet cache import` fills and a server without `--tokens` writes),
3. the `--model-dir` files (the operator's).

An upload whose FNV-1a is already in a shared namespace with other content (SHA-256) is a
collision: refused and logged. Without `--tokens` there is one tenant and the cache directory is
its namespace, as with rpc-server.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpcnet import _native
from rpcnet.server.cache import HashCache, hash_name, strong_hash

log = logging.getLogger("rpcnet.cache")

TENANTS_DIR = "tenants"
ROOT = "root"


class TenantCache:
    """One tenant's view: HashCache's serving face (`load_into`, `writable`, `store_hashed`)."""

    def __init__(self, own: HashCache, shared: list[tuple[str, HashCache]], models: Any) -> None:
        self.own = own
        self.shared = [(name, c) for name, c in shared if c is not own]
        self.models = models  # ModelDirs or None

    @property
    def writable(self) -> bool:
        return self.own.writable

    def load_into(self, digest: int, target: Callable[[int], Any]) -> bool:
        if self.own.load_into(digest, target):
            return True
        for _, cache in self.shared:
            if cache.has(digest) and cache.load_into(digest, target):
                return True
        return bool(self.models) and self.models.load_into(digest, target)

    def origins(self) -> frozenset[str]:
        """Trust labels of what this tenant's lookups see (own, shared namespaces, model dirs)."""
        labels = {self.own.label, *(c.label for _, c in self.shared)}
        return frozenset(labels | (set(self.models.origins()) if self.models else set()))

    def load_traced(self, digest: int, target: Callable[[int], Any]) -> tuple[str, Any] | None:
        """`load_into`, and on a hit (the label of where it came from, its SHA-256 or None)."""
        for cache in (self.own, *(c for _, c in self.shared)):
            if cache is self.own or cache.has(digest):
                hit = cache.load_traced(digest, target)
                if hit is not None:
                    return hit
        return self.models.load_traced(digest, target) if self.models else None

    def store_hashed(self, data: Any) -> tuple[int, bytes, str] | None:
        digest = _native.fnv1a64(data)
        strong = strong_hash(data)
        for name, cache in self.shared:
            if not cache.has(digest):
                continue
            theirs = cache.strong_of(digest)
            if theirs == strong:
                return digest, strong, cache.label  # every tenant already trusts this content
            if theirs is not None:
                self.own.collision(hash_name(digest), f"the shared namespace {name!r}")
                return None
        try:
            if self.own.store(digest, data, strong):
                return digest, strong, self.own.label
        except OSError as exc:
            self.own.writable = False
            log.warning("cache write failed (%s): cache writes disabled, serving continues", exc)
        return None


class Namespaces:
    """The per-tenant HashCaches of one cache directory (made on first use)."""

    def __init__(
        self, directory: Path, max_bytes: int | None, shared: tuple[str, ...], models: Any
    ) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes  # per namespace
        self.shared_names = shared
        self.models = models
        self._caches: dict[str, HashCache] = {}
        self._lock = threading.Lock()

    def cache(self, name: str) -> HashCache:
        with self._lock:
            cache = self._caches.get(name)
            if cache is None:
                path = self.directory if name == ROOT else self.directory / TENANTS_DIR / name
                cache = self._caches[name] = HashCache(path, self.max_bytes)
            return cache

    def for_tenant(self, name: str) -> TenantCache:
        shared = [(n, self.cache(n)) for n in self.shared_names]
        return TenantCache(self.cache(name), shared, self.models)
