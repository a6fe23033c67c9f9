"""Real llama.cpp v8 clients that load the same f16 model onto one `rpcnet serve` process.

The weights are held once: with three clients loaded at once the server's VmRSS (read from
/proc) is far below three copies, and /metrics counts the shared and saved bytes. With `--cache`,
the weights the client names by hash (those above 10 MiB) are answered from memory or from the
cache file. Every client's teacher-forced logits equal, bit for bit, those of one client alone,
and those of a server with sharing off (`RPCNET_SHARE_WEIGHTS=0`).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from support import refenv, serve
from support.clients import HeldClients, logits
from support.tinymodel import write_tiny_llama
from test_metrics import scrape
from test_rss_return import settled_rss, vm_rss

pytestmark = pytest.mark.usefixtures("refenv_required")

MiB = 1 << 20
TOKENS = "1,5,9,300,17,42,7,99"


def model_file(tmp_path: Path) -> Path:
    # every matrix >= 256 KiB (shared), the output matrix > 10 MiB (sent by hash first);
    # ~75 MB of f16 weights
    return write_tiny_llama(
        tmp_path / "shared-f16.gguf",
        n_vocab=8192,
        n_embd=768,
        n_layer=4,
        n_head=12,
        n_head_kv=4,
        n_ff=2048,
        dtype="f16",
    )


def held(model: Path, port: int, work: Path, n: int) -> HeldClients:
    """`n` clients loaded and held at their barrier until the test has looked at the server."""
    clients = HeldClients(model, port, work, n, n + 1, TOKENS, "--prefill", "4")
    clients.loaded(timeout=240.0)
    return clients


def finish(clients: HeldClients) -> list[np.ndarray]:
    clients.release()
    return [logits(r) for r in clients.wait()]


def test_clients_share_weights_keep_solo_logits_and_save_memory(tmp_path, monkeypatch):
    model = model_file(tmp_path)
    weights = model.stat().st_size
    port, mport = refenv.free_port(), refenv.free_port()
    cache = str(tmp_path / "cache")
    proc = serve.start_rpcnet(
        port, "--mem", "4G", "--threads", "2", "--metrics", str(mport), "--cache", cache
    )
    try:
        time.sleep(1.0)  # start-up settles (imports, the accept loop)
        baseline = vm_rss(proc.pid)
        solo = held(model, port, tmp_path / "solo", 1)
        one = vm_rss(proc.pid) - baseline
        (alone,) = finish(solo)
        settled_rss(proc.pid, baseline + 16 * MiB)  # its copy is gone before the next clients
        trio = held(model, port, tmp_path / "trio", 3)
        three = vm_rss(proc.pid) - baseline
        m = scrape(mport)
        together = finish(trio)
    finally:
        refenv.stop_process(proc)
    assert one > 0.8 * weights, (one, weights)  # the one copy is resident
    # two more clients add their compute buffers and KV cache, not two more copies
    assert three - one < 0.5 * weights, (three / MiB, one / MiB, weights / MiB)
    shared = m[("rpcnet_shared_bytes", (("device", "CPU"),))]
    saved = m[("rpcnet_shared_saved_bytes", (("device", "CPU"),))]
    # all but the token embeddings (llama.cpp keeps them on the client), each used 3 times
    assert shared > 0.8 * weights and saved == 2 * shared, (shared, saved, weights)
    for each in together:
        assert np.array_equal(each, alone)
    # the output matrix, by hash: a miss for the solo client (then uploaded and stored), then
    # each of the three answered once, from memory or (before it was held) from the cache file
    answers = m[("rpcnet_shared_hash_answers_total", (("device", "CPU"),))]
    assert m[("rpcnet_hash_cache_misses_total", ())] == 1
    assert answers + m[("rpcnet_hash_cache_hits_total", ())] == 3, answers

    # the same client on a server that does not share: the same bits
    monkeypatch.setenv("RPCNET_SHARE_WEIGHTS", "0")
    port = refenv.free_port()
    proc = serve.start_rpcnet(port, "--mem", "4G", "--threads", "2")
    try:
        (plain,) = finish(held(model, port, tmp_path / "unshared", 1))
    finally:
        refenv.stop_process(proc)
    assert np.array_equal(plain, alone)
