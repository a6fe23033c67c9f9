"""The hash cache on real files: naming, atomic writes, verified hits, LRU bound, default dir."""

from __future__ import annotations

import os
import time

from rpcnet import _native
from rpcnet.server.cache import HashCache, default_cache_dir


def test_file_named_by_fnv_hex(tmp_path):
    cache = HashCache(tmp_path)
    data = bytes(range(1, 17))
    cache.store(_native.fnv1a64(data), data)
    assert (tmp_path / "e7ecfb4f6e006495").read_bytes() == data
    assert cache.load(0xE7ECFB4F6E006495) == data
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_corrupt_entry_is_removed(tmp_path):
    cache = HashCache(tmp_path)
    data = b"x" * 1000
    digest = _native.fnv1a64(data)
    (tmp_path / f"{digest:016x}").write_bytes(b"y" * 1000)
    assert cache.load(digest) is None
    assert not (tmp_path / f"{digest:016x}").exists()


def test_lru_bound(tmp_path):
    cache = HashCache(tmp_path, max_bytes=2500)
    blobs = [bytes([i]) * 1000 for i in range(3)]
    digests = [_native.fnv1a64(b) for b in blobs]
    cache.store(digests[0], blobs[0])
    cache.store(digests[1], blobs[1])
    past = time.time() - 100
    os.utime(tmp_path / f"{digests[1]:016x}", (past, past))  # entry 1 is least recently used
    assert cache.load(digests[0]) == blobs[0]
    cache.store(digests[2], blobs[2])
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {f"{digests[0]:016x}", f"{digests[2]:016x}"}


def test_default_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "lc"))
    assert default_cache_dir() == tmp_path / "lc" / "rpc"
    monkeypatch.delenv("LLAMA_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "llama.cpp" / "rpc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "llama.cpp" / "rpc"
