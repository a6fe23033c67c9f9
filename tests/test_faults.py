"""Faults: clients dying mid-command, resets, a cache directory that cannot be used or fills up.

Each fault costs only the connection it happens on; memory returns to its baseline.
"""

from __future__ import annotations

import resource
import socket
import struct
import subprocess
import sys
import textwrap

import numpy as np
from rpcnet import _native
from support.raw import RawConn, frame
from test_bad_input import wait_for_baseline
from test_limits import start_serve

ALLOC, BASE, SET, HASH, GET, GRAPH, COUNT = 0, 3, 6, 7, 8, 10, 15

CLIENT = textwrap.dedent(
    """
    import socket, struct, sys, time
    sys.path.insert(0, {tests!r})
    from support.raw import RawConn
    conn = RawConn({port})
    conn.send(bytes.fromhex({payload!r}))
    print("sent", flush=True)
    time.sleep(60)
    """
)


def killed_client(port: int, payload: bytes) -> None:
    """A separate process sends `payload` after HELLO and is then SIGKILLed."""
    from pathlib import Path

    code = CLIENT.format(tests=str(Path(__file__).parent), port=port, payload=payload.hex())
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "sent"
    finally:
        proc.kill()
        proc.wait()


def buffer_of(conn: RawConn, size: int) -> tuple[int, int]:
    handle, _ = struct.unpack("<QQ", conn.call(ALLOC, struct.pack("<IQ", 0, size), 16))
    return handle, struct.unpack("<Q", conn.call(BASE, struct.pack("<Q", handle), 8))[0]


def test_client_killed_mid_set_tensor(server):
    # The victim allocates in its own connection: a fresh process can only use its own handles.
    payload = (
        frame(ALLOC, struct.pack("<IQ", 0, 1 << 20)) + frame(SET, size=305 + (1 << 20)) + bytes(50)
    )
    killed_client(server.port, payload)
    wait_for_baseline(server)


def test_client_killed_mid_graph(server):
    conn = RawConn(server.port)
    handle, base = buffer_of(conn, 64 << 20)
    n = 1024
    a = _native.RpcTensor(id=1, type=0, buffer=handle, data=base, ne=(n, n, 1, 1))
    b = _native.RpcTensor(id=2, type=0, buffer=handle, data=base + 4 * n * n, ne=(n, n, 1, 1))
    out = _native.RpcTensor(
        id=3,
        type=0,
        buffer=handle,
        data=base + 8 * n * n,
        ne=(n, n, 1, 1),
        op=29,
        src=(1, 2),
        flags=16,
    )
    body = struct.pack("<IQI", 0, 0, 1) + struct.pack("<Q", 3) + struct.pack("<I", 3)
    conn.send(frame(GRAPH, body + a.to_bytes() + b.to_bytes() + out.to_bytes()))
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()  # RST while the graph runs
    wait_for_baseline(server, timeout=20)
    assert struct.unpack("<I", RawConn(server.port).call(COUNT, b"", 4))[0] == 1


def test_client_gone_mid_get_tensor(server):
    conn = RawConn(server.port)
    size = 256 << 20
    handle, base = buffer_of(conn, size)
    t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(size, 1, 1, 1))
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.send(frame(GET, t.to_bytes() + struct.pack("<QQ", 0, size)))
    conn.recv_exact(1 << 16)  # the response has started
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()
    wait_for_baseline(server, timeout=20)


def test_unusable_cache_dir_disables_cache(server_factory, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    srv = server_factory(mem=1 << 30, cache_dir=blocker / "rpc")
    assert "serving without a cache" in caplog.text
    conn = RawConn(srv.port)
    handle, base = buffer_of(conn, 4096)
    t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(4096, 1, 1, 1))
    assert conn.call(HASH, t.to_bytes() + struct.pack("<QQ", 0, 1234), 1) == b"\0"
    conn.close()


def test_cache_disk_full_keeps_serving(tmp_path):
    """RLIMIT_FSIZE makes cache writes fail like a full disk (EFBIG); Python ignores SIGXFSZ."""

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    proc, port = start_serve("--cache", str(tmp_path), preexec=small_files)
    try:
        conn = RawConn(port)
        handle, base = buffer_of(conn, 8 << 20)
        data = np.random.default_rng(1).integers(0, 255, 4 << 20, dtype=np.uint8).tobytes()
        digest = _native.fnv1a64(data)
        t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(len(data), 1, 1, 1))
        conn.send(frame(SET, t.to_bytes() + b"\1" + struct.pack("<Q", 0) + data))
        # The write fails in the background; the hash lookup after it is a clean miss.
        assert conn.call(HASH, t.to_bytes() + struct.pack("<QQ", 0, digest), 1) == b"\0"
        assert conn.call(GET, t.to_bytes() + struct.pack("<QQ", 0, 64), 64) == data[:64]
        conn.close()
        assert not [p for p in tmp_path.iterdir()]  # no partial file left behind
        again = RawConn(port)
        assert struct.unpack("<I", again.call(COUNT, b"", 4))[0] == 1
        again.close()
    finally:
        proc.terminate()
        out = proc.communicate(timeout=15)[0]
    assert "cache writes disabled" in out
    assert proc.returncode == 0


def test_peer_reset_between_commands(server):
    for _ in range(5):
        conn = RawConn(server.port)
        buffer_of(conn, 1 << 20)
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()
    wait_for_baseline(server)  # polls until every reset connection is released
