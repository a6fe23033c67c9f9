"""`serve --metrics`: /metrics and /status scraped over real HTTP while a real llama.cpp client
decodes, `rpcnet status`, the close/progress log lines and `-v`/`-vv` levels.

Oracles: a byte-counting TCP relay between client and server (what was really sent each way),
the GGUF's tensor sizes read by the `gguf` package, prometheus_client's own text parser.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import urllib.error
import urllib.request

import gguf
import pytest
from prometheus_client.parser import text_string_to_metric_families
from rpcnet import _native
from rpcnet.client import RpcClient
from rpcnet.protocol import messages as msg
from rpcnet.protocol.commands import Cmd
from rpcnet.server import stats as stats_module
from support import refenv
from support.cli_run import run_cli
from support.countproxy import CountingProxy
from support.inproc import ServerThread
from support.serve import start_rpcnet
from support.tinymodel import write_tiny_llama
from support.waiting import wait_until

TOKENS = ",".join(str(t) for t in range(1, 33))  # 4 prefilled, 28 decoded one by one


def http_get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        assert resp.status == 200
        return resp.read()


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics as {(name, sorted labels): value}, parsed by prometheus_client."""
    text = http_get(port, "/metrics").decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def status(port: int) -> dict:
    return json.loads(http_get(port, "/status"))


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("m") / "tiny.gguf", n_layer=2)


def weight_bytes(path) -> int:
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors)


def test_metrics_and_status_follow_a_real_client(tmp_path, tiny_model):
    port, mport = refenv.free_port(), refenv.free_port()
    proc = start_rpcnet(port, "--mem", "2G", "--metrics", f"127.0.0.1:{mport}", capture=True)
    proxy = CountingProxy(port)
    try:
        before = status(mport)
        assert before["dialect"] == "8.0.0" and before["clients"] == []
        assert before["devices"][0]["capacity"] == 2 << 30
        accepted_before = before["totals"]["connections_accepted"]  # the readiness probe

        seen: list[dict] = []
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                doc = status(mport)
                if doc["clients"]:
                    seen.append(doc)
                time.sleep(0.005)  # many snapshots, even on a loaded host

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        out = refenv.run_probe(
            "v8",
            "generate",
            "--model",
            tiny_model,
            "--endpoint",
            proxy.endpoint,
            "--tokens",
            TOKENS,
            "--prefill",
            "4",
            "--out",
            tmp_path,
            timeout=240,
        )
        done.set()
        watcher.join(10)
        assert out["finite"] and out["n_tokens"] == 32
        proxy.join()

        # The client appeared while it ran: holding buffers, its bytes moving.
        assert seen, "no /status snapshot showed the client"
        clients = [c for doc in seen for c in doc["clients"]]
        assert {c["peer"].rsplit(":", 1)[0] for c in clients} == {"127.0.0.1"}
        # Some snapshot caught it holding buffers (not necessarily the last one: a snapshot taken
        # between its FREE_BUFFERs and its close shows the most bytes in and nothing held).
        holding = [c for c in clients if c["buffers"] > 0]
        assert holding, "no /status snapshot showed the client holding a buffer"
        assert all(c["bytes_held"] > 0 for c in holding)
        biggest = max(clients, key=lambda c: c["bytes_in"])
        in_seen = sorted(c["bytes_in"] for c in clients if c["peer"] == biggest["peer"])
        assert in_seen[0] < in_seen[-1], "bytes_in of the client did not move"

        # ... and is gone now, with the totals exactly what crossed the wire.
        after = status(mport)
        assert after["clients"] == []
        m = scrape(mport)
        assert m[("rpcnet_connections_open", ())] == 0
        assert m[("rpcnet_connections_accepted_total", ())] == (accepted_before + proxy.connections)
        assert m[("rpcnet_received_bytes_total", ())] == proxy.to_server
        assert m[("rpcnet_sent_bytes_total", ())] == proxy.to_client
        assert after["totals"]["bytes_in"] == proxy.to_server
        # Every weight was uploaded: received >= the model's tensor bytes.
        assert proxy.to_server >= weight_bytes(tiny_model)
        assert m[("rpcnet_graph_computes_total", ())] >= 1
        assert m[("rpcnet_graph_recomputes_total", ())] >= 20  # the single-token decodes
        # Kernel time by op: every decode step ran matrix products on the CPU device.
        matmul = (("device", "cpu"), ("op", "MUL_MAT"))
        assert m[("rpcnet_kernel_calls_total", matmul)] >= 32
        assert m[("rpcnet_kernel_seconds_total", matmul)] > 0
        sets = m[("rpcnet_commands_total", (("command", "SET_TENSOR"),))]
        assert sets >= len(gguf.GGUFReader(str(tiny_model)).tensors)
        hist = m[("rpcnet_command_seconds_count", (("command", "SET_TENSOR"),))]
        assert hist == sets
        inf = m[("rpcnet_command_seconds_bucket", (("command", "SET_TENSOR"), ("le", "+Inf")))]
        assert inf == sets
        # All buffers were released when the client left.
        assert m[("rpcnet_device_memory_held_bytes", (("device", "CPU"),))] == 0
        assert m[("rpcnet_device_memory_capacity_bytes", (("device", "CPU"),))] == 2 << 30
        # one client: no decode step ran joined with another's
        assert m[("rpcnet_joint_runs_total", (("device", "CPU"),))] == 0
        assert m[("rpcnet_joint_plans_total", (("device", "CPU"),))] == 0
        assert not [k for k in m if k[0] == "rpcnet_client_buffer_bytes"]

        table = run_cli("status", f"127.0.0.1:{mport}", timeout=30)
        assert table.returncode == 0, table.stderr
        assert "ggml RPC 8.0.0" in table.stdout and "(no clients connected)" in table.stdout
        as_json = run_cli("status", f"127.0.0.1:{mport}", "--json", timeout=30)
        assert json.loads(as_json.stdout)["totals"]["bytes_in"] == proxy.to_server
    finally:
        proxy.close()
        log = stop(proc)
    # One INFO close line per connection, with its totals.
    closes = [line for line in log.splitlines() if "closed after" in line]
    assert len(closes) == accepted_before + proxy.connections
    assert all(" INFO " in line and "graphs" in line and "peak" in line for line in closes)


def test_status_lists_a_connected_client_mid_command():
    """A client holding a buffer shows up in /status and rpcnet status' table; then leaves."""
    srv = ServerThread(proto=8, mem=1 << 30, metrics=("127.0.0.1", 0)).start()
    try:
        mport = srv.call(lambda: srv.server.metrics.port)

        async def session() -> tuple[dict, str, dict]:
            async with await RpcClient.connect("127.0.0.1", srv.port) as client:
                handle, size = await client.alloc_buffer(3 << 20)
                assert handle
                doc = await asyncio.to_thread(status, mport)
                table = await asyncio.to_thread(run_cli, "status", f"127.0.0.1:{mport}", timeout=30)
                # A SET_TENSOR whose payload is half sent: the server is inside that command.
                base = await client.buffer_base(handle)
                t = _native.RpcTensor(id=1, type=0, buffer=handle, data=base, ne=(1 << 18, 1, 1, 1))
                frame = msg.request(Cmd.SET_TENSOR, msg.set_tensor_payload(t, 0, bytes(1 << 20)))
                client.writer.write(frame[: len(frame) // 2])
                await client.writer.drain()
                await asyncio.sleep(0.3)
                busy = await asyncio.to_thread(status, mport)
                client.writer.write(frame[len(frame) // 2 :])
                assert await client.device_count() == 1
                return doc, table.stdout, busy

        doc, table, busy = asyncio.run(session())
        (client,) = doc["clients"]
        assert client["buffers"] == 1 and client["bytes_held"] == 3 << 20
        assert client["command"] is None  # idle between commands
        assert client["peer"] in table and "3.0 MiB" in table
        (client,) = busy["clients"]
        assert client["command"] == "SET_TENSOR" and client["command_s"] >= 0.25
        deadline = time.monotonic() + 10
        while status(mport)["clients"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(mport)["clients"] == []
    finally:
        srv.stop()


def test_metrics_endpoint_obeys_allow():
    """--allow without loopback: the RPC port and the metrics port both refuse 127.0.0.1."""
    srv = ServerThread(
        proto=8, mem=1 << 30, metrics=("127.0.0.1", 0), allow=(_net("10.0.0.0/8"),)
    ).start()
    try:
        mport = srv.call(lambda: srv.server.metrics.port)
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            http_get(mport, "/metrics")
        refused = srv.call(lambda: dict(srv.server.stats.refused))
        assert refused == {"allowlist": 1}
    finally:
        srv.stop()


def _net(text: str):
    import ipaddress

    return ipaddress.ip_network(text)


def test_unknown_path_is_404():
    srv = ServerThread(proto=8, mem=1 << 30, metrics=("127.0.0.1", 0)).start()
    try:
        mport = srv.call(lambda: srv.server.metrics.port)
        with pytest.raises(urllib.error.HTTPError) as err:
            http_get(mport, "/nope")
        assert err.value.code == 404
    finally:
        srv.stop()


def test_upload_progress_lines(monkeypatch, caplog):
    """Over 256 MiB of SET_TENSOR: 'uploading' progress lines, then 'upload done' at close."""
    monkeypatch.setattr(stats_module, "UPLOAD_REPORT_EVERY", 0.0)
    size, chunk = 272 << 20, 16 << 20
    srv = ServerThread(proto=8, mem=1 << 30).start()
    caplog.set_level("INFO", logger="rpcnet.server")
    try:

        async def upload() -> None:
            async with await RpcClient.connect("127.0.0.1", srv.port) as client:
                handle, _ = await client.alloc_buffer(size)
                base = await client.buffer_base(handle)
                tensor = _native.RpcTensor(
                    id=1, type=0, buffer=handle, ne=(size // 4, 1, 1, 1), data=base, name="w"
                )
                data = bytes(chunk)
                for offset in range(0, size, chunk):
                    await client.set_tensor(tensor, offset, data)
                await client.device_count()

        asyncio.run(upload())
        deadline = time.monotonic() + 10
        while not any("upload done" in r.message for r in caplog.records):
            assert time.monotonic() < deadline, "no 'upload done' line"
            time.sleep(0.05)
    finally:
        srv.stop()
    progress = [r.message for r in caplog.records if "uploading:" in r.message]
    assert progress, "no progress line"
    # Lines start once more than 256 MiB arrived; the MB figure is what was received so far.
    first_mb = int(progress[0].split("uploading: ")[1].split(" MB")[0])
    assert int((256 << 20) / 1e6) <= first_mb <= size / 1e6 + 1
    done = next(r.message for r in caplog.records if "upload done" in r.message)
    assert f"{size / 1e6:.0f} MB received" in done


@pytest.mark.parametrize(
    "flags,debug,trace", [((), False, False), (("-v",), True, False), (("-vv",), True, True)]
)
def test_verbosity_flags_change_the_level(flags, debug, trace):
    port = refenv.free_port()
    proc = start_rpcnet(port, "--mem", "1G", *flags, capture=True)
    try:
        refenv.run_probe("v8", "devices", f"127.0.0.1:{port}", timeout=60)
    finally:
        log = stop(proc)
    assert "closed after" in log  # INFO at every level
    assert (" DEBUG " in log) == debug
    assert (" TRACE " in log) == trace


def test_comm_metrics_count_allreduces():
    """Two connections of one server paired as rank 0 and rank 1: each COMM_ALLREDUCE of 16 f32
    (raw f32 on the wire below 32768 elements) shows in the comm and command counters."""
    import struct

    import numpy as np

    srv = ServerThread(proto=8, mem=1 << 30, metrics=("127.0.0.1", 0)).start()
    try:
        mport = srv.call(lambda: srv.server.metrics.port)
        comm_port = refenv.free_port()

        async def go() -> None:
            c0 = await RpcClient.connect("127.0.0.1", srv.port)
            c1 = await RpcClient.connect("127.0.0.1", srv.port)
            async with c0, c1:
                ok = await asyncio.gather(
                    c0.comm_init(0, 0, 2, comm_port), c1.comm_init(0, 1, 2, comm_port, "127.0.0.1")
                )
                assert all(ok)
                tensors = []
                for c, fill in ((c0, 1.0), (c1, 2.0)):
                    handle, _ = await c.alloc_buffer(64)
                    base = await c.buffer_base(handle)
                    t = _native.RpcTensor(id=1, type=0, buffer=handle, data=base, ne=(16, 1, 1, 1))
                    await c.set_tensor(t, 0, np.full(16, fill, np.float32).tobytes())
                    tensors.append(t)
                await c0.post(Cmd.COMM_ALLREDUCE, struct.pack("<I", 0) + tensors[0].to_bytes())
                await c1.post(Cmd.COMM_ALLREDUCE, struct.pack("<I", 0) + tensors[1].to_bytes())
                got = np.frombuffer(await c0.get_tensor(tensors[0], 0, 64), np.float32)
                assert (got == 3.0).all()
                await c1.device_count()

        asyncio.run(go())
        # rank 1's allreduce is counted when its own side finishes, which may follow the
        # replies the client has seen
        wait_until(
            lambda: scrape(mport).get(("rpcnet_comm_allreduces_total", ())) == 2,
            what="both ranks' allreduce counted",
        )
        m = scrape(mport)
        assert m[("rpcnet_comm_bytes_total", (("direction", "sent"),))] == 2 * 64
        assert m[("rpcnet_comm_bytes_total", (("direction", "received"),))] == 2 * 64
        assert m[("rpcnet_commands_total", (("command", "COMM_ALLREDUCE"),))] == 2
    finally:
        srv.stop()


def test_hash_cache_metrics(tmp_path):
    """Two 1 MiB uploads with the cache flag into a 1.5 MiB cache: both written, the older one
    evicted; then a hash lookup of each: the evicted one misses, the other hits."""
    mib = 1 << 20
    srv = ServerThread(
        proto=8, mem=1 << 30, metrics=("127.0.0.1", 0), cache_dir=tmp_path, cache_max=mib * 3 // 2
    ).start()
    try:
        mport = srv.call(lambda: srv.server.metrics.port)
        blobs = [bytes([i + 1]) * mib for i in range(2)]

        async def go() -> list[bool]:
            ne = (mib // 4, 1, 1, 1)
            async with await RpcClient.connect("127.0.0.1", srv.port) as c:
                handle, _ = await c.alloc_buffer(mib)
                base = await c.buffer_base(handle)
                t = _native.RpcTensor(id=1, type=0, buffer=handle, data=base, ne=ne)
                for blob in blobs:
                    await c.set_tensor(t, 0, blob, cache=True)
                    await c.device_count()  # the store has finished
            while srv.memory_held():  # gone from memory too: the lookups go to the cache
                await asyncio.sleep(0.01)
            async with await RpcClient.connect("127.0.0.1", srv.port) as c:
                handle, _ = await c.alloc_buffer(mib)
                base = await c.buffer_base(handle)
                t = _native.RpcTensor(id=1, type=0, buffer=handle, data=base, ne=ne)
                return [await c.set_tensor_hash(t, 0, _native.fnv1a64(b)) for b in blobs]

        assert asyncio.run(go()) == [False, True]
        m = scrape(mport)
        assert m[("rpcnet_hash_cache_written_bytes_total", ())] == 2 * mib
        assert m[("rpcnet_hash_cache_evictions_total", ())] == 1
        assert m[("rpcnet_hash_cache_hits_total", ())] == 1
        assert m[("rpcnet_hash_cache_misses_total", ())] == 1
    finally:
        srv.stop()
