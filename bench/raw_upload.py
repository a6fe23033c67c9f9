"""SET_TENSOR uploads over a raw ggml RPC connection, for the transport benchmarks (bench_core,
bench_tls): one buffer of ``size`` bytes on the server and the frame that fills it."""

from __future__ import annotations

import struct
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from rpcnet import _native  # noqa: E402
from support.raw import RawConn, frame  # noqa: E402

ALLOC_BUFFER, BUFFER_FREE, BUFFER_GET_BASE, SET_TENSOR, GET_DEVICE_COUNT = 0, 4, 3, 6, 15


@dataclass
class Upload:
    handle: int
    tensor: _native.RpcTensor  # u8 (type 24) over the whole buffer
    head: bytes  # the SET_TENSOR frame up to its data
    payload: bytes


def prepare(conn: RawConn, size: int) -> Upload:
    handle, _ = struct.unpack("<QQ", conn.call(ALLOC_BUFFER, struct.pack("<IQ", 0, size), 16))
    base = struct.unpack("<Q", conn.call(BUFFER_GET_BASE, struct.pack("<Q", handle), 8))[0]
    t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(size, 1, 1, 1))
    head = frame(SET_TENSOR, size=305 + size) + t.to_bytes() + b"\0" + struct.pack("<Q", 0)
    return Upload(handle, t, head, bytes(size))


def sync(conn: RawConn) -> None:
    """A round trip: every command sent before has been handled."""
    conn.call(GET_DEVICE_COUNT, b"", 4)


def upload(conn: RawConn, up: Upload) -> None:
    """One SET_TENSOR of the whole buffer, and the round trip that waits for it."""
    conn.send(up.head)
    conn.sock.sendall(up.payload)
    sync(conn)


def free(conn: RawConn, up: Upload) -> None:
    conn.send(frame(BUFFER_FREE, struct.pack("<Q", up.handle)))
    sync(conn)
