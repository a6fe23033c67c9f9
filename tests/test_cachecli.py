"""`rpcnet cache ls | stats | verify | prune | import` on real files, and a server hitting what
`import` wrote. The GGUF is written by the `gguf` package; tensor bytes come from its reader."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import gguf
import numpy as np
import pytest
from rpcnet import _native
from rpcnet.client import RpcClient
from support.inproc import ServerThread

MiB = 1 << 20


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rpcnet.cli", "cache", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """Two tensors above the 10 MiB threshold, one exactly at it, one small."""
    path = tmp_path_factory.mktemp("gguf") / "m.gguf"
    rng = np.random.default_rng(3)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("big_f32", rng.standard_normal((768, 4096)).astype(np.float32))  # 12 MiB
    w.add_tensor("big_f16", rng.standard_normal((1536, 4096)).astype(np.float16))  # 12 MiB
    w.add_tensor("at_threshold", rng.standard_normal((640, 4096)).astype(np.float32))  # 10 MiB
    w.add_tensor("small", rng.standard_normal((4, 64)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tensor_bytes(path) -> dict[str, bytes]:
    return {t.name: bytes(np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(str(path)).tensors}


def big_entries(path) -> dict[str, bytes]:
    """Expected cache content: {16-hex-digit name: bytes} of tensors strictly above 10 MiB."""
    return {
        f"{_native.fnv1a64(data):016x}": data
        for data in tensor_bytes(path).values()
        if len(data) > 10 * MiB
    }


def test_import_ls_stats(tmp_path, model):
    cache = tmp_path / "cache"
    res = cli("--dir", str(cache), "import", str(model))
    assert res.returncode == 0, res.stderr
    expected = big_entries(model)
    assert len(expected) == 2
    assert {p.name for p in cache.iterdir()} == set(expected)
    for name, data in expected.items():
        assert (cache / name).read_bytes() == data

    listing = json.loads(cli("--dir", str(cache), "ls", "--json").stdout)
    assert {(e["hash"], e["size"]) for e in listing} == {(n, len(d)) for n, d in expected.items()}
    stats = json.loads(cli("--dir", str(cache), "stats", "--json").stdout)
    assert stats["entries"] == 2 and stats["bytes"] == sum(map(len, expected.values()))
    text = cli("--dir", str(cache), "ls").stdout
    assert all(name in text for name in expected)


def test_verify_removes_corrupt_entries(tmp_path, model):
    cache = tmp_path / "cache"
    assert cli("--dir", str(cache), "import", str(model)).returncode == 0
    victim, keep = sorted(big_entries(model))
    with open(cache / victim, "r+b") as fh:
        fh.seek(12345)
        byte = fh.read(1)
        fh.seek(12345)
        fh.write(bytes([byte[0] ^ 0xFF]))
    res = cli("--dir", str(cache), "verify")
    assert res.returncode == 0
    assert f"removed {victim}" in res.stdout and "removed 1 corrupt" in res.stdout
    assert {p.name for p in cache.iterdir()} == {keep}


def test_prune_evicts_least_recently_used(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    blobs = [bytes([i]) * MiB for i in range(4)]
    names = [f"{_native.fnv1a64(b):016x}" for b in blobs]
    now = time.time()
    for i, (name, blob) in enumerate(zip(names, blobs, strict=True)):
        (cache / name).write_bytes(blob)
        os.utime(cache / name, (now - 100 * (4 - i), now - 100 * (4 - i)))  # 0 is oldest
    res = cli("--dir", str(cache), "prune", "--max", "2.5M")
    assert res.returncode == 0, res.stderr
    assert {p.name for p in cache.iterdir()} == set(names[2:])
    assert "removed 2 entries" in res.stdout


def test_default_directory_matches_serve(tmp_path, model):
    env = dict(os.environ, LLAMA_CACHE=str(tmp_path / "lc"))
    assert cli("import", str(model), env=env).returncode == 0
    stats = json.loads(cli("stats", "--json", env=env).stdout)
    assert stats["directory"] == str(tmp_path / "lc" / "rpc") and stats["entries"] == 2


def test_missing_directory_fails(tmp_path):
    res = cli("--dir", str(tmp_path / "absent"), "ls")
    assert res.returncode == 1 and "no cache directory" in res.stderr


def test_server_hits_imported_entries(tmp_path, model):
    """SET_TENSOR_HASH of an imported tensor is a hit and lands the GGUF's bytes in the buffer."""
    cache = tmp_path / "cache"
    assert cli("--dir", str(cache), "import", str(model)).returncode == 0
    data = tensor_bytes(model)["big_f16"]
    digest = _native.fnv1a64(data)
    srv = ServerThread(proto=8, mem=1 << 30, cache_dir=cache).start()
    try:

        async def go() -> tuple[bool, bool, bytes]:
            async with await RpcClient.connect("127.0.0.1", srv.port) as client:
                handle, _ = await client.alloc_buffer(len(data))
                base = await client.buffer_base(handle)
                t = _native.RpcTensor(
                    id=1, type=1, buffer=handle, ne=(4096, 1536, 1, 1), data=base, name="w"
                )
                hit = await client.set_tensor_hash(t, 0, digest)
                miss = await client.set_tensor_hash(t, 0, digest ^ 1)
                return hit, miss, await client.get_tensor(t, 0, len(data))

        hit, miss, got = asyncio.run(go())
        assert hit and not miss
        assert got == data
        assert srv.call(lambda: (srv.server.cache.hits, srv.server.cache.misses)) == (1, 1)
    finally:
        srv.stop()
