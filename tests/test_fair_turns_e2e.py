"""Fair turns with REAL v8 llama.cpp clients on one in-process server (real sockets on
127.0.0.1): one client's long prompt and another's decode steps run interleaved node by node,
and each client's teacher-forced logits equal, bit for bit, those it gets with the server to
itself. Meanwhile /metrics (real HTTP, parsed by prometheus_client) and /status show each
graph's wait for the device, overall and per client, and `rpcnet status` renders it."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rpcnet import statuscli
from rpcnet.compute import turns
from support.clients import generate
from support.inproc import ServerThread
from support.tinymodel import write_tiny_llama
from test_metrics import scrape

pytestmark = pytest.mark.usefixtures("refenv_required")

PROMPT = ",".join(str(5 + (7 * i) % 1000) for i in range(160))  # one batch of 160 tokens
DECODE = ",".join(str(11 + (13 * i) % 1000) for i in range(64))  # 4 prefilled, 60 decoded


def run_client(model: Path, port: int, out: Path, tokens: str, prefill: int, barrier: Path):
    n = 2 if barrier.name == "together" else 1
    return generate(
        model, port, tokens, out, "--prefill", prefill, "--barrier", barrier, "--barrier-n", n
    )


def test_interleaved_clients_keep_their_solo_logits_and_their_waits_are_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="rpcnet.server")
    # every plan with a known cost is long (runs in slices), and a long plan gives the device
    # back after each node whenever another client's work waits: the most interleaving
    monkeypatch.setattr(turns, "SHORT_SECONDS", 0.0)
    monkeypatch.setattr(turns, "SLICE_SECONDS", 0.0)
    model = write_tiny_llama(
        tmp_path / "m.gguf", n_vocab=1024, n_embd=512, n_layer=4, n_head=8, n_ff=1536
    )
    srv = ServerThread(mem=2 << 30, threads=2, metrics=("127.0.0.1", 0)).start()
    try:
        assert srv.server is not None and srv.server.metrics is not None
        device, mport = srv.server.devices[0], srv.server.metrics.port
        clients = [(PROMPT, 160), (DECODE, 4)]
        solo = []
        for i, (tokens, prefill) in enumerate(clients):
            result = run_client(
                model, srv.port, tmp_path / f"solo{i}", tokens, prefill, tmp_path / f"alone{i}"
            )
            solo.append(np.load(result["logits_path"]))
        slices_before = device.slices

        seen: list[dict] = []
        waits: list[dict] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                doc = statuscli.fetch("127.0.0.1", mport)
                if any(c["device_wait"]["graphs"] for c in doc["clients"]):
                    seen.append(doc)
                    m = scrape(mport)
                    waits.append(
                        {
                            k[1]: v
                            for k, v in m.items()
                            if k[0] == "rpcnet_client_device_wait_seconds_count"
                        }
                    )
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        together = tmp_path / "together"
        results: dict[int, dict] = {}
        threads = [
            threading.Thread(
                target=lambda i=i, c=c: results.__setitem__(
                    i, run_client(model, srv.port, tmp_path / f"both{i}", *c, together)
                )
            )
            for i, c in enumerate(clients)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join(10)
        assert len(results) == 2, "a client failed"
        for i, want in enumerate(solo):
            assert np.array_equal(np.load(results[i]["logits_path"]), want), i
        assert device.slices > slices_before, "no plan gave the device to the other client"

        m = scrape(mport)
        graphs = m[("rpcnet_graph_computes_total", ())] + m[("rpcnet_graph_recomputes_total", ())]
        waited = m[("rpcnet_device_wait_seconds_count", ())]
        assert 0 < waited <= graphs
        assert m[("rpcnet_device_wait_seconds_bucket", (("le", "+Inf"),))] == waited
        assert m[("rpcnet_device_wait_seconds_sum", ())] > 0  # someone waited for a turn
    finally:
        srv.stop()
    # each connection's close line has its wait; some client of the pair waited for a turn
    closes = [r.getMessage() for r in caplog.records if "closed after" in r.getMessage()]
    means = [float(m) for m in re.findall(r"device wait ([0-9.]+) ms mean", "\n".join(closes))]
    assert len(means) == len(closes) and max(means) > 0, closes
    # while connected, each client had its own histogram and its wait in /status
    assert seen and waits, "no /status snapshot showed a client's device wait"
    assert any(count > 0 for per_client in waits for count in per_client.values()), waits
    doc = max(seen, key=lambda d: sum(c["device_wait"]["graphs"] for c in d["clients"]))
    table = statuscli.render(doc)
    assert "WAIT" in table.splitlines()[table.splitlines().index("") + 1]
    for client in doc["clients"]:
        wait = client["device_wait"]
        assert wait["max_ms"] >= wait["mean_ms"] >= 0
        if wait["graphs"]:
            assert f"{wait['mean_ms']:.1f}/{wait['max_ms']:.0f} ms" in table
