"""The reference environment works: REAL llama.cpp v8/v7 rpc servers and RPC clients.

Needs ``tools/refenv.sh`` to have run. Without it these tests are skipped, unless
``RPCNET_REFENV_INSTALL=1`` (run the installer first) or ``RPCNET_REQUIRE_REFENV=1`` (fail).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import Popen

import pytest
from support import refenv, require

VERSIONS = list(refenv.VERSIONS)


@pytest.fixture(scope="module", autouse=True)
def _require_refenv() -> None:
    if not refenv.available() and os.environ.get("RPCNET_REFENV_INSTALL") == "1":
        refenv.install()
    require.reference_env()


@pytest.fixture
def reference_server(tmp_path: Path) -> Iterator[Callable[..., tuple[Popen, str, Path]]]:
    """Factory: start a reference server, return (process, "host:port", log path)."""
    started: list[Popen] = []

    def start(version: str, **kwargs) -> tuple[Popen, str, Path]:
        port = refenv.free_port()
        log = tmp_path / f"server-{version}-{port}.log"
        proc = refenv.start_reference_server(version, port=port, log_path=log, **kwargs)
        started.append(proc)
        return proc, f"127.0.0.1:{port}", log

    yield start
    for proc in started:
        refenv.stop_process(proc)


@pytest.mark.parametrize("version", VERSIONS)
def test_reference_client_enumerates_reference_server(version: str, reference_server) -> None:
    proc, endpoint, log = reference_server(version)
    result = refenv.run_probe(version, "devices", endpoint, timeout=60)

    major, minor, patch = refenv.PROTOCOL[version]
    assert result["client_protocol"] == f"{major}.{minor}.{patch}"
    assert len(result["devices"]) == 1  # one CPU device served
    dev = result["devices"][0]
    assert dev["name"] == "RPC0"
    assert dev["description"] == endpoint  # the RPC client describes a device by its endpoint
    assert dev["total"] > 0 and 0 < dev["free"] <= dev["total"]
    assert dev["rpc_total"] == dev["total"]
    assert dev["alignment"] > 0 and dev["max_size"] > 0

    assert proc.poll() is None  # still serving after the client left
    text = log.read_text()
    assert f"Starting RPC server v{major}.{minor}.{patch}" in text
    assert "Accepted client connection" in text


@pytest.mark.parametrize(("client", "server"), [("v8", "v7"), ("v7", "v8")])
def test_version_mismatch_fails_fast(client: str, server: str, reference_server) -> None:
    proc, endpoint, _ = reference_server(server)
    with pytest.raises(refenv.ProbeError) as info:
        refenv.run_probe(client, "devices", endpoint, timeout=60)
    err = info.value
    assert not err.timed_out
    assert err.returncode not in (0, None)  # the native client aborts (SIGABRT)
    assert "version mismatch" in err.stderr
    assert proc.poll() is None  # the server survives a mismatched client


def test_stop_process_terminates_server(reference_server) -> None:
    proc, _, _ = reference_server("v8")
    assert refenv.stop_process(proc, timeout=10) is not None
    assert proc.poll() is not None


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require.module("gguf")
    from support.tinymodel import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("model") / "tiny.gguf")


@pytest.mark.parametrize("version", VERSIONS)
def test_teacher_forced_logits_over_rpc_match_local(
    version: str, tiny_model: Path, tmp_path: Path, reference_server
) -> None:
    np = require.module("numpy")
    tokens = "1,40,41,300,77,250,12,383"
    common = ["--model", tiny_model, "--tokens", tokens, "--prefill", "5"]
    local = refenv.run_probe(
        version,
        "generate",
        *common,
        "--endpoint",
        "local",
        "--out",
        tmp_path / "local",
        timeout=120,
    )
    _, endpoint, _ = reference_server(version)
    remote = refenv.run_probe(
        version,
        "generate",
        *common,
        "--endpoint",
        endpoint,
        "--out",
        tmp_path / "rpc",
        timeout=120,
    )
    assert remote["device"].startswith("RPC") and remote["finite"]
    a, b = np.load(local["logits_path"]), np.load(remote["logits_path"])
    assert a.shape == b.shape == (8, local["n_vocab"])
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def model_with_large_tensor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """output.weight is 2600 x 1024 f32 = 10.6 MB: above the client's 10 MiB hash threshold."""
    require.module("gguf")
    from support.tinymodel import write_tiny_llama

    path = tmp_path_factory.mktemp("model") / "large-tensor.gguf"
    return write_tiny_llama(
        path, n_vocab=2600, n_embd=1024, n_head=8, n_head_kv=8, n_ff=256, n_layer=1
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_hash_cache(
    version: str, model_with_large_tensor: Path, tmp_path: Path, reference_server
) -> None:
    cache = tmp_path / "rpc-cache"
    _, endpoint, log = reference_server(version, cache_dir=cache)
    assert f"local cache    : {cache}" in log.read_text()
    args = ["--model", model_with_large_tensor, "--endpoint", endpoint, "--tokens", "1,2,3"]
    first = refenv.run_probe(version, "generate", *args, "--out", tmp_path / "a", timeout=120)
    files = sorted(cache.iterdir())
    mtimes = [f.stat().st_mtime_ns for f in files]
    # SET_TENSOR_HASH missed, SET_TENSOR with cache_flag stored the bytes under their FNV-1a hash
    assert [f.stat().st_size for f in files] == [2600 * 1024 * 4]
    assert len(files[0].name) == 16 and int(files[0].name, 16) >= 0
    second = refenv.run_probe(version, "generate", *args, "--out", tmp_path / "b", timeout=120)
    # served from the cache (SET_TENSOR_HASH hit): nothing new written, nothing rewritten
    assert sorted(cache.iterdir()) == files
    assert [f.stat().st_mtime_ns for f in files] == mtimes
    assert first["argmax"] == second["argmax"]
