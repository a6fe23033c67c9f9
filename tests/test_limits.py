"""Configurable limits, the allowlist, graceful drain on SIGTERM and double-SIGINT exit."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
import time

import pytest
from rpcnet import _native
from rpcnet.server.access import allowed, parse_allow
from support.raw import HELLO, RawConn, frame
from support.refenv import free_port
from support.serve import start_rpcnet
from test_bad_input import wait_for_baseline

COUNT, ALLOC, GRAPH = 15, 0, 10


def test_no_hello_within_timeout_closes(server_factory):
    srv = server_factory(mem=1 << 30, hello_timeout=0.3)
    conn = RawConn(srv.port, hello=False)
    t0 = time.monotonic()
    assert conn.closed_by_peer(timeout=5)
    assert time.monotonic() - t0 < 3
    conn.close()
    wait_for_baseline(srv)


def test_max_clients_refuses_extra_connections(server_factory):
    srv = server_factory(mem=1 << 30, max_clients=2)
    held = [RawConn(srv.port), RawConn(srv.port)]
    extra = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    extra.settimeout(5)
    try:
        extra.sendall(HELLO)
        assert extra.recv(64) == b""
    except ConnectionResetError:
        pass
    extra.close()
    held[0].close()
    wait_until(lambda: srv.connection_count() == 1)
    again = RawConn(srv.port)  # room again
    assert struct.unpack("<I", again.call(COUNT, b"", 4))[0] == 1
    again.close()
    held[1].close()


def test_allowlist_refuses_other_networks(server_factory):
    srv = server_factory(mem=1 << 30, allow=parse_allow("10.0.0.0/8"))
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
    sock.settimeout(5)
    try:
        sock.sendall(HELLO)
        assert sock.recv(64) == b""
    except ConnectionResetError:
        pass
    sock.close()


def test_allow_parsing():
    nets = parse_allow("10.0.0.0/8, 192.168.1.7,::1")
    assert allowed("10.1.2.3", nets) and allowed("192.168.1.7", nets) and allowed("::1", nets)
    assert not allowed("192.168.1.8", nets)
    assert allowed("::ffff:10.0.0.1", nets)  # IPv4-mapped IPv6 peers match IPv4 rules
    with pytest.raises(ValueError, match="not an address"):
        parse_allow("10.0.0.0/33")


def test_client_memory_quota(server_factory):
    srv = server_factory(mem=1 << 30, client_mem=1 << 20)
    conn = RawConn(srv.port)
    h1, size = struct.unpack("<QQ", conn.call(ALLOC, struct.pack("<IQ", 0, 768 << 10), 16))
    assert h1 and size == 768 << 10
    assert conn.call(ALLOC, struct.pack("<IQ", 0, 512 << 10), 16) == bytes(16)  # over quota
    other = RawConn(srv.port)  # quotas are per connection
    h2, _ = struct.unpack("<QQ", other.call(ALLOC, struct.pack("<IQ", 0, 768 << 10), 16))
    assert h2
    conn.close()
    other.close()
    wait_for_baseline(srv)


def test_graph_node_limit(server_factory):
    srv = server_factory(mem=1 << 30, max_graph_nodes=4)
    conn = RawConn(srv.port)
    tensors = [_native.RpcTensor(id=i + 1).to_bytes() for i in range(5)]
    body = struct.pack("<IQI", 0, 0, 0) + struct.pack("<I", 5) + b"".join(tensors)
    conn.send(frame(GRAPH, body))
    assert conn.closed_by_peer()
    conn.close()
    wait_for_baseline(srv)


def wait_until(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError("condition not reached")


def start_serve(*extra: str, preexec=None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    return start_rpcnet(port, "--mem", "1G", *extra, capture=True, preexec=preexec), port


def test_sigterm_drains_in_flight_command_then_exits():
    proc, port = start_serve()
    try:
        idle = RawConn(port)
        busy = RawConn(port)
        handle, _ = struct.unpack("<QQ", busy.call(ALLOC, struct.pack("<IQ", 0, 1 << 20), 16))
        base = struct.unpack("<Q", busy.call(3, struct.pack("<Q", handle), 8))[0]
        t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(1 << 20, 1, 1, 1))
        # Half a SET_TENSOR is on the wire when SIGTERM arrives: it must complete.
        head = frame(6, size=305 + (1 << 20)) + t.to_bytes() + b"\0" + struct.pack("<Q", 0)
        busy.send(head + b"\x5a" * (1 << 19))
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        busy.send(b"\x5a" * (1 << 19))
        assert idle.closed_by_peer(timeout=10)  # idle clients are closed right away
        assert busy.closed_by_peer(timeout=10)  # ... and the busy one after its command
        assert proc.wait(15) == 0
        assert "draining" in (proc.stdout.read() if proc.stdout else "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_second_sigint_exits_immediately():
    proc, port = start_serve()
    try:
        busy = RawConn(port)
        busy.send(frame(6, size=305 + (1 << 20)) + bytes(100))  # a command that never completes
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert proc.poll() is None  # still draining: waiting for the stuck command
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_non_loopback_bind_defaults_to_loopback_only(caplog):
    from rpcnet.server.access import LOOPBACK, default_allow

    assert default_allow("127.0.0.1", None) == LOOPBACK
    assert default_allow("0.0.0.0", None) == LOOPBACK  # never allow-all by default
    assert "only loopback clients are accepted" in caplog.text
    nets = parse_allow("10.0.0.0/8")
    assert default_allow("0.0.0.0", nets) == nets
