"""The weight hash cache (spec §7.12), file-compatible with rpc-server's `-c`.

Files are named by the FNV-1a-64 of their content (16 lowercase hex digits). Writes are atomic;
reads re-hash so a truncated or corrupt file is never served; `max_bytes` bounds the directory
with least-recently-used eviction (access time = mtime, refreshed on every hit).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

from rpcnet import _native

log = logging.getLogger("rpcnet.cache")


def default_cache_dir() -> Path:
    env = os.environ
    if env.get("LLAMA_CACHE"):
        return Path(env["LLAMA_CACHE"]) / "rpc"
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]) / "llama.cpp" / "rpc"
    return Path.home() / ".cache" / "llama.cpp" / "rpc"


def hash_name(digest: int) -> str:
    return f"{digest:016x}"


class HashCache:
    def __init__(self, directory: Path, max_bytes: int | None = None) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # eviction runs from worker threads
        self.directory.mkdir(parents=True, exist_ok=True)

    def path_for(self, digest: int) -> Path:
        return self.directory / hash_name(digest)

    def load(self, digest: int) -> bytes | None:
        """The verified content for `digest`, or None (missing, unreadable or corrupt)."""
        path = self.path_for(digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cache: cannot read %s: %s", path, exc)
            return None
        if _native.fnv1a64(data) != digest:
            log.warning("cache: %s does not match its hash; removing it", path.name)
            self._remove(path)
            return None
        try:
            os.utime(path)
        except OSError:
            pass
        return data

    def store(self, digest: int, data) -> None:
        """Atomically write `data` under its hash (temp file + rename), then enforce the bound."""
        path = self.path_for(digest)
        if path.exists():
            os.utime(path)
            return
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            self._remove(Path(tmp))
            raise
        if self.max_bytes is not None:
            self.evict(self.max_bytes, keep=path.name)

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
                total -= size

    @staticmethod
    def _remove(path: Path) -> None:
        try:
            path.unlink()
        except OSError:
            pass
