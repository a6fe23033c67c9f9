"""Configurable limits, the allowlist, graceful drain on SIGTERM and double-SIGINT exit."""

from __future__ import annotations

import signal
import socket
import struct
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from rpcnet import _native
from rpcnet.server.access import allowed, parse_allow
from support.raw import HELLO, RawConn, frame
from support.refenv import free_port
from support.serve import start_rpcnet
from support.waiting import wait_until
from test_bad_input import wait_for_baseline

COUNT, ALLOC, GRAPH = 15, 0, 10


def test_no_hello_within_timeout_closes(server_factory, caplog):
    srv = server_factory(mem=1 << 30, hello_timeout=0.3)
    conn = RawConn(srv.port, hello=False)
    assert conn.closed_by_peer(timeout=5)
    wait_until(lambda: "closing connection: no HELLO within" in caplog.text)  # why it closed
    conn.close()
    wait_for_baseline(srv)


def assert_refused(port: int) -> None:
    """A client's HELLO on `port` gets no answer: the server closes the connection."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.settimeout(5)
    try:
        sock.sendall(HELLO)
        assert sock.recv(64) == b""
    except ConnectionResetError:
        pass
    finally:
        sock.close()


def test_max_clients_refuses_extra_connections(server_factory):
    srv = server_factory(mem=1 << 30, max_clients=2)
    held = [RawConn(srv.port), RawConn(srv.port)]
    assert_refused(srv.port)
    held[0].close()
    wait_until(lambda: srv.connection_count() == 1)
    again = RawConn(srv.port)  # room again
    assert struct.unpack("<I", again.call(COUNT, b"", 4))[0] == 1
    again.close()
    held[1].close()


def test_allowlist_refuses_other_networks(server_factory):
    srv = server_factory(mem=1 << 30, allow=parse_allow("10.0.0.0/8"))
    assert_refused(srv.port)


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


def beyond_socket_buffers() -> int:
    """More bytes than the kernel can buffer between a sender and a receiver (both autotuning
    limits): a sendall() of this many bytes returns only once the receiver has read some."""
    limits = [Path("/proc/sys/net/ipv4", name).read_text().split() for name in KERNEL_BUFFERS]
    return sum(int(fields[2]) for fields in limits) + (1 << 20)


KERNEL_BUFFERS = ("tcp_rmem", "tcp_wmem")


def start_set_tensor(conn: RawConn, size: int, sent: int) -> None:
    """Send the start of a SET_TENSOR of `size` bytes: header and `sent` payload bytes. With
    `sent` beyond the kernel's buffers, the server is inside this command once this returns."""
    handle, _ = struct.unpack("<QQ", conn.call(ALLOC, struct.pack("<IQ", 0, size), 16))
    base = struct.unpack("<Q", conn.call(3, struct.pack("<Q", handle), 8))[0]
    t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(size, 1, 1, 1))
    head = frame(6, size=305 + size) + t.to_bytes() + b"\0" + struct.pack("<Q", 0)
    conn.send(head + b"\x5a" * sent)


def start_serve(*extra: str, preexec=None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    return start_rpcnet(port, "--mem", "1G", *extra, capture=True, preexec=preexec), port


@contextmanager
def serving_mid_command() -> Iterator[tuple[subprocess.Popen, RawConn, RawConn, int]]:
    """A server process with an idle client and a busy one: the first `first` bytes of the
    busy one's SET_TENSOR of 2 * `first` are on the wire. The process is killed after use."""
    proc, port = start_serve()
    try:
        idle, busy = RawConn(port), RawConn(port)
        first = beyond_socket_buffers()
        start_set_tensor(busy, 2 * first, first)
        yield proc, idle, busy, first
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_drains_in_flight_command_then_exits():
    # Part of a SET_TENSOR is on the wire when SIGTERM arrives: it must complete.
    with serving_mid_command() as (proc, idle, busy, first):
        proc.send_signal(signal.SIGTERM)
        assert idle.closed_by_peer(timeout=10)  # idle clients are closed right away
        busy.send(b"\x5a" * first)  # the rest of the command
        assert busy.closed_by_peer(timeout=10)  # ... and the busy one after its command
        assert proc.wait(15) == 0
        assert "draining" in (proc.stdout.read() if proc.stdout else "")


def test_second_sigint_exits_immediately():
    with serving_mid_command() as (proc, idle, _busy, _first):  # a command that never completes
        proc.send_signal(signal.SIGINT)
        assert idle.closed_by_peer(timeout=10)  # the drain has begun
        assert proc.poll() is None  # still draining: waiting for the stuck command
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 130


def test_non_loopback_bind_defaults_to_loopback_only(caplog):
    from rpcnet.server.access import LOOPBACK, default_allow

    assert default_allow("127.0.0.1", None) == LOOPBACK
    assert default_allow("0.0.0.0", None) == LOOPBACK  # never allow-all by default
    assert "only loopback clients are accepted" in caplog.text
    nets = parse_allow("10.0.0.0/8")
    assert default_allow("0.0.0.0", nets) == nets
