"""`serve --model-dir`: the GGUF index on real files (sidecar, changed files, mismatches) and a real
llama.cpp client whose large weights are then read from the file instead of uploaded.

Oracles: the `gguf` package's reader (tensor offsets and bytes), a byte-counting TCP relay (what
the client really sent) and the logits of the same run without --model-dir.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.request

import gguf
import numpy as np
import pytest
from rpcnet import _native
from rpcnet.client import RpcClient
from rpcnet.gguf_layout import read_layout
from rpcnet.server import modeldir
from rpcnet.server.modeldir import INDEX_NAME, ModelDirs
from support import refenv
from support.countproxy import CountingProxy
from support.inproc import ServerThread
from support.serve import start_rpcnet
from support.tinymodel import write_tiny_llama

MiB = 1 << 20
THRESHOLD = 10 * MiB


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A llama model whose token embedding, output and FFN matrices (12 MiB each) exceed 10 MiB."""
    d = tmp_path_factory.mktemp("models")
    write_tiny_llama(d / "wide.gguf", n_vocab=8192, n_embd=384, n_head=4, n_head_kv=2, n_ff=8192)
    return d


def reader_tensors(path) -> dict[str, tuple[int, bytes]]:
    """{name: (absolute data offset, bytes)} from the gguf package."""
    return {
        t.name: (int(t.data_offset), bytes(np.asarray(t.data).tobytes()))
        for t in gguf.GGUFReader(str(path)).tensors
    }


def big_tensors(path, skip: tuple[str, ...] = ()) -> dict[int, bytes]:
    return {
        _native.fnv1a64(data): data
        for name, (_, data) in reader_tensors(path).items()
        if len(data) > THRESHOLD and name not in skip
    }


def load(index: ModelDirs, digest: int, size: int) -> bytes | None:
    out = bytearray(size)
    return bytes(out) if index.load_into(digest, lambda n: memoryview(out)[:n]) else None


def test_layout_matches_gguf_reader(model_dir):
    path = model_dir / "wide.gguf"
    ours = {t.name: (t.offset, t.nbytes) for t in read_layout(path)}
    theirs = {n: (off, len(data)) for n, (off, data) in reader_tensors(path).items()}
    assert ours == theirs


def test_index_sidecar_and_hits(tmp_path, model_dir):
    d = tmp_path / "d"
    d.mkdir()
    (d / "sub").mkdir()
    path = d / "sub" / "wide.gguf"
    path.write_bytes((model_dir / "wide.gguf").read_bytes())
    (d / "notes.txt").write_text("not a model")
    expected = big_tensors(path)
    assert len(expected) == 8

    first = ModelDirs((d,))
    first.start()
    assert first.wait_ready(60)
    assert first.files_done == 1 and first.tensors == 8
    for digest, data in expected.items():
        assert load(first, digest, len(data)) == data
    assert load(first, 12345, 16) is None
    assert first.lookups["hits"] == 8 and first.lookups["misses"] == 1
    assert first.lookups["bytes_served"] == sum(map(len, expected.values()))
    first.close()
    sidecar = json.loads((d / INDEX_NAME).read_text())
    assert set(sidecar["files"]) == {str(path.resolve())}

    second = ModelDirs((d,))  # a restart: nothing rehashed, same answers
    second.start()
    assert second.wait_ready(60)
    assert second.files_done == 0 and second.tensors == 8
    for digest, data in expected.items():
        assert load(second, digest, len(data)) == data
    second.close()


def test_changed_file_is_reindexed(tmp_path, model_dir):
    path = tmp_path / "wide.gguf"
    path.write_bytes((model_dir / "wide.gguf").read_bytes())
    expected = big_tensors(path)
    index = ModelDirs((tmp_path,))
    index.start()
    assert index.wait_ready(60)
    with open(path, "ab") as fh:  # size and mtime change; tensor bytes do not
        fh.write(bytes(64))
    digest, data = next(iter(expected.items()))
    assert load(index, digest, len(data)) is None  # never served from a changed file
    deadline = time.monotonic() + 30
    while index.tensors < 8:
        assert time.monotonic() < deadline, "file was not re-indexed"
        time.sleep(0.05)
    assert load(index, digest, len(data)) == data
    index.close()


def test_content_mismatch_is_a_miss(tmp_path, model_dir):
    """Bytes changed behind an unchanged size and mtime: the read is verified, so it is a miss."""
    path = tmp_path / "wide.gguf"
    path.write_bytes((model_dir / "wide.gguf").read_bytes())
    offsets = {
        _native.fnv1a64(data): off
        for off, data in reader_tensors(path).values()
        if len(data) > THRESHOLD
    }
    index = ModelDirs((tmp_path,))
    index.start()
    assert index.wait_ready(60)
    digest, offset = next(iter(offsets.items()))
    st = path.stat()
    with open(path, "r+b") as fh:
        fh.seek(offset + 100)
        fh.write(b"\xff\xff\xff\xff")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert load(index, digest, big_size(path, digest)) is None
    assert index.lookups["mismatches"] == 1
    index.close()


def big_size(path, digest: int) -> int:
    return len(big_tensors(path).get(digest, b"")) or 12 * MiB


def run_generate(endpoint: str, model, out) -> np.ndarray:
    res = refenv.run_probe(
        "v8",
        "generate",
        "--model",
        model,
        "--endpoint",
        endpoint,
        "--tokens",
        "1,20,300,4000,7,8",
        "--prefill",
        "3",
        "--out",
        out,
        timeout=240,
    )
    assert res["finite"]
    return np.load(res["logits_path"])


def scrape_status(mport: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/status", timeout=10) as resp:
        return json.loads(resp.read())


def serve_and_generate(tmp_path, model, tag: str, *args: str) -> tuple[int, np.ndarray, dict]:
    """(bytes the client sent, logits, final /status) for one server configuration."""
    port, mport = refenv.free_port(), refenv.free_port()
    proc = start_rpcnet(port, "--mem", "2G", "--metrics", str(mport), *args)
    proxy = CountingProxy(port)
    try:
        deadline = time.monotonic() + 60
        while (scrape_status(mport).get("model_dirs") or {"ready": True})["ready"] is False:
            assert time.monotonic() < deadline, "model dir not indexed"
            time.sleep(0.05)
        logits = run_generate(proxy.endpoint, model, tmp_path / tag)
        proxy.join()
        return proxy.to_server, logits, scrape_status(mport)
    finally:
        proxy.close()
        proc.terminate()
        proc.wait(30)


def test_real_client_loads_large_weights_from_model_dir(tmp_path, model_dir):
    model = model_dir / "wide.gguf"
    # What the client uploads: every weight but token_embd (llama.cpp keeps the input layer on
    # the host); the ones above 10 MiB go through SET_TENSOR_HASH first.
    big = big_tensors(model, skip=("token_embd.weight",))
    assert len(big) == 7
    big_bytes = sum(map(len, big.values()))
    # Without a weight source every tensor is uploaded (after a SET_TENSOR_HASH miss).
    sent_plain, logits_plain, _ = serve_and_generate(tmp_path, model, "plain")
    # With --model-dir (no --cache): the two large tensors are read from the file instead.
    sent_dir, logits_dir, doc = serve_and_generate(
        tmp_path, model, "dir", "--model-dir", str(model_dir)
    )
    assert doc["model_dirs"]["hits"] == len(big)
    assert doc["model_dirs"]["bytes_served"] == big_bytes
    # Exactly the SET_TENSOR frames of those tensors (header 9 + 305 + data) were not sent.
    assert sent_plain - sent_dir == sum(9 + 305 + len(d) for d in big.values())
    np.testing.assert_array_equal(logits_dir, logits_plain)

    # `rpcnet cache import` + `serve --cache`: the same saving through the hash cache.
    import subprocess
    import sys

    cache = tmp_path / "cache"
    res = subprocess.run(
        [sys.executable, "-m", "rpcnet.cli", "cache", "--dir", str(cache), "import", str(model)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    sent_cache, logits_cache, doc = serve_and_generate(
        tmp_path, model, "cache", "--cache", str(cache)
    )
    assert doc["cache"]["hits"] == len(big)
    assert sent_cache == sent_dir
    np.testing.assert_array_equal(logits_cache, logits_plain)


def test_progress_lines_while_indexing(tmp_path, model_dir, monkeypatch, caplog):
    monkeypatch.setattr(modeldir, "PROGRESS_EVERY", 0.0)
    caplog.set_level("INFO", logger="rpcnet.modeldir")
    (tmp_path / "wide.gguf").write_bytes((model_dir / "wide.gguf").read_bytes())
    index = ModelDirs((tmp_path,))
    index.start()
    assert index.wait_ready(60)
    index.close()
    lines = [r.message for r in caplog.records if r.message.startswith("indexing: ")]
    assert lines, "no progress line"
    assert all(" files, " in m and " GB/s, ETA " in m for m in lines)
    assert any("model dirs indexed: 1 files, 8 tensors" in r.message for r in caplog.records)


def test_server_answers_while_indexing(tmp_path, model_dir, monkeypatch):
    """Until its file is indexed a tensor is a miss, and the server keeps answering meanwhile."""
    release = threading.Event()
    real_hash_file = modeldir.hash_file

    def slow_hash_file(path, *args):
        release.wait(60)
        return real_hash_file(path, *args)

    monkeypatch.setattr(modeldir, "hash_file", slow_hash_file)
    model = model_dir / "wide.gguf"
    digest, data = next(iter(big_tensors(model, skip=("token_embd.weight",)).items()))
    d = tmp_path / "d"
    d.mkdir()
    (d / "wide.gguf").write_bytes(model.read_bytes())
    srv = ServerThread(proto=8, mem=1 << 30, model_dirs=(d,)).start()
    try:

        async def ask() -> tuple[bool, bytes]:
            async with await RpcClient.connect("127.0.0.1", srv.port) as client:
                handle, _ = await client.alloc_buffer(len(data))
                base = await client.buffer_base(handle)
                t = _native.RpcTensor(
                    id=1, type=0, buffer=handle, ne=(len(data) // 4, 1, 1, 1), data=base
                )
                hit = await client.set_tensor_hash(t, 0, digest)
                return hit, await client.get_tensor(t, 0, len(data))

        hit, _ = asyncio.run(ask())
        assert not hit  # indexing is still running: a miss, answered at once
        assert not srv.server.models.ready.is_set()
        release.set()
        assert srv.server.models.wait_ready(60)
        hit, got = asyncio.run(ask())
        assert hit and got == data
    finally:
        release.set()
        srv.stop()


def test_missing_model_dir_is_a_usage_error(tmp_path):
    import subprocess
    import sys

    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "rpcnet.cli",
            "serve",
            "--port",
            "0",
            "--model-dir",
            str(tmp_path / "absent"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "not a directory" in res.stderr
