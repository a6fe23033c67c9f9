"""The weight hash cache (spec §7.12), file-compatible with rpc-server's `-c`.

Files are named by the FNV-1a-64 of their content (16 lowercase hex digits). Writes are atomic;
a hit is verified (the content must hash to its name) so a truncated or corrupt file is never
served. Files this process wrote or already verified are remembered by (size, mtime, inode), so
re-hashing is skipped while they stay untouched. `max_bytes` bounds the directory with
least-recently-used eviction (access time = mtime, refreshed on every hit).

Every entry also records the SHA-256 of its content, in the extended attribute `user.rpcnet.sha256`
of its file (set before the rename that publishes it; on a file system without user xattrs it is
kept in memory, and entries written by others are hashed when first needed). A hit must match it
too. An upload whose FNV-1a matches an entry with another SHA-256 is a collision: it is refused
and logged, and the entry stays as it is.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpcnet import _native

log = logging.getLogger("rpcnet.cache")
IO_CHUNK = 1 << 20
STRONG_XATTR = "user.rpcnet.sha256"


def strong_hash(data: Any) -> bytes:
    """SHA-256 (hashlib releases the GIL while it hashes)."""
    return hashlib.sha256(memoryview(data).cast("B")).digest()


def default_cache_dir() -> Path:
    env = os.environ
    if env.get("LLAMA_CACHE"):
        return Path(env["LLAMA_CACHE"]) / "rpc"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "llama.cpp" / "rpc"
    return Path.home() / ".cache" / "llama.cpp" / "rpc"


# What a hash-cache store vouches for: (FNV-1a-64, SHA-256, trust label of where it is kept).
Stored = tuple[int, bytes, str]


def hash_name(digest: int) -> str:
    return f"{digest:016x}"


class HashCache:
    def __init__(self, directory: Path, max_bytes: int | None = None) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # stores and eviction run on worker threads
        self._verified: dict[str, tuple[int, int, int]] = {}
        self.writable = True  # cleared after a failed write (disk full, unwritable)
        # Counters for metrics (rpcnet.server.metrics).
        self.hits = self.misses = self.bytes_written = self.evictions = 0
        self.collisions = 0  # uploads refused: same FNV-1a, other content
        self._strong: dict[str, bytes] = {}  # SHA-256 by name, where xattrs are unavailable
        self.directory.mkdir(parents=True, exist_ok=True)
        # who trusts this directory's entries trusts what they name (shared weights in memory)
        self.label = f"cache:{self.directory.resolve()}"

    def origins(self) -> frozenset[str]:
        """Trust labels of the entries this cache answers with (see compute/shared_content.py)."""
        return frozenset({self.label})

    def load_traced(
        self, digest: int, target: Callable[[int], Any]
    ) -> tuple[str, bytes | None] | None:
        """`load_into`, and on a hit (this cache's label, the entry's verified SHA-256)."""
        if not self.load_into(digest, target):
            return None
        return self.label, self.recorded_strong(digest)

    def path_for(self, digest: int) -> Path:
        return self.directory / hash_name(digest)

    def _record_strong(self, path: Path, strong: bytes, remember: bool = True) -> None:
        if remember:
            self._strong[path.name] = strong
        try:
            os.setxattr(path, STRONG_XATTR, strong)
        except (OSError, AttributeError):  # no user xattrs here: memory only
            pass

    def recorded_strong(self, digest: int) -> bytes | None:
        """The SHA-256 recorded for entry `digest`, None when none is."""
        name = hash_name(digest)
        try:
            return os.getxattr(self.directory / name, STRONG_XATTR)
        except (OSError, AttributeError):
            return self._strong.get(name)

    def strong_of(self, digest: int) -> bytes | None:
        """The entry's SHA-256: recorded, or hashed from the file now (and recorded); None when
        there is no such entry."""
        recorded = self.recorded_strong(digest)
        if recorded is not None:
            return recorded
        path = self.path_for(digest)
        hasher = hashlib.sha256()
        try:
            with open(path, "rb", buffering=0) as fh:
                while chunk := fh.read(16 * IO_CHUNK):
                    hasher.update(chunk)
        except OSError:
            return None
        strong = hasher.digest()
        self._record_strong(path, strong)
        return strong

    def has(self, digest: int) -> bool:
        return self.path_for(digest).exists()

    @staticmethod
    def _identity(st: os.stat_result) -> tuple[int, int, int]:
        return (st.st_size, st.st_mtime_ns, st.st_ino)

    def load(self, digest: int) -> bytes | None:
        """The verified content for `digest`, or None (missing, unreadable or corrupt)."""
        out: list[bytearray] = []

        def target(size: int) -> memoryview:
            out.append(bytearray(size))
            return memoryview(out[0])

        return bytes(out[0]) if self.load_into(digest, target) else None

    def load_into(self, digest: int, target: Callable[[int], Any]) -> bool:
        """Read the entry for `digest` straight into `target(size)`; False when there is none.

        `target` is only called for an existing entry (so a miss needs no tensor validation) and
        may raise to reject the size. Content that does not hash to its name is removed.
        """
        path = self.path_for(digest)
        try:
            with open(path, "rb", buffering=0) as fh:
                st = os.fstat(fh.fileno())
                view = memoryview(target(st.st_size)).cast("B")
                got = 0
                while got < st.st_size:
                    n = fh.readinto(view[got : got + IO_CHUNK])
                    if not n:
                        break
                    got += n
        except FileNotFoundError:
            self.misses += 1
            return False
        except OSError as exc:
            log.warning("cache: cannot read %s: %s", path, exc)
            return False
        trusted = self._verified.get(path.name) == self._identity(st)
        if got != st.st_size or (not trusted and not self._check(path, digest, view)):
            log.warning("cache: %s does not match its hash; removing it", path.name)
            self._verified.pop(path.name, None)
            self._remove(path)
            self._strong.pop(path.name, None)
            self.misses += 1
            return False
        self.hits += 1
        try:
            os.utime(path)
            self._verified[path.name] = self._identity(path.stat())
        except OSError:
            pass
        return True

    def _check(self, path: Path, digest: int, view: memoryview) -> bool:
        """Content read from disk matches its FNV-1a name and its recorded SHA-256."""
        if _native.fnv1a64(view) != digest:
            return False
        recorded = self.recorded_strong(digest)
        strong = strong_hash(view)
        if recorded is None:
            self._record_strong(path, strong)
            return True
        return recorded == strong

    def store(self, digest: int, data: Any, strong: bytes | None = None) -> bool:
        """Atomically write `data` under its hash (temp file + rename), then enforce the bound.

        False when an entry with this FNV-1a holds other content (a collision: refused, logged).
        """
        path = self.path_for(digest)
        strong = strong if strong is not None else strong_hash(data)
        with self._lock:
            if path.exists():
                if self.strong_of(digest) not in (strong, None):
                    self.collision(path.name, "this cache")
                    return False
                os.utime(path)
                return True
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
            try:
                with os.fdopen(fd, "wb", buffering=0) as fh:
                    view = memoryview(data).cast("B")
                    # 1 MiB writes: one huge write() is ~10x slower here (page-cache throttling).
                    for start in range(0, view.nbytes, IO_CHUNK):
                        fh.write(view[start : start + IO_CHUNK])
                self._record_strong(Path(tmp), strong, remember=False)
                os.replace(tmp, path)
                self._strong[path.name] = strong
            except BaseException:
                self._remove(Path(tmp))
                raise
            self.bytes_written += view.nbytes
            self._verified[path.name] = self._identity(path.stat())
        if self.max_bytes is not None:
            self.evict(self.max_bytes, keep=path.name)
        return True

    def collision(self, name: str, where: str) -> None:
        self.collisions += 1
        log.warning(
            "cache: FNV-1a collision on %s: an upload with this hash but other content (SHA-256) "
            "than the entry in %s; refused, the entry is kept",
            name,
            where,
        )

    def store_hashed(self, data: Any) -> Stored | None:
        """Hash `data` and store it; a failing disk disables further writes, serving goes on.
        What the stored entry vouches for, None when nothing was stored."""
        digest, strong = _native.fnv1a64(data), strong_hash(data)
        try:
            if self.store(digest, data, strong):
                return digest, strong, self.label
        except OSError as exc:
            self.writable = False
            log.warning("cache write failed (%s): cache writes disabled, serving continues", exc)
        return None

    def evict(self, max_bytes: int, keep: str | None = None) -> None:
        with self._lock:
            entries = []
            total = 0
            for entry in os.scandir(self.directory):
                if not entry.is_file() or entry.name.startswith(".tmp-"):
                    continue
                st = entry.stat()
                entries.append((st.st_mtime, entry.name, st.st_size))
                total += st.st_size
            entries.sort()
            for _, name, size in entries:
                if total <= max_bytes:
                    break
                if name == keep:
                    continue
                self._remove(self.directory / name)
                self._strong.pop(name, None)
                self.evictions += 1
                total -= size

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass
