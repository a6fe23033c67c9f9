"""After the last client leaves, `rpcnet serve` gives its memory back to the OS.

A real llama.cpp v8 client loads a generated Q4_K_M model of ~100 MB (quantized by the real
quantizer) onto a real `rpcnet serve` process, decodes a few tokens (weights, KV cache, graph
plans, derived copies and NumPy temporaries all come to life, several hundred MiB at the peak)
and disconnects; the server's VmRSS, read from /proc, must come back within 64 MiB of what it was
after start.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support import models, refenv, serve
from support.clients import generate
from support.tinymodel import write_tiny_llama

pytestmark = pytest.mark.usefixtures("refenv_required")

MiB = 1 << 20
SLACK = 64 * MiB


def vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def settled_rss(pid: int, above: int, timeout: float = 20.0) -> int:
    """RSS once it stops falling (or drops to within `above`): frees finish after the close."""
    deadline = time.monotonic() + timeout
    rss = vm_rss(pid)
    while time.monotonic() < deadline and rss > above:
        time.sleep(0.25)
        rss = vm_rss(pid)
    return rss


def test_rss_returns_to_baseline_after_last_client(tmp_path):
    source = write_tiny_llama(
        tmp_path / "rss-f16.gguf", n_vocab=16384, n_layer=12, dtype="f16", **models.LLAMA_1024
    )
    model = tmp_path / "rss-q4_k_m.gguf"
    models.quantize_model(source, model, "Q4_K_M")
    source.unlink()
    assert model.stat().st_size > 90 * MiB  # ~100 MB
    port = refenv.free_port()
    proc = serve.start_rpcnet(port, "--mem", "4G", "--threads", "2")
    try:
        time.sleep(1.0)  # let start-up settle (imports, the accept loop)
        baseline = vm_rss(proc.pid)
        tokens = "1,5,9,300,17,42,7,99"
        out = generate(model, port, tokens, tmp_path, "--prefill", "4")
        assert out["n_tokens"] == 8
        peak = vm_rss(proc.pid)
        rss = settled_rss(proc.pid, baseline + SLACK)
        assert proc.poll() is None, "the server died"
        assert rss <= baseline + SLACK, (
            f"RSS {rss / MiB:.0f} MiB after the client left (at its exit {peak / MiB:.0f} MiB), "
            f"baseline {baseline / MiB:.0f} MiB"
        )
    finally:
        proc.terminate()
        proc.wait(10)
