"""Differential conformance: identical request sequences to the REAL reference rpc-server and to
rpcnet; every observable response (or close) must agree.

Handles and base addresses are opaque and differ by design, so the scenarios record what a
client can rely on (non-zero, aligned, sizes) and use each server's own values in later frames.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pytest
from rpcnet import _native
from support import refenv
from support.raw import RawConn, frame

pytestmark = pytest.mark.usefixtures("refenv_required")

ALLOC, ALIGN, MAXSZ, BASE, FREE, CLEAR, SET, HASH, GET, COPY, GRAPH = range(11)
MEM, INIT, ALLOC_SIZE, HELLO, COUNT, RECOMPUTE, MEMSET, SET2D, GET2D, COMM_INIT = (
    11,
    12,
    13,
    14,
    15,
    16,
    17,
    18,
    19,
    20,
)


class Approx:
    """Float results: kernels may round differently from ggml's, within float32 noise."""

    def __init__(self, raw: bytes) -> None:
        self.values = np.frombuffer(raw, np.float32)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Approx) and np.allclose(
            self.values, other.values, rtol=1e-5, atol=1e-5
        )

    def __repr__(self) -> str:
        return f"Approx({self.values.tolist()})"


class Driver:
    """Sends frames to one server and records client-observable results."""

    def __init__(self, port: int, proto: int) -> None:
        self.port = port
        self.proto = proto
        self.log: list[object] = []
        self.conn = RawConn(port)

    def record(self, *item: object) -> None:
        self.log.append(item)

    def reconnect(self) -> None:
        self.conn.close()
        self.conn = RawConn(self.port)

    def call(self, cmd: int, payload: bytes, expected: int) -> bytes:
        return self.conn.call(cmd, payload, expected)

    def post(self, cmd: int, payload: bytes) -> None:
        self.conn.send(frame(cmd, payload))

    def alloc(self, size: int) -> tuple[int, int]:
        handle, got = struct.unpack("<QQ", self.call(ALLOC, struct.pack("<IQ", 0, size), 16))
        self.record("alloc", size, handle != 0, got)
        if handle == 0:
            return 0, 0
        base = struct.unpack("<Q", self.call(BASE, struct.pack("<Q", handle), 8))[0]
        self.record("base", size, base != 0, base % 32 == 0)
        return handle, base

    def expect_close(self, name: str, data: bytes) -> None:
        self.conn.send(data)
        self.record("closes", name, self.conn.closed_by_peer())
        self.reconnect()

    def sync(self) -> None:
        """A round trip, so fire-and-forget commands before it have taken effect."""
        self.record("count", struct.unpack("<I", self.call(COUNT, b"", 4))[0])

    def close(self) -> None:
        self.conn.close()


def t(**kw) -> _native.RpcTensor:
    kw.setdefault("id", 1)
    return _native.RpcTensor(**kw)


def sc_queries(d: Driver) -> None:
    d.sync()
    d.record("align", d.call(ALIGN, struct.pack("<I", 0), 8))
    d.record("max", d.call(MAXSZ, struct.pack("<I", 0), 8))
    free, total = struct.unpack("<QQ", d.call(MEM, struct.pack("<I", 0), 16))
    d.record("mem", total > 0 and 0 < free <= total)
    for ty, ne in [
        (0, (4, 1, 1, 1)),
        (8, (64, 3, 1, 1)),
        (12, (256, 2, 1, 1)),
        (1, (7, 5, 3, 2)),
        (30, (9, 1, 1, 1)),
    ]:
        d.record(
            "alloc_size",
            ty,
            d.call(
                ALLOC_SIZE, struct.pack("<I", 0) + t(type=ty, ne=ne).to_bytes() + bytes(2960), 8
            ),
        )


def sc_data(d: Driver) -> None:
    h, b = d.alloc(8192)
    h0, _ = d.alloc(0)
    d.post(CLEAR, struct.pack("<QB", h, 0))
    x = t(type=0, buffer=h, data=b + 256, ne=(64, 1, 1, 1))
    values = np.arange(64, dtype=np.float32).tobytes()
    d.post(SET, x.to_bytes() + b"\0" + struct.pack("<Q", 0) + values)
    d.record("get", d.call(GET, x.to_bytes() + struct.pack("<QQ", 0, 256), 256))
    d.record("get part", d.call(GET, x.to_bytes() + struct.pack("<QQ", 40, 20), 20))
    d.record("get empty", d.call(GET, x.to_bytes() + struct.pack("<QQ", 0, 0), 0))
    d.post(MEMSET, x.to_bytes() + struct.pack("<QQB", 4, 12, 0xAB))
    d.record("after memset", d.call(GET, x.to_bytes() + struct.pack("<QQ", 0, 32), 32))
    y = t(type=0, buffer=h, data=b + 4096, ne=(64, 1, 1, 1), id=2)
    d.record("copy", d.call(COPY, x.to_bytes() + y.to_bytes(), 1))
    d.record("copied", d.call(GET, y.to_bytes() + struct.pack("<QQ", 0, 256), 256))
    d.post(INIT, t(type=8, buffer=h, data=b, ne=(32, 1, 1, 1)).to_bytes())
    d.post(INIT, t(type=8, ne=(32, 1, 1, 1)).to_bytes())  # no buffer: ignored
    if d.proto == 8:
        rows = bytes(range(48))
        d.post(SET2D, x.to_bytes() + struct.pack("<QQQQ", 8, 16, 3, 64) + rows)
        d.record("get2d", d.call(GET2D, x.to_bytes() + struct.pack("<QQQQ", 0, 32, 3, 64), 96))
        d.record(
            "get2d stride0", d.call(GET2D, x.to_bytes() + struct.pack("<QQQQ", 8, 16, 2, 0), 32)
        )
        d.record("comm bad world", d.call(COMM_INIT, struct.pack("<IIII64s", 0, 0, 3, 1, b""), 1))
    d.post(FREE, struct.pack("<Q", h0))
    d.sync()
    d.record("alloc huge", d.call(ALLOC, struct.pack("<IQ", 0, 1 << 60), 16))
    d.post(FREE, struct.pack("<Q", h))
    d.sync()


def graph_payload(
    proto: int, uid: int, nodes: list[int], tensors: list[_native.RpcTensor]
) -> bytes:
    head = struct.pack("<I", 0) + (b"" if proto == 7 else struct.pack("<Q", uid))
    body = struct.pack("<I", len(nodes)) + b"".join(struct.pack("<Q", n) for n in nodes)
    return head + body + struct.pack("<I", len(tensors)) + b"".join(x.to_bytes() for x in tensors)


def sc_graph(d: Driver) -> None:
    rng = np.random.default_rng(3)
    h, b = d.alloc(1 << 16)
    w = t(type=0, buffer=h, data=b, ne=(32, 8, 1, 1), id=1)
    x = t(type=0, buffer=h, data=b + 2048, ne=(32, 4, 1, 1), id=2)
    bias = t(type=0, buffer=h, data=b + 4096, ne=(8, 1, 1, 1), id=3)
    mm = t(type=0, buffer=h, data=b + 8192, ne=(8, 4, 1, 1), id=4, op=29, src=(1, 2), flags=16)
    out = t(type=0, buffer=h, data=b + 12288, ne=(8, 4, 1, 1), id=5, op=2, src=(4, 3), flags=16)
    skipped = t(type=0, buffer=h, data=b + 16384, ne=(8, 4, 1, 1), id=6, op=2, src=(4, 3), flags=0)
    d.post(CLEAR, struct.pack("<QB", h, 0))
    for tensor, arr in [
        (w, rng.standard_normal((8, 32))),
        (x, rng.standard_normal((4, 32))),
        (bias, rng.standard_normal(8)),
    ]:
        d.post(
            SET, tensor.to_bytes() + b"\0" + struct.pack("<Q", 0) + arr.astype(np.float32).tobytes()
        )
    d.post(GRAPH, graph_payload(d.proto, 7, [4, 5, 6], [w, x, mm, bias, out, skipped]))
    d.record("graph out", Approx(d.call(GET, out.to_bytes() + struct.pack("<QQ", 0, 128), 128)))
    d.record("skipped untouched", d.call(GET, skipped.to_bytes() + struct.pack("<QQ", 0, 128), 128))
    d.post(SET, bias.to_bytes() + b"\0" + struct.pack("<Q", 0) + np.ones(8, np.float32).tobytes())
    d.post(RECOMPUTE, struct.pack("<I", 0) if d.proto == 7 else struct.pack("<IQ", 0, 7))
    d.record("recomputed", Approx(d.call(GET, out.to_bytes() + struct.pack("<QQ", 0, 128), 128)))
    d.post(FREE, struct.pack("<Q", h))
    d.expect_close(
        "recompute after free",
        frame(RECOMPUTE, struct.pack("<I", 0) if d.proto == 7 else struct.pack("<IQ", 0, 7)),
    )


def sc_closes(d: Driver) -> None:
    """Inputs the spec marks as [verified] closes of the reference."""
    d.expect_close("unknown cmd", frame(60))
    d.expect_close("wrong fixed size", frame(ALIGN, b"\0" * 5))
    d.expect_close("device out of range", frame(ALIGN, struct.pack("<I", 1)))
    d.expect_close("second hello", frame(HELLO, bytes(24)))
    d.expect_close("forged base", frame(BASE, struct.pack("<Q", 0x1234)))
    d.expect_close(
        "truncated graph",
        frame(GRAPH, graph_payload(d.proto, 0, [1, 2, 3], [])[:-4] + struct.pack("<I", 1)),
    )
    h, b = d.alloc(4096)
    d.expect_close(
        "type 43",
        frame(
            GET, t(type=43, buffer=h, data=b, nb=(4, 4, 4, 4)).to_bytes() + struct.pack("<QQ", 0, 4)
        ),
    )
    h, b = d.alloc(4096)
    d.expect_close(
        "past buffer",
        frame(
            GET, t(buffer=h, data=b + 4092, ne=(1, 1, 1, 1)).to_bytes() + struct.pack("<QQ", 4, 4)
        ),
    )
    h, b = d.alloc(4096)
    d.expect_close(
        "no buffer", frame(GET, t(buffer=0, data=0).to_bytes() + struct.pack("<QQ", 0, 4))
    )
    if d.proto == 8:
        d.expect_close("NONE marker", frame(23))
        h, b = d.alloc(4096)
        x = t(buffer=h, data=b, ne=(16, 1, 1, 1)).to_bytes()
        d.expect_close(
            "2d bad sizes", frame(SET2D, x + struct.pack("<QQQQ", 0, 4, 3, 8) + bytes(11))
        )
        d.expect_close("recompute unknown", frame(RECOMPUTE, struct.pack("<IQ", 0, 99)))
    else:
        d.expect_close("v7 NONE marker", frame(18))
        d.expect_close("v7 has no 2D", frame(19, bytes(328)))


def sc_hash(d: Driver) -> None:
    data = (np.arange(1 << 14, dtype=np.uint32) * 2654435761).astype(np.uint32).tobytes()
    digest = _native.fnv1a64(data)
    h, b = d.alloc(1 << 17)
    x = t(type=24, buffer=h, data=b, ne=(len(data), 1, 1, 1))
    d.record("hash miss", d.call(HASH, x.to_bytes() + struct.pack("<QQ", 0, digest), 1))
    d.post(SET, x.to_bytes() + b"\1" + struct.pack("<Q", 0) + data)
    d.sync()
    d.post(CLEAR, struct.pack("<QB", h, 0))
    d.record("hash hit", d.call(HASH, x.to_bytes() + struct.pack("<QQ", 0, digest), 1))
    d.record("restored", d.call(GET, x.to_bytes() + struct.pack("<QQ", 0, 64), 64))
    d.expect_close(
        "hash hit out of range",
        frame(HASH, x.to_bytes() + struct.pack("<QQ", (1 << 16) + 4, digest)),
    )


SCENARIOS: dict[str, Callable[[Driver], None]] = {
    "queries": sc_queries,
    "data": sc_data,
    "graph": sc_graph,
    "closes": sc_closes,
    "hash": sc_hash,
}


def transcript(port: int, proto: int, scenario: Callable[[Driver], None]) -> list[object]:
    d = Driver(port, proto)
    try:
        scenario(d)
    finally:
        d.close()
    return d.log


@pytest.fixture(scope="module", params=["v8", "v7"])
def servers(request, tmp_path_factory):
    from support.inproc import ServerThread

    version = request.param
    proto = 8 if version == "v8" else 7
    ref_cache = tmp_path_factory.mktemp(f"ref-cache-{version}")
    our_cache = tmp_path_factory.mktemp(f"rpcnet-cache-{version}")
    ref_port = refenv.free_port()
    ref = refenv.start_reference_server(version, port=ref_port, cache_dir=ref_cache)
    ours = ServerThread(proto=proto, cache_dir=our_cache).start()
    yield proto, ref, ref_port, ours, ref_cache, our_cache
    ours.stop()
    refenv.stop_process(ref)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_same_responses_as_reference(servers, name):
    proto, ref, ref_port, ours, ref_cache, our_cache = servers
    expected = transcript(ref_port, proto, SCENARIOS[name])
    assert ref.poll() is None, "reference server died"
    got = transcript(ours.port, proto, SCENARIOS[name])
    assert got == expected
    if name == "hash":
        assert sorted(p.name for p in ref_cache.iterdir()) == sorted(
            p.name for p in our_cache.iterdir()
        )
