"""Malformed frames of every kind close only their connection; memory returns to baseline."""

from __future__ import annotations

import struct
import time

import pytest
from rpcnet import _native
from support.raw import HELLO, RawConn, frame

ALLOC, GET_ALIGN, GET_BASE, FREE, SET, GET, GRAPH, HELLO_CMD, COUNT, RECOMPUTE = (
    0,
    1,
    3,
    4,
    6,
    8,
    10,
    14,
    15,
    16,
)


def tensor(**kw) -> bytes:
    kw.setdefault("id", 1)
    return _native.RpcTensor(**kw).to_bytes()


def with_buffer(conn: RawConn, size: int = 4096) -> tuple[int, int]:
    handle, _ = struct.unpack("<QQ", conn.call(ALLOC, struct.pack("<IQ", 0, size), 16))
    base = struct.unpack("<Q", conn.call(GET_BASE, struct.pack("<Q", handle), 8))[0]
    return handle, base


def get_request(t: bytes, offset: int, size: int) -> bytes:
    return frame(GET, t + struct.pack("<QQ", offset, size))


def graph(nodes: list[int], tensors: list[bytes], device: int = 0, uid: int = 0) -> bytes:
    body = struct.pack("<IQI", device, uid, len(nodes)) + b"".join(
        struct.pack("<Q", n) for n in nodes
    )
    return frame(GRAPH, body + struct.pack("<I", len(tensors)) + b"".join(tensors))


# Each case: (name, needs a buffer, builder(handle, base) -> bytes to send after HELLO)
CASES = {
    "unknown command": lambda h, b: frame(200),
    "protocol NONE marker": lambda h, b: frame(23),
    "command count sentinel": lambda h, b: frame(24),
    "second HELLO": lambda h, b: HELLO,
    "wrong fixed size": lambda h, b: frame(GET_ALIGN, b"\0" * 5),
    "device count with payload": lambda h, b: frame(COUNT, b"\0"),
    "huge SET_TENSOR size": lambda h, b: frame(SET, size=1 << 62),
    "huge GRAPH size": lambda h, b: frame(GRAPH, size=1 << 40),
    "short SET_TENSOR": lambda h, b: frame(SET, b"\0" * 100),
    "device out of range": lambda h, b: frame(GET_ALIGN, struct.pack("<I", 7)),
    "forged handle": lambda h, b: frame(GET_BASE, struct.pack("<Q", 0xDEADBEEF)),
    "free forged handle": lambda h, b: frame(FREE, struct.pack("<Q", h ^ 1)),
    "invalid type": lambda h, b: get_request(
        tensor(type=43, buffer=h, data=b, nb=(4, 4, 4, 4)), 0, 4
    ),
    "removed type": lambda h, b: get_request(
        tensor(type=4, buffer=h, data=b, nb=(1, 1, 1, 1)), 0, 4
    ),
    "tensor outside buffer": lambda h, b: get_request(
        tensor(buffer=h, data=b + 4096, ne=(4, 1, 1, 1)), 0, 4
    ),
    "tensor before buffer": lambda h, b: get_request(
        tensor(buffer=h, data=b - 16, ne=(4, 1, 1, 1)), 0, 4
    ),
    "read past tensor": lambda h, b: get_request(tensor(buffer=h, data=b, ne=(4, 1, 1, 1)), 8, 16),
    "no buffer": lambda h, b: get_request(tensor(buffer=0, data=b, ne=(4, 1, 1, 1)), 0, 4),
    "overflowing ne": lambda h, b: get_request(
        tensor(buffer=h, data=b, ne=(2**32 - 1, 2**32 - 1, 1, 1), nb=(4, 2**32 - 4, 1, 1)), 0, 4
    ),
    "set past buffer": lambda h, b: frame(
        SET,
        tensor(buffer=h, data=b, ne=(1024, 1, 1, 1)) + b"\0" + struct.pack("<Q", 4096) + b"x" * 8,
    ),
    "graph missing tensor": lambda h, b: graph([5], [tensor(id=6, buffer=h, data=b)]),
    "graph cycle": lambda h, b: graph(
        [5], [tensor(id=5, buffer=h, data=b, op=2, src=(5, 5), flags=16)]
    ),
    # Only nodes and their sources are built, but every ancestor is still checked (as the
    # reference's deserializer does): a bad grandparent refuses the graph.
    "graph ancestor outside buffer": lambda h, b: graph(
        [5],
        [
            tensor(id=5, buffer=h, data=b, op=2, src=(6, 6), flags=16),
            tensor(id=6, buffer=h, data=b, op=2, src=(7, 7)),
            tensor(id=7, buffer=h, data=b + 4096, ne=(4, 1, 1, 1)),
        ],
    ),
    "graph ancestor not sent": lambda h, b: graph(
        [5],
        [
            tensor(id=5, buffer=h, data=b, op=2, src=(6, 6), flags=16),
            tensor(id=6, buffer=h, data=b, op=37, view_src=8),
        ],
    ),
    "graph ancestor invalid type": lambda h, b: graph(
        [5],
        [
            tensor(id=5, buffer=h, data=b, op=2, src=(6, 6), flags=16),
            tensor(id=6, buffer=h, data=b, op=2, src=(7, 0)),
            tensor(id=7, type=43, buffer=h, data=b, nb=(4, 4, 4, 4)),
        ],
    ),
    "graph node listed twice": lambda h, b: graph(
        [5, 5], [tensor(id=5, buffer=h, data=b, op=2, src=(6, 6), flags=16), tensor(id=6)]
    ),
    "graph truncated": lambda h, b: frame(GRAPH, struct.pack("<IQI", 0, 0, 1000)),
    "graph bad device": lambda h, b: graph([], [], device=3),
    "graph data without buffer": lambda h, b: graph(
        [5], [tensor(id=5, buffer=0, data=b, op=2, flags=16)]
    ),
    "recompute unknown uid": lambda h, b: frame(RECOMPUTE, struct.pack("<IQ", 0, 77)),
    "set 2d zero copies": lambda h, b: frame(
        18, tensor(buffer=h, data=b, ne=(16, 1, 1, 1)) + struct.pack("<QQQQ", 0, 4, 0, 4)
    ),
    "allreduce without peer": lambda h, b: frame(
        21, struct.pack("<I", 0) + tensor(buffer=h, data=b)
    ),
}


def wait_for_baseline(srv, held: int = 0, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if srv.memory_held() == held and srv.connection_count() == 0:
            return
        time.sleep(0.02)
    raise AssertionError(
        f"memory held {srv.memory_held()} (want {held}), connections {srv.connection_count()}"
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_frame_closes_only_its_connection(server, case):
    bystander = RawConn(server.port)
    conn = RawConn(server.port)
    handle, base = with_buffer(conn)
    conn.send(CASES[case](handle, base))
    assert conn.closed_by_peer(), f"{case}: server did not close the connection"
    conn.close()
    # The other client is unaffected and the server keeps accepting new ones.
    assert struct.unpack("<I", bystander.call(COUNT, b"", 4))[0] == 1
    fresh = RawConn(server.port)
    assert struct.unpack("<I", fresh.call(COUNT, b"", 4))[0] == 1
    fresh.close()
    bystander.close()
    wait_for_baseline(server)


@pytest.mark.parametrize(
    "first", [frame(COUNT), frame(HELLO_CMD, bytes(23)), frame(HELLO_CMD, bytes(25)), b"\x0e"]
)
def test_handshake_violations(server, first):
    conn = RawConn(server.port, hello=False)
    conn.send(first)
    if first == b"\x0e":  # truncated header, then the client goes away
        conn.close()
    else:
        assert conn.closed_by_peer()
        conn.close()
    wait_for_baseline(server)


def test_truncated_payload_then_disconnect(server):
    conn = RawConn(server.port)
    handle, base = with_buffer(conn, 1 << 20)
    t = tensor(buffer=handle, data=base, ne=(1 << 18, 1, 1, 1))
    conn.send(frame(SET, size=305 + (1 << 20)) + t + b"\0" + struct.pack("<Q", 0) + b"x" * 1000)
    conn.close()
    wait_for_baseline(server)


def test_v7_rejects_v8_only_commands(server_v7):
    for cmd in (18, 19, 20):
        conn = RawConn(server_v7.port)
        conn.send(frame(cmd, b"\0" * 4))
        assert conn.closed_by_peer()
        conn.close()
    wait_for_baseline(server_v7)
