"""`rpcnet cache ls | stats | verify | prune --max SIZE | import FILE.gguf`: the hash cache offline.

Works on the rpc-server-format directory `serve --cache` uses (same default): files named by the
FNV-1a-64 of their content, last use = mtime.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpcnet import _native
from rpcnet.server.cache import HashCache, default_cache_dir
from rpcnet.server.stats import human_bytes

ENTRY_NAME = re.compile(r"[0-9a-f]{16}")
HASH_THRESHOLD = 10 << 20  # the client asks the cache only for tensors larger than this


@dataclass(frozen=True)
class CacheEntry:
    name: str
    size: int
    last_use: float  # mtime: refreshed on every hit

    @property
    def digest(self) -> int:
        return int(self.name, 16)


def add_parser(sub: Any, parse_size: Callable[[str], int]) -> None:
    cache = sub.add_parser("cache", help="inspect and manage the weight hash cache")
    cache.add_argument(
        "--dir", type=Path, default=None, help="cache directory (default: as serve --cache)"
    )
    actions = cache.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("ls", help="list entries (hash, size, last use), oldest first")
    ls.add_argument("--json", action="store_true")
    st = actions.add_parser("stats", help="entry count and total size")
    st.add_argument("--json", action="store_true")
    actions.add_parser("verify", help="re-hash every entry, remove the corrupt ones")
    prune = actions.add_parser("prune", help="evict least recently used entries down to --max")
    prune.add_argument("--max", type=parse_size, required=True, metavar="SIZE")
    imp = actions.add_parser("import", help="pre-fill the cache with a GGUF's large tensors")
    imp.add_argument("files", type=Path, nargs="+", metavar="FILE.gguf")
    imp.add_argument(
        "--min-size",
        type=parse_size,
        default=HASH_THRESHOLD,
        help="only tensors larger than this (default 10M: what the client asks for)",
    )
    for p in (ls, st, actions.choices["verify"], prune, imp):  # --dir after the action too
        p.add_argument("--dir", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def entries(directory: Path) -> Iterator[CacheEntry]:
    for entry in os.scandir(directory):
        if entry.is_file(follow_symlinks=False) and ENTRY_NAME.fullmatch(entry.name):
            st = entry.stat()
            yield CacheEntry(entry.name, st.st_size, st.st_mtime)


def cache_stats(directory: Path) -> dict[str, Any]:
    items = list(entries(directory))
    return {
        "directory": str(directory),
        "entries": len(items),
        "bytes": sum(e.size for e in items),
        "oldest_use": min((e.last_use for e in items), default=None),
        "newest_use": max((e.last_use for e in items), default=None),
    }


def verify(directory: Path) -> tuple[int, list[str]]:
    """Re-hash every entry; remove and return the names whose content does not match."""
    bad = []
    checked = 0
    for e in entries(directory):
        path = directory / e.name
        hasher = _native.Fnv1a64()
        try:
            with open(path, "rb", buffering=0) as fh:
                while chunk := fh.read(16 << 20):
                    hasher.update(chunk)
        except OSError:
            continue
        checked += 1
        if hasher.digest() != e.digest:
            bad.append(e.name)
            path.unlink(missing_ok=True)
    return checked, bad


def prune(directory: Path, max_bytes: int) -> tuple[int, int]:
    """LRU eviction down to `max_bytes`; (files removed, bytes removed)."""
    before = cache_stats(directory)
    cache = HashCache(directory)
    cache.evict(max_bytes)
    after = cache_stats(directory)
    return before["entries"] - after["entries"], before["bytes"] - after["bytes"]


def import_gguf(directory: Path, path: Path, min_size: int = HASH_THRESHOLD) -> tuple[int, int]:
    """Store every tensor larger than `min_size` under its hash; (tensors stored, bytes)."""
    import mmap

    from rpcnet.gguf_layout import read_layout

    cache = HashCache(directory)
    tensors = [t for t in read_layout(path) if t.nbytes > min_size]
    stored = nbytes = 0
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            for t in tensors:
                data = view[t.offset : t.offset + t.nbytes]
                if data.nbytes != t.nbytes:
                    raise ValueError(f"{path}: tensor {t.name!r} extends past the file end")
                cache.store(_native.fnv1a64(data), data)
                stored += 1
                nbytes += t.nbytes
                data.release()
        finally:
            view.release()
    return stored, nbytes


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def run(args: argparse.Namespace) -> int:
    directory = args.dir if args.dir is not None else default_cache_dir()
    if args.action != "import" and not directory.is_dir():
        print(f"rpcnet cache: no cache directory at {directory}", file=sys.stderr)
        return 1
    if args.action == "ls":
        items = sorted(entries(directory), key=lambda e: e.last_use)
        if args.json:
            rows = [{"hash": e.name, "size": e.size, "last_use": e.last_use} for e in items]
            print(json.dumps(rows, indent=2))
        else:
            for e in items:
                print(f"{e.name}  {e.size:>14}  {human_bytes(e.size):>10}  {_when(e.last_use)}")
        return 0
    if args.action == "stats":
        st = cache_stats(directory)
        if args.json:
            print(json.dumps(st, indent=2))
        else:
            print(f"{st['directory']}: {st['entries']} entries, {human_bytes(st['bytes'])}")
            if st["entries"]:
                print(f"last use: {_when(st['oldest_use'])} .. {_when(st['newest_use'])}")
        return 0
    if args.action == "verify":
        checked, bad = verify(directory)
        for name in bad:
            print(f"removed {name}: content does not match its hash")
        print(f"verified {checked} entries, removed {len(bad)} corrupt")
        return 0
    if args.action == "prune":
        files, nbytes = prune(directory, args.max)
        print(f"removed {files} entries ({human_bytes(nbytes)}); bound {human_bytes(args.max)}")
        return 0
    for path in args.files:
        try:
            files, nbytes = import_gguf(directory, path, args.min_size)
        except (OSError, ValueError) as exc:
            print(f"rpcnet cache import: {path}: {exc}", file=sys.stderr)
            return 1
        print(f"{path}: {files} tensors ({human_bytes(nbytes)}) stored in {directory}")
    return 0
