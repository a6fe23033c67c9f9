"""`--model-dir`: answer SET_TENSOR_HASH from the tensors of local GGUF files.

Every `*.gguf` under each directory is indexed by the FNV-1a-64 of each tensor's data (the hash
the client sends for tensors above HASH_THRESHOLD). Hashing runs on a thread pool (the Rust hash
releases the GIL) in the background, so clients are served while it runs: a tensor is a miss until
its file is done. The index is kept in a sidecar JSON file keyed by path, size and mtime, so a
restart rehashes only new or changed files.

A hit is read with pread straight into the destination buffer and verified against the hash:
a file whose size or mtime changed is re-indexed and the request is a miss; so is a mismatch.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpcnet import _native
from rpcnet.gguf_layout import GGUFFormatError, read_layout

log = logging.getLogger("rpcnet.modeldir")

HASH_THRESHOLD = 10 << 20  # the client hashes only tensors strictly larger than this
INDEX_NAME = ".rpcnet-index.json"
INDEX_VERSION = 1
PROGRESS_EVERY = 2.0  # seconds between indexing progress lines
READ_CHUNK = 64 << 20
MODELS_LABEL = "model-dirs"


@dataclass(frozen=True)
class Entry:
    path: str
    offset: int
    size: int
    name: str


def file_identity(st: os.stat_result) -> tuple[int, int]:
    return (st.st_size, st.st_mtime_ns)


def sidecar_path(directory: Path) -> Path:
    """DIR/.rpcnet-index.json, or a file in the user cache when DIR is not writable."""
    if os.access(directory, os.W_OK):
        return directory / INDEX_NAME
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rpcnet"
    return base / f"model-index-{_native.fnv1a64(str(directory).encode()):016x}.json"


def hash_file(path: Path, min_size: int = HASH_THRESHOLD) -> list[tuple[int, Entry]]:
    """(hash, entry) of every tensor larger than `min_size` in one GGUF file."""
    tensors = [t for t in read_layout(path) if t.nbytes > min_size]
    out: list[tuple[int, Entry]] = []
    if not tensors:
        return out
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            for t in tensors:
                if t.offset + t.nbytes > len(mm):
                    raise GGUFFormatError(f"{path}: tensor {t.name!r} extends past the file end")
                digest = _native.fnv1a64(view[t.offset : t.offset + t.nbytes])
                out.append((digest, Entry(str(path), t.offset, t.nbytes, t.name)))
        finally:
            view.release()
    return out


def pread_into(fd: int, view: memoryview, offset: int) -> int:
    got = 0
    while got < view.nbytes:
        n = os.preadv(fd, [view[got : got + READ_CHUNK]], offset + got)
        if n <= 0:
            break
        got += n
    return got


LOOKUP_COUNTS = ("hits", "misses", "mismatches", "bytes_served")


class ModelDirs:
    """The hash -> (file, offset, size) index of one or more model directories."""

    def __init__(self, directories: tuple[Path, ...], workers: int | None = None) -> None:
        self.directories = tuple(Path(d).resolve() for d in directories)
        self.workers = workers or min(8, os.cpu_count() or 1)
        self._by_hash: dict[int, Entry] = {}
        self._files: dict[str, tuple[tuple[int, int], list[tuple[int, Entry]]]] = {}
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.ready = threading.Event()  # the first indexing pass is complete
        # hits, misses, mismatches (hash matched, bytes did not), bytes_served: metrics, /status
        self.lookups: Counter[str] = Counter()
        self.files_total = self.files_done = self.bytes_total = self.bytes_done = 0

    @classmethod
    def open(cls, directories: tuple[Path, ...] | list[Path]) -> ModelDirs:
        for d in directories:
            if not Path(d).is_dir():
                raise ValueError(f"--model-dir {d}: not a directory")
        return cls(tuple(directories))

    def __bool__(self) -> bool:
        return bool(self.directories)

    @property
    def tensors(self) -> int:
        return len(self._by_hash)

    @property
    def indexed_bytes(self) -> int:
        return sum(e.size for e in self._by_hash.values())

    # ------------------------------------------------------------ indexing

    def start(self) -> None:
        """Index in the background (no-op without directories)."""
        if not self.directories or self._thread is not None:
            if not self.directories:
                self.ready.set()
            return
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="rpcnet-index")
        self._thread = threading.Thread(target=self._index_all, name="rpcnet-index", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self.ready.wait(timeout)

    def close(self) -> None:
        self._stop.set()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _index_all(self) -> None:
        t0 = time.monotonic()
        try:
            for directory in self.directories:
                if self._stop.is_set():
                    return
                self._index_dir(directory)
            log.info(
                "model dirs indexed: %d files, %d tensors (%.2f GB) in %.1f s",
                len(self._files),
                self.tensors,
                self.indexed_bytes / 1e9,
                time.monotonic() - t0,
            )
        except Exception:  # never take the server down; it serves without the index
            log.exception("indexing the model directories failed")
        finally:
            self.ready.set()

    def _index_dir(self, directory: Path) -> None:
        sidecar = sidecar_path(directory)
        known = self._read_sidecar(sidecar)
        paths = sorted(p for p in directory.rglob("*.gguf") if p.is_file())
        todo: list[tuple[Path, tuple[int, int]]] = []
        for path in paths:
            try:
                ident = file_identity(path.stat())
            except OSError:
                continue
            cached = known.get(str(path))
            if cached is not None and tuple(cached["id"]) == ident:
                entries = [
                    (int(h, 16), Entry(str(path), off, size, name))
                    for h, off, size, name in cached["tensors"]
                ]
                self._publish(str(path), ident, entries)
            else:
                todo.append((path, ident))
        self.files_total += len(todo)
        self.bytes_total += sum(ident[0] for _, ident in todo)
        if todo:
            log.info(
                "indexing %s: %d of %d files to hash (%.2f GB), %d from %s",
                directory,
                len(todo),
                len(paths),
                sum(ident[0] for _, ident in todo) / 1e9,
                len(paths) - len(todo),
                sidecar.name,
            )
        assert self._pool is not None
        futures = {self._pool.submit(self._hash_one, p, ident): p for p, ident in todo}
        started, last = time.monotonic(), time.monotonic()
        pending = set(futures)
        while pending and not self._stop.is_set():
            done = {f for f in pending if f.done()}
            pending -= done
            now = time.monotonic()
            if pending and now - last >= PROGRESS_EVERY:
                last = now
                self._log_progress(now - started)
            if pending:
                self._stop.wait(0.05)
        if todo and not self._stop.is_set():
            self._write_sidecar(sidecar, directory)

    def _hash_one(self, path: Path, ident: tuple[int, int]) -> None:
        try:
            entries = hash_file(path)
        except (OSError, GGUFFormatError) as exc:
            log.warning("model dir: skipping %s: %s", path, exc)
            entries = []
        try:
            if file_identity(path.stat()) != ident:
                log.warning("model dir: %s changed while being indexed; skipping it", path)
                entries = []
        except OSError:
            entries = []
        self._publish(str(path), ident, entries)
        self.files_done += 1
        self.bytes_done += ident[0]

    def _log_progress(self, elapsed: float) -> None:
        rate = self.bytes_done / max(elapsed, 1e-6)
        left = self.bytes_total - self.bytes_done
        eta = left / rate if rate > 0 else float("inf")
        log.info(
            "indexing: %d/%d files, %.2f/%.2f GB, %.2f GB/s, ETA %.0f s",
            self.files_done,
            self.files_total,
            self.bytes_done / 1e9,
            self.bytes_total / 1e9,
            rate / 1e9,
            eta,
        )

    def _publish(self, path: str, ident: tuple[int, int], entries: list[tuple[int, Entry]]) -> None:
        with self._lock:
            self._drop_locked(path)
            self._files[path] = (ident, entries)
            for digest, entry in entries:
                self._by_hash.setdefault(digest, entry)

    def _drop_locked(self, path: str) -> None:
        old = self._files.pop(path, None)
        if old is None:
            return
        for digest, entry in old[1]:
            if self._by_hash.get(digest) == entry:
                del self._by_hash[digest]
                # Another file may hold the same tensor: keep it reachable.
                for _, (_, others) in self._files.items():
                    alt = next((e for h, e in others if h == digest), None)
                    if alt is not None:
                        self._by_hash[digest] = alt
                        break

    @staticmethod
    def _read_sidecar(sidecar: Path) -> dict[str, Any]:
        try:
            data = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("version") != INDEX_VERSION:
            return {}
        files = data.get("files")
        return files if isinstance(files, dict) else {}

    def _write_sidecar(self, sidecar: Path, directory: Path) -> None:
        with self._lock:
            files = {
                path: {
                    "id": list(ident),
                    "tensors": [[f"{h:016x}", e.offset, e.size, e.name] for h, e in entries],
                }
                for path, (ident, entries) in self._files.items()
                if Path(path).is_relative_to(directory)
            }
        try:
            sidecar.parent.mkdir(parents=True, exist_ok=True)
            tmp = sidecar.with_name(sidecar.name + ".tmp")
            tmp.write_text(json.dumps({"version": INDEX_VERSION, "files": files}))
            os.replace(tmp, sidecar)
        except OSError as exc:
            log.warning("model dir: cannot write the index %s: %s", sidecar, exc)

    def _reindex(self, path: str) -> None:
        """A file changed under us: forget it and hash it again in the background."""
        with self._lock:
            self._drop_locked(path)
        if self._pool is None or self._stop.is_set() or not os.path.exists(path):
            return
        try:
            ident = file_identity(os.stat(path))
            self._pool.submit(self._hash_one, Path(path), ident)
        except (OSError, RuntimeError):
            pass

    # ------------------------------------------------------------ serving

    def origins(self) -> frozenset[str]:
        """Trust label of the operator's model files (see compute/shared_content.py)."""
        return frozenset({MODELS_LABEL})

    def load_traced(self, digest: int, target: Callable[[int], Any]) -> tuple[str, None] | None:
        """`load_into`, and on a hit (the model dirs' label, no SHA-256 known)."""
        return (MODELS_LABEL, None) if self.load_into(digest, target) else None

    def load_into(self, digest: int, target: Callable[[int], Any]) -> bool:
        """Read the tensor with this hash straight into `target(size)`; False on a miss."""
        entry = self._by_hash.get(digest)
        if entry is None:
            self.lookups["misses"] += 1
            return False
        with self._lock:
            ident = self._files.get(entry.path, (None,))[0]
        try:
            fd = os.open(entry.path, os.O_RDONLY)
        except OSError:
            self._reindex(entry.path)
            self.lookups["misses"] += 1
            return False
        try:
            if file_identity(os.fstat(fd)) != ident:
                log.info("model dir: %s changed; re-indexing it", entry.path)
                self._reindex(entry.path)
                self.lookups["misses"] += 1
                return False
            view = memoryview(target(entry.size)).cast("B")
            got = pread_into(fd, view, entry.offset)
        finally:
            os.close(fd)
        if got != entry.size or _native.fnv1a64(view) != digest:
            log.warning(
                "model dir: %s tensor %r does not match its indexed hash; re-indexing",
                entry.path,
                entry.name,
            )
            self.lookups["mismatches"] += 1
            self.lookups["misses"] += 1
            self._reindex(entry.path)
            return False
        self.lookups["hits"] += 1
        self.lookups["bytes_served"] += entry.size
        return True

    def snapshot(self) -> dict[str, Any]:
        return {
            "directories": [str(d) for d in self.directories],
            "ready": self.ready.is_set(),
            "files": len(self._files),
            "tensors": self.tensors,
            "indexed_bytes": self.indexed_bytes,
            **{key: self.lookups[key] for key in LOOKUP_COUNTS},
        }


class WeightSources:
    """The hash cache and the model directories behind one HashCache-like face.

    Session and Connection use `load_into`, `writable` and `store_hashed`; a hit comes from the
    cache first (exact files), then from the model directories. Without a cache nothing is stored.
    """

    def __init__(self, cache: Any, models: ModelDirs) -> None:
        self.cache = cache
        self.models = models

    @property
    def writable(self) -> bool:
        return self.cache is not None and self.cache.writable

    def load_into(self, digest: int, target: Callable[[int], Any]) -> bool:
        if self.cache is not None and self.cache.load_into(digest, target):
            return True
        return self.models.load_into(digest, target)

    def store_hashed(self, data: Any) -> Any:
        return self.cache.store_hashed(data) if self.cache is not None else None

    def origins(self) -> frozenset[str]:
        mine = self.cache.origins() if self.cache is not None else frozenset()
        return frozenset(mine | self.models.origins())

    def load_traced(self, digest: int, target: Callable[[int], Any]) -> tuple[str, Any] | None:
        if self.cache is not None:
            hit = self.cache.load_traced(digest, target)
            if hit is not None:
                return hit
        return self.models.load_traced(digest, target)

    def __getattr__(self, name: str) -> Any:  # the rest of HashCache (directory, ...)
        if self.cache is None:
            raise AttributeError(name)
        return getattr(self.cache, name)


def weight_sources(cache: Any, models: ModelDirs) -> Any:
    """What the sessions use as their cache: the cache alone, or cache + model directories."""
    return WeightSources(cache, models) if models else cache


def hash_cache_of(source: Any) -> Any:
    """The HashCache behind `source` (None without --cache)."""
    return source.cache if isinstance(source, WeightSources) else source
