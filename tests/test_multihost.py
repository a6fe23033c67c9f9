"""Multi-host: server-to-server allreduce (COMM_INIT / COMM_ALLREDUCE / COMM_FREE, spec §11),
2-D transfers and tensor split over several servers.

Two parts:

* white-box, with rpcnet's own client and in-process servers: allreduce semantics (f32 below
  32768 elements, bf16 with round-to-nearest-even above, f16/bf16 tensors), bit-exact
  interoperation with the REAL reference server as either rank, rank 0 waiting without blocking
  the server and timing out, rank 1 connect failure, links released on disconnect, a peer killed
  in the middle of an allreduce, malformed allreduces, COPY_TENSOR between buffers;
* the REAL v8 client (``generate`` probe, ``--split-mode tensor --tensor-split 1,1``, flash
  attention on) across two rpcnet servers, rpcnet + reference in both rank orders, the
  ``GGML_RPC_NO_COMM=1`` fallback, a layer split across three servers (two rpcnet, one
  reference), and a peer killed while the client decodes. Logits must be within 1e-3 relative
  (max |diff| / max |local|) of the client's local run, argmax equal at every position.

Reference-env parts are skipped without ``tools/refenv.sh`` (fail with
``RPCNET_REQUIRE_REFENV=1``).
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.client import RpcClient, ServerClosed
from rpcnet.compute.views import bf16_to_f32
from rpcnet.protocol.commands import Cmd
from support import refenv, require
from support.inproc import ServerThread
from support.serve import start_rpcnet
from support.waiting import wait_until

F32, F16, Q8_0, BF16 = 0, 1, 8, 30
LOOPBACK = "127.0.0.1"
TOL = 1e-3
TOKENS = "1,40,41,300,77,250,12,101"
PROBE_TIMEOUT = 180.0
MEM = 1 << 30


# ----------------------------------------------------------------------------- helpers


def free_port_pair(offset: int = 1000) -> int:
    """A port P with P and P + offset free (the client's comm port is rank 0's port + 1000)."""
    for _ in range(200):
        port = refenv.free_port()
        if port + offset >= 65536:
            continue
        try:
            with socket.socket() as probe:
                probe.bind((LOOPBACK, port + offset))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair")


def bf16_rne(x: np.ndarray) -> np.ndarray:
    """Independent f32 -> bf16 -> f32 (round to nearest even) for finite values."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return (rounded & 0xFFFFFFFF).astype(np.uint32).view(np.float32)


def tie_values(n: int, seed: int) -> np.ndarray:
    """Random f32 values, a third of them exactly halfway between two bf16 values."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    bits = x.view(np.uint32).copy()
    ties = rng.random(n) < 1 / 3
    bits[ties] = (bits[ties] & 0xFFFF0000) | 0x8000
    return bits.view(np.float32)


def tensor(handle: int, data: int, n: int, type_id: int = F32, tid: int = 1) -> _native.RpcTensor:
    return _native.RpcTensor(id=tid, type=type_id, buffer=handle, data=data, ne=(n, 1, 1, 1))


def allreduce_payload(t: _native.RpcTensor, device: int = 0) -> bytes:
    return struct.pack("<I", device) + t.to_bytes()


async def connect(port: int) -> RpcClient:
    return await RpcClient.connect(LOOPBACK, port)


async def link_pair(port0: int, port1: int, comm_port: int) -> tuple[RpcClient, RpcClient]:
    """Two connections whose device 0 are linked as rank 0 / rank 1 (both COMM_INITs at once)."""
    c0, c1 = await connect(port0), await connect(port1)
    ok0, ok1 = await asyncio.gather(
        c0.comm_init(0, 0, 2, comm_port), c1.comm_init(0, 1, 2, comm_port, LOOPBACK)
    )
    assert ok0 and ok1
    return c0, c1


async def upload(c: RpcClient, values: np.ndarray, type_id: int) -> tuple[_native.RpcTensor, int]:
    handle, _ = await c.alloc_buffer(values.nbytes + 4096)
    base = await c.buffer_base(handle)
    t = tensor(handle, base, values.size, type_id)
    await c.set_tensor(t, 0, values.tobytes())
    return t, handle


async def allreduce_both(
    c0: RpcClient, c1: RpcClient, x0: np.ndarray, x1: np.ndarray, type_id: int
) -> tuple[np.ndarray, np.ndarray]:
    t0, _ = await upload(c0, x0, type_id)
    t1, _ = await upload(c1, x1, type_id)
    await c0.post(Cmd.COMM_ALLREDUCE, allreduce_payload(t0))
    await c1.post(Cmd.COMM_ALLREDUCE, allreduce_payload(t1))
    got0 = np.frombuffer(await c0.get_tensor(t0, 0, x0.nbytes), dtype=x0.dtype)
    got1 = np.frombuffer(await c1.get_tensor(t1, 0, x1.nbytes), dtype=x1.dtype)
    return got0, got1


def links(srv: ServerThread) -> int:
    return srv.call(lambda: len(srv.server.comm.links))


def comm_stats(srv: ServerThread):
    return srv.call(lambda: srv.server.comm.stats)


async def until(predicate, timeout: float = 10.0, what: str = "condition") -> None:
    """wait_until for async tests: the test's own loop keeps running (its requests go out)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        await asyncio.sleep(0.01)


async def closes_soon(client, timeout: float = 10.0) -> None:
    """The server closes `client`'s connection within `timeout` (an allreduce runs after the
    commands that follow it have been answered, so its failure is noticed a little later)."""
    deadline = time.monotonic() + timeout
    with pytest.raises(ServerClosed):
        while time.monotonic() < deadline:
            await asyncio.wait_for(client.device_count(), timeout)
            await asyncio.sleep(0.05)


def exchanges_in_flight(srv: ServerThread) -> int:
    """Launched work (graphs, allreduce exchanges) the server's connections have not finished."""
    return srv.call(
        lambda: sum(
            not f.done() for c in srv.server.connections.values() for f in c.session._pending
        )
    )


def wait_released(srv: ServerThread, timeout: float = 10.0) -> None:
    wait_until(
        lambda: srv.connection_count() == 0 and srv.memory_held() == 0 and links(srv) == 0,
        timeout,
        f"release (connections {srv.connection_count()}, memory {srv.memory_held()}, "
        f"links {links(srv)})",
    )


def listen_address(port: int) -> str | None:
    """The local address of the LISTEN socket on `port` (/proc/net/tcp), None if none."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        addr, _, hex_port = fields[1].partition(":")
        if fields[3] == "0A" and int(hex_port, 16) == port:
            return socket.inet_ntoa(struct.pack("<I", int(addr, 16)))
    return None


def start_rpcnet_process(port: int, *extra: str) -> subprocess.Popen:
    # The rpcnet on this interpreter's path (installed, or PYTHONPATH=python in a checkout).
    return start_rpcnet(port, "--mem", "1G", *extra)


def require_refenv() -> None:
    require.reference_env("v8")


@pytest.fixture
def pair(server_factory):
    """Two rpcnet servers; the first one's port has a free port 1000 above it."""
    a = server_factory(mem=MEM, port=free_port_pair())
    b = server_factory(mem=MEM)
    return a, b


# ----------------------------------------------------------------------------- white-box


async def test_allreduce_semantics_between_two_rpcnet_servers(pair):
    a, b = pair
    comm_port = refenv.free_port()
    c0, c1 = await link_pair(a.port, b.port, comm_port)
    async with c0, c1:
        rng = np.random.default_rng(0)
        # F32 below the threshold: raw f32 on the wire, both ranks bit-identical.
        x0, x1 = (rng.standard_normal(32767).astype(np.float32) for _ in range(2))
        g0, g1 = await allreduce_both(c0, c1, x0, x1, F32)
        assert np.array_equal(g0, x0 + x1) and np.array_equal(g1, g0)
        # F32 from 32768 elements: bf16 (RNE) on the wire, local operand at full precision.
        x0, x1 = tie_values(40000, 1), tie_values(40000, 2)
        g0, g1 = await allreduce_both(c0, c1, x0, x1, F32)
        assert np.array_equal(g0, x0 + bf16_rne(x1))
        assert np.array_equal(g1, x1 + bf16_rne(x0))
        # Raw f16 larger than the sockets buffer: both directions block part-way.
        h0, h1 = (rng.standard_normal(3_000_000).astype(np.float16) for _ in range(2))
        g0, g1 = await allreduce_both(c0, c1, h0, h1, F16)
        assert np.array_equal(g0, h0 + h1) and np.array_equal(g1, g0)
        # F16 and BF16 tensors: raw bytes, added in the tensor's type.
        h0, h1 = (rng.standard_normal(1000).astype(np.float16) for _ in range(2))
        g0, g1 = await allreduce_both(c0, c1, h0, h1, F16)
        assert np.array_equal(g0, h0 + h1) and np.array_equal(g1, g0)
        b0, b1 = (
            (bf16_rne(rng.standard_normal(1000)).view(np.uint32) >> 16).astype(np.uint16)
            for _ in range(2)
        )
        g0, g1 = await allreduce_both(c0, c1, b0, b1, BF16)
        want = (bf16_rne(bf16_to_f32(b0) + bf16_to_f32(b1)).view(np.uint32) >> 16).astype(np.uint16)
        assert np.array_equal(g0, want) and np.array_equal(g1, want)
        # An empty tensor moves nothing; a repeated COMM_INIT answers ok at once.
        some, _ = await upload(c0, x0[:4], F32)
        empty = tensor(some.buffer, some.data, 0)
        await c0.post(Cmd.COMM_ALLREDUCE, allreduce_payload(empty))
        assert await c0.comm_init(0, 0, 2, 1)
        stats = comm_stats(a)
        assert stats.allreduces == 5
        assert stats.bytes_sent == 32767 * 4 + 40000 * 2 + 3_000_000 * 2 + 1000 * 2 + 1000 * 2
        # COMM_FREE drops the link; an allreduce without one closes the connection.
        await c0.post(Cmd.COMM_FREE, struct.pack("<I", 0))
        await c1.post(Cmd.COMM_FREE, struct.pack("<I", 0))
        assert await c0.device_count() == 1 and await c1.device_count() == 1
        assert links(a) == 0 and links(b) == 0
        t, _ = await upload(c0, x0[:8], F32)
        await c0.post(Cmd.COMM_ALLREDUCE, allreduce_payload(t))
        with pytest.raises(ServerClosed):
            await c0.device_count()
    wait_released(a)
    wait_released(b)


async def test_one_server_as_both_ranks(server):
    """Two connections of ONE server paired with each other: rank 0's wait must not block
    rank 1's connect (the reference server would deadlock here)."""
    c0, c1 = await link_pair(server.port, server.port, refenv.free_port())
    async with c0, c1:
        assert links(server) == 2
        x0, x1 = np.arange(16, dtype=np.float32), np.full(16, 0.5, np.float32)
        g0, g1 = await allreduce_both(c0, c1, x0, x1, F32)
        assert np.array_equal(g0, x0 + x1) and np.array_equal(g1, g0)
    wait_released(server)


@pytest.mark.parametrize("reference_rank", [0, 1])
async def test_allreduce_bit_exact_with_reference_server(server_factory, reference_rank):
    """rpcnet and the REAL rpc-server as a pair: same wire format, same rounding, same sums."""
    require_refenv()
    ours = server_factory(mem=MEM)
    ref_port = refenv.free_port()
    ref = refenv.start_reference_server("v8", port=ref_port)
    try:
        ports = (ref_port, ours.port) if reference_rank == 0 else (ours.port, ref_port)
        c0, c1 = await link_pair(*ports, refenv.free_port())
        async with c0, c1:
            # 6 MB of bf16 each way: more than the sockets buffer, so both directions block
            # part-way (rpcnet moves both at once; the reference sends or receives first)
            for n, seed in ((1000, 3), (40000, 4), (3_000_000, 7)):
                x0, x1 = tie_values(n, seed), tie_values(n, seed + 10)
                g0, g1 = await allreduce_both(c0, c1, x0, x1, F32)
                wire = bf16_rne if n >= 32768 else (lambda v: v)
                assert np.array_equal(g0, x0 + wire(x1)), f"rank 0, n={n}"
                assert np.array_equal(g1, x1 + wire(x0)), f"rank 1, n={n}"
            h0 = np.random.default_rng(5).standard_normal(500).astype(np.float16)
            h1 = np.random.default_rng(6).standard_normal(500).astype(np.float16)
            g0, g1 = await allreduce_both(c0, c1, h0, h1, F16)
            assert np.array_equal(g0, h0 + h1) and np.array_equal(g1, g0)
            await c0.post(Cmd.COMM_FREE, struct.pack("<I", 0))
            await c1.post(Cmd.COMM_FREE, struct.pack("<I", 0))
            assert await c0.device_count() == 1 and await c1.device_count() == 1
        wait_released(ours)
    finally:
        refenv.stop_process(ref)


async def test_rank0_waits_without_blocking_and_times_out(server_factory, caplog):
    srv = server_factory(mem=MEM, comm_timeout=2.0)
    comm_port = refenv.free_port()
    async with await connect(srv.port) as waiting, await connect(srv.port) as other:
        init = asyncio.ensure_future(waiting.comm_init(0, 0, 2, comm_port))
        await until(lambda: listen_address(comm_port) is not None, what="rank 0 listening")
        assert listen_address(comm_port) == LOOPBACK  # the server's host, not 0.0.0.0
        assert await other.device_count() == 1  # the server keeps serving meanwhile
        handle, _ = await other.alloc_buffer(4096)
        await other.free_buffer(handle)
        assert not init.done()
        assert not await asyncio.wait_for(init, 30)  # nobody came: ok = 0 after comm_timeout
        assert f"rank 0 via 127.0.0.1:{comm_port} failed: timed out" in caplog.text
        assert listen_address(comm_port) is None  # listener closed
        assert await waiting.device_count() == 1  # and the connection is still usable
    wait_released(srv)


async def test_rank1_without_listener_fails_cleanly(server_factory, caplog):
    srv = server_factory(mem=MEM, comm_timeout=1.0)
    async with await connect(srv.port) as c:
        port = refenv.free_port()
        assert not await c.comm_init(0, 1, 2, port, LOOPBACK)
        # Ended by comm_timeout (1 s), not after 100 refused retries (5 s, "no connection after").
        assert f"rank 1 via {LOOPBACK}:{port} failed: timed out" in caplog.text
        assert not await c.comm_init(0, 1, 2, 70000, LOOPBACK)  # port out of range
        assert not await c.comm_init(0, 1, 2, refenv.free_port(), "")  # no host
        assert await c.device_count() == 1
    wait_released(srv)


async def test_disconnect_without_comm_free_releases_link(pair):
    a, b = pair
    c0, c1 = await link_pair(a.port, b.port, refenv.free_port())
    t1, _ = await upload(c1, np.ones(64, np.float32), F32)
    await upload(c0, np.ones(64, np.float32), F32)
    assert links(a) == 1 and links(b) == 1
    await c0.close()  # no COMM_FREE
    wait_released(a)
    # The peer notices at its next allreduce: that connection closes, the server lives on.
    await c1.post(Cmd.COMM_ALLREDUCE, allreduce_payload(t1))
    await closes_soon(c1)
    await c1.close()
    wait_released(b)
    async with await connect(b.port) as fresh:
        assert await fresh.device_count() == 1


async def test_peer_killed_mid_allreduce(server_factory):
    """rank 1 blocks in an allreduce; its peer process dies: only that connection closes."""
    ours = server_factory(mem=MEM)
    peer_port = free_port_pair()
    peer = start_rpcnet_process(peer_port)
    try:
        c0, c1 = await link_pair(peer_port, ours.port, peer_port + 1000)
        bystander = await connect(ours.port)
        t1, _ = await upload(c1, np.arange(100000, dtype=np.float32), F32)
        await c1.post(Cmd.COMM_ALLREDUCE, allreduce_payload(t1))  # waits for rank 0's data
        await until(lambda: exchanges_in_flight(ours) == 1, what="allreduce")
        assert ours.connection_count() == 2 and links(ours) == 1
        peer.kill()
        peer.wait(10)
        await closes_soon(c1)
        assert await bystander.device_count() == 1
        for c in (c0, c1, bystander):
            await c.close()
        wait_released(ours)
    finally:
        peer.kill()
        peer.wait(10)


async def test_stalled_peer_fails_only_that_connection(server_factory, caplog):
    """The peer never reaches its allreduce (and never closes): a time limit ends the wait."""
    a = server_factory(mem=MEM, comm_timeout=0.5)  # allreduce limit: 10 x 0.5 s
    b = server_factory(mem=MEM, comm_timeout=0.5)
    c0, c1 = await link_pair(a.port, b.port, refenv.free_port())
    t1, _ = await upload(c1, np.ones(64, np.float32), F32)
    await c1.post(Cmd.COMM_ALLREDUCE, allreduce_payload(t1))  # rank 0 (c0) never joins
    await closes_soon(c1, 30)
    assert "sent nothing for 5 s" in caplog.text  # the allreduce limit ended it
    assert await c0.device_count() == 1  # the other side is untouched
    for c in (c0, c1):
        await c.close()
    wait_released(a)
    wait_released(b)


async def test_bad_allreduces_close_the_connection(pair):
    a, b = pair
    c0, c1 = await link_pair(a.port, b.port, refenv.free_port())
    async with c0, c1:
        handle, _ = await c0.alloc_buffer(4096)
        base = await c0.buffer_base(handle)
        quantized = tensor(handle, base, 64, Q8_0)  # no ggml ADD into q8_0: refused, not garbage
        await c0.post(Cmd.COMM_ALLREDUCE, allreduce_payload(quantized))
        with pytest.raises(ServerClosed):
            await c0.device_count()
        outside = tensor(handle, base + 4000, 64)  # past its buffer
        await c1.post(Cmd.COMM_ALLREDUCE, allreduce_payload(outside))
        with pytest.raises(ServerClosed):
            await c1.device_count()
    wait_released(a)
    wait_released(b)
    async with await connect(a.port) as c:
        await c.post(Cmd.COMM_ALLREDUCE, allreduce_payload(tensor(0, 0, 4), device=1))
        with pytest.raises(ServerClosed):  # device out of range
            await c.device_count()
    async with await connect(a.port) as c:
        await c.post(Cmd.COMM_FREE, struct.pack("<I", 5))
        with pytest.raises(ServerClosed):
            await c.device_count()


async def test_copy_tensor_between_buffers_of_one_connection(server):
    async with await connect(server.port) as c:
        values = np.arange(1024, dtype=np.float32)
        src, _ = await upload(c, values, F32)
        h2, _ = await c.alloc_buffer(8192)
        dst = tensor(h2, await c.buffer_base(h2) + 128, 1024, tid=2)
        held = server.memory_held()
        assert await c.copy_tensor(src, dst)
        assert await c.get_tensor(dst, 0, values.nbytes) == values.tobytes()
        assert server.memory_held() == held  # copied in place, nothing staged


# ----------------------------------------------------------------------------- real client


class CommandCounter:
    """Counts the commands the in-process servers receive (wraps the header check)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()
        self._orig = _native.check_header

    def __call__(self, proto: int, cmd: int, size: int, max_data: int, max_graph: int) -> None:
        with self._lock:
            self.counts[_native.command_name(proto, cmd)] += 1
        self._orig(proto, cmd, size, max_data, max_graph)

    def take(self) -> collections.Counter[str]:
        with self._lock:
            counts, self.counts = self.counts, collections.Counter()
        return counts


@pytest.fixture(scope="module")
def client_env(tmp_path_factory):
    require_refenv()
    require.module("gguf")
    from support.models import ZOO, ensure_model

    cache = os.environ.get("RPCNET_E2E_CACHE")
    zoo = Path(cache) if cache else tmp_path_factory.mktemp("zoo")
    work = tmp_path_factory.mktemp("multihost")
    counter = CommandCounter()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_native, "check_header", counter)
        yield {
            "model": lambda name: ensure_model(ZOO[name], zoo),
            "work": work,
            "counter": counter,
            "baselines": {},
            "n": [0],
        }


def run_generate(env: dict, model: str, endpoint: str, *args: str, extra_env=None) -> np.ndarray:
    env["n"][0] += 1
    result = refenv.run_probe(
        "v8",
        "generate",
        "--model",
        env["model"](model),
        "--endpoint",
        endpoint,
        "--out",
        env["work"] / f"{env['n'][0]:02d}",
        *args,
        timeout=PROBE_TIMEOUT,
        extra_env=extra_env,
    )
    if endpoint != "local":
        assert result["device"].startswith("RPC"), result
    return np.load(result["logits_path"])


def check_logits(env: dict, model: str, endpoints: list[str], args: tuple, **kw) -> float:
    key = (model, args)
    if key not in env["baselines"]:
        env["baselines"][key] = run_generate(env, model, "local", *args)
    ref = env["baselines"][key]
    got = run_generate(env, model, ",".join(endpoints), *args, *kw.pop("rpc_args", ()), **kw)
    assert got.shape == ref.shape and np.isfinite(got).all()
    rel = float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())
    assert rel <= TOL, f"rel error {rel:.3e} > {TOL:.0e}"
    bad = np.flatnonzero(got.argmax(axis=1) != ref.argmax(axis=1))
    assert not bad.size, f"argmax differs at positions {bad.tolist()}"
    return rel


DECODE = ("--tokens", TOKENS, "--prefill", "4", "--flash-attn", "1", "--threads", "1")
TENSOR_SPLIT = ("--split-mode", "tensor", "--tensor-split", "1,1")


def decode_counted(
    env: dict, endpoints: list[str], rpc_args: tuple, **kw
) -> collections.Counter[str]:
    """check_logits of the DECODE case; the commands the client sent the servers meanwhile."""
    env["counter"].take()
    check_logits(env, "llama-gqa-f32", endpoints, DECODE, rpc_args=rpc_args, **kw)
    return env["counter"].take()


def start_pair(kinds: tuple[str, ...], stack) -> tuple[list[str], list[ServerThread]]:
    """Servers by kind ("rpcnet" in-process or "reference"); the first has port + 1000 free."""
    endpoints, ours = [], []
    for i, kind in enumerate(kinds):
        port = free_port_pair() if i == 0 else refenv.free_port()
        if kind == "rpcnet":
            srv = ServerThread(mem=MEM, port=port).start()
            stack.callback(srv.stop)
            ours.append(srv)
        else:
            proc = refenv.start_reference_server("v8", port=port)
            stack.callback(refenv.stop_process, proc)
        endpoints.append(f"{LOOPBACK}:{port}")
    return endpoints, ours


@pytest.mark.parametrize(
    "kinds",
    [("rpcnet", "rpcnet"), ("rpcnet", "reference"), ("reference", "rpcnet")],
    ids=["rpcnet-pair", "rpcnet-rank0-reference-rank1", "reference-rank0-rpcnet-rank1"],
)
def test_tensor_split_real_client(client_env, kinds):
    with ExitStack() as stack:
        endpoints, ours = start_pair(kinds, stack)
        counts = decode_counted(client_env, endpoints, TENSOR_SPLIT)
        for srv in ours:
            stats = comm_stats(srv)
            # 5 llama_decode calls x 2 layers x 2 (attention, FFN) partial sums
            assert stats.links == 1 and stats.allreduces == 20, stats
            wait_released(srv)
        assert counts["COMM_INIT"] == len(ours) and counts["COMM_ALLREDUCE"] == 20 * len(ours)
        assert counts["SET_TENSOR_2D"] > 0 and counts["GET_TENSOR_2D"] > 0, counts


def test_tensor_split_bf16_wire_real_client(client_env):
    """256 prompt tokens x n_embd 128 = 32768 elements per partial sum: the bf16 wire format.
    bf16 rounding of the peer's partial costs precision (the reference pair shows the same,
    about 1.2e-3 here), so this case allows 2e-3."""
    tokens = ",".join(str((i * 37) % 300 + 3) for i in range(258))
    args = ("--tokens", tokens, "--prefill", "256", "--flash-attn", "1", "--threads", "1")
    with ExitStack() as stack:
        endpoints, ours = start_pair(("rpcnet", "rpcnet"), stack)
        ref = run_generate(client_env, "llama-gqa-f32", "local", *args)
        got = run_generate(client_env, "llama-gqa-f32", ",".join(endpoints), *args, *TENSOR_SPLIT)
        rel = float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())
        assert rel <= 2e-3, rel
        assert (got.argmax(axis=1) == ref.argmax(axis=1)).mean() > 0.97
        stats = comm_stats(ours[0])
        # prefill: 4 allreduces of 256 x 128 f32 as bf16; decode: 8 of 128 f32
        assert stats.bytes_sent == 4 * 32768 * 2 + 8 * 128 * 4, stats


def test_no_comm_fallback_two_rpcnet_servers(client_env):
    with ExitStack() as stack:
        endpoints, ours = start_pair(("rpcnet", "rpcnet"), stack)
        counts = decode_counted(
            client_env, endpoints, TENSOR_SPLIT, extra_env={"GGML_RPC_NO_COMM": "1"}
        )
        assert counts["COMM_INIT"] == 0 and counts["COMM_ALLREDUCE"] == 0, counts
        assert counts["SET_TENSOR_2D"] > 0 and counts["GET_TENSOR_2D"] > 0, counts
        for srv in ours:
            assert comm_stats(srv).links == 0
            wait_released(srv)


def test_layer_split_three_servers(client_env):
    """Two rpcnet servers and the reference: one of the three offloadable layers each."""
    with ExitStack() as stack:
        endpoints, ours = start_pair(("rpcnet", "reference", "rpcnet"), stack)
        counts = decode_counted(
            client_env, endpoints, ("--split-mode", "layer", "--tensor-split", "1,1,1")
        )
        assert counts["GRAPH_COMPUTE"] > 0 and counts["COMM_INIT"] == 0, counts
        for srv in ours:
            wait_released(srv)


def test_peer_killed_while_client_decodes(client_env):
    """The real client decodes with tensor split; its rank-1 server (a process) is killed.
    The client aborts (it has no retry); the surviving server frees everything and serves on."""
    ours = ServerThread(mem=MEM, port=free_port_pair()).start()
    peer_port = refenv.free_port()
    peer = start_rpcnet_process(peer_port)
    tokens = ",".join(str((i * 13) % 300 + 3) for i in range(400))
    args = ("--tokens", tokens, "--prefill", "1", "--flash-attn", "1", "--threads", "1")
    try:
        with ThreadPoolExecutor(1) as pool:
            endpoint = f"{ours.endpoint},{LOOPBACK}:{peer_port}"
            job = pool.submit(
                run_generate, client_env, "llama-gqa-f32", endpoint, *args, *TENSOR_SPLIT
            )
            wait_until(lambda: comm_stats(ours).allreduces >= 40, 60, "allreduces")
            peer.kill()
            with pytest.raises(refenv.ProbeError) as failure:
                job.result(PROBE_TIMEOUT)
            assert not failure.value.timed_out
        wait_released(ours)
        assert comm_stats(ours).allreduces < 4 * 399

        async def fresh() -> int:
            async with await connect(ours.port) as c:
                return await c.device_count()

        assert asyncio.run(fresh()) == 1
    finally:
        peer.kill()
        peer.wait(10)
        ours.stop()
