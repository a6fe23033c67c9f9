"""HELLO caps negotiation: client with/without caps x server with/without RDMA, through the real
asyncio server. RDMA runs over the loopback fake verbs layer (no NIC here), TCP is real.

Each case checks the transport the connection ended on, that commands work on it, and the one
log line each side wrote (logger "rpcnet.transport").
"""

from __future__ import annotations

import logging
import os
import struct
import time

import pytest
from rpcnet import _native
from rpcnet.caps import probe, render
from rpcnet.client import connect_client
from rpcnet.protocol import messages as msg
from rpcnet.protocol.commands import Cmd
from rpcnet.transport import NO_CAPS, ServerNegotiation, decide
from support.fakeverbs import FakeFabric, FakeVerbs

CAPS = _native.rdma_encode_caps(0x1234, "::ffff:10.0.0.2")


# ------------------------------------------------------------------------------ the decision


def test_decide_matrix():
    none = decide(NO_CAPS, NO_CAPS, remote="client")
    assert (none.transport, none.reason, none.level) == (
        "TCP",
        "client offered no RDMA",
        logging.DEBUG,
    )
    only_us = decide(CAPS, NO_CAPS, remote="server")
    assert (only_us.transport, only_us.reason) == ("TCP", "server offered no RDMA")
    only_them = decide(NO_CAPS, CAPS, remote="client", local_reason="pyverbs is not installed")
    assert only_them.transport == "TCP" and only_them.level == logging.INFO
    assert only_them.reason == (
        "client offered RDMA (RDMA qpn=0x1234 psn=0x1234 gid=::ffff:a00:2 (10.0.0.2)); "
        "this side has none: pyverbs is not installed"
    )
    failed = decide(CAPS, CAPS, activation_error="INIT->RTR: EINVAL")
    assert failed.transport == "TCP" and failed.level == logging.WARNING
    assert failed.reason == "RDMA activation failed: INIT->RTR: EINVAL; staying on TCP"
    up = decide(CAPS, CAPS, detail="RDMA (qpn 0x1 -> 0x2, mlx5_0 port 1 GID 3 (RoCE v2))")
    assert up.transport == "RDMA" and up.line("10.0.0.2:5") == (
        "10.0.0.2:5: transport RDMA: RDMA (qpn 0x1 -> 0x2, mlx5_0 port 1 GID 3 (RoCE v2))"
    )


# ------------------------------------------------------------------------------ real server


def with_rdma(server, provider) -> None:
    server.server.negotiation = ServerNegotiation(provider)


def server_lines(caplog, server) -> list[tuple[int, str]]:
    own = f"127.0.0.1:{server.port}: "
    return [
        (r.levelno, r.getMessage().split(": ", 1)[1])
        for r in caplog.records
        if r.name == "rpcnet.transport"
        and ": transport " in r.getMessage()
        and not r.getMessage().startswith(own)
    ]


def client_lines(caplog, server) -> list[tuple[int, str]]:
    own = f"127.0.0.1:{server.port}: "
    return [
        (r.levelno, r.getMessage()[len(own) :])
        for r in caplog.records
        if r.name == "rpcnet.transport" and r.getMessage().startswith(own)
    ]


def wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def exercise(conn, size: int = 3 << 20) -> None:
    """Device queries, a buffer, a large SET_TENSOR and GET_TENSOR round trip."""
    assert msg.parse_u32(conn.call(Cmd.DEVICE_COUNT, b"", 4)) == 1
    assert msg.parse_u64(conn.call(Cmd.GET_ALIGNMENT, msg.u32(0), 8)) == 32
    rsp = conn.call(Cmd.ALLOC_BUFFER, msg.alloc_request(0, size), 16)
    handle, got = struct.unpack("<QQ", rsp)
    assert handle and got >= size
    base = msg.parse_u64(conn.call(Cmd.BUFFER_GET_BASE, msg.u64(handle), 8))
    t = _native.RpcTensor(buffer=handle, data=base, ne=(size, 1, 1, 1), type=24)  # I8
    data = os.urandom(size)
    conn.send_request(Cmd.SET_TENSOR, msg.set_tensor_payload(t, 0, data))
    assert conn.call(Cmd.GET_TENSOR, msg.tensor_range(t, 0, size), size) == data
    conn.send_request(Cmd.FREE_BUFFER, msg.u64(handle))


@pytest.fixture
def logs(caplog):
    caplog.set_level(logging.DEBUG, logger="rpcnet.transport")
    return caplog


def test_tcp_client_tcp_server(server, logs):
    with_rdma(server, None)
    with connect_client("127.0.0.1", server.port) as conn:
        assert conn.transport.name == "TCP" and conn.server_caps == NO_CAPS
        exercise(conn)
    assert server_lines(logs, server) == [(logging.DEBUG, "transport TCP: client offered no RDMA")]
    assert client_lines(logs, server) == [
        (
            logging.DEBUG,
            "transport TCP: server offered no RDMA; this side has none either: RDMA not requested",
        )
    ]


def test_rdma_client_tcp_server(server, logs):
    with_rdma(server, None)
    with connect_client("127.0.0.1", server.port, provider=FakeVerbs()) as conn:
        assert any(conn.client_caps) and conn.server_caps == NO_CAPS
        assert conn.transport.name == "TCP"
        exercise(conn)
    [(level, line)] = server_lines(logs, server)
    assert level == logging.INFO
    assert line.startswith("transport TCP: client offered RDMA (RDMA qpn=")
    assert line.endswith("this side has none: this server has no RDMA transport configured")
    assert client_lines(logs, server) == [(logging.DEBUG, "transport TCP: server offered no RDMA")]


def test_rdma_client_server_without_pyverbs(server, logs, monkeypatch):
    """The default policy (pyverbs) on a host without pyverbs says so, once at INFO."""
    from rpcnet.transport.rdma import verbs

    monkeypatch.setattr(verbs, "_PYVERBS", None)
    monkeypatch.setitem(__import__("sys").modules, "pyverbs", None)  # import fails
    server.server.negotiation = ServerNegotiation.from_env()
    client = FakeVerbs()  # one fabric: a new qpn per connection, as with a real client
    for _ in range(2):
        with connect_client("127.0.0.1", server.port, provider=client) as conn:
            assert conn.transport.name == "TCP"
            exercise(conn, 4096)
    first, second = server_lines(logs, server)
    assert first[0] == logging.INFO and second[0] == logging.DEBUG
    assert first[1] != second[1]  # different client qpns, same cause
    assert first[1].endswith("this side has none: " + verbs.PYVERBS_MISSING)


def test_tcp_client_rdma_server(server, logs):
    fabric = FakeFabric()
    with_rdma(server, FakeVerbs(fabric))
    with connect_client("127.0.0.1", server.port) as conn:
        assert conn.transport.name == "TCP" and conn.server_caps == NO_CAPS
        exercise(conn)
    assert fabric.stats.qps_created == 0, "no queue pair for a client that did not ask"
    assert server_lines(logs, server) == [(logging.DEBUG, "transport TCP: client offered no RDMA")]


def test_rdma_client_rdma_server(server, logs):
    fabric = FakeFabric()
    with_rdma(server, FakeVerbs(fabric))
    with connect_client("127.0.0.1", server.port, provider=FakeVerbs(fabric), strict=True) as conn:
        assert conn.transport.name == "RDMA"
        assert any(conn.server_caps) and any(conn.client_caps)
        exercise(conn, 9 << 20)  # > the 6 MiB ring in both directions
        assert conn.transport.stats.bytes_received > 9 << 20
        assert conn.transport.stats.reposted == conn.transport.stats.messages_received
    assert max(fabric.stats.messages) == 256 * 1024
    [(level, line)] = server_lines(logs, server)
    assert level == logging.INFO
    assert line.startswith("transport RDMA: RDMA (qpn 0x")
    assert "GID matching local address 127.0.0.1" in line
    [(level, line)] = client_lines(logs, server)
    assert level == logging.INFO and line.startswith("transport RDMA: RDMA (qpn 0x")
    # the client went away (TCP closed): the server frees the connection and its queue pair
    assert wait_for(lambda: server.connection_count() == 0)
    assert wait_for(lambda: fabric.live_qps() == 0)


def test_server_activation_failure_answers_zero_caps(server, logs):
    fabric = FakeFabric()
    with_rdma(server, FakeVerbs(fabric, fail_at="rtr"))
    with connect_client("127.0.0.1", server.port, provider=FakeVerbs(fabric)) as conn:
        assert conn.server_caps == NO_CAPS and conn.transport.name == "TCP"
        exercise(conn)
    [(level, line)] = server_lines(logs, server)
    assert level == logging.WARNING
    assert line == (
        "transport TCP: RDMA activation failed: FakeVerbsError: injected failure at rtr; "
        "answered zero caps; staying on TCP"
    )


def test_client_activation_failure_falls_back_to_tcp(server, logs):
    """The server is up on RDMA, the client's QP fails: its bytes arrive on TCP instead."""
    fabric = FakeFabric()
    with_rdma(server, FakeVerbs(fabric))
    with connect_client(
        "127.0.0.1", server.port, provider=FakeVerbs(fabric, fail_at="rts")
    ) as conn:
        assert any(conn.server_caps) and conn.transport.name == "TCP"
        exercise(conn)
    [(level, line)] = client_lines(logs, server)
    assert level == logging.WARNING and "injected failure at rts" in line
    msgs = [r.getMessage() for r in logs.records if r.name == "rpcnet.transport"]
    assert any(
        "the client stayed on TCP after both sides offered RDMA (its activation failed); "
        "falling back to TCP" in m
        for m in msgs
    )
    assert wait_for(lambda: fabric.live_qps() == 0)


def test_server_side_environment_disables_rdma(server, logs):
    fabric = FakeFabric()
    ports = [
        _native.RdmaPort(
            "mlx5_0",
            1,
            [_native.RdmaGid(3, _native.rdma_target_gid("127.0.0.1"), "RoCE v2", "lo")],
            "4: ACTIVE",
        )
    ]
    with_rdma(server, FakeVerbs(fabric, ports=ports, environ={"GGML_RPC_NO_RDMA": "1"}))
    with connect_client("127.0.0.1", server.port, provider=FakeVerbs(fabric)) as conn:
        assert conn.transport.name == "TCP"
    [(_, line)] = server_lines(logs, server)
    assert line.endswith("this side has none: RDMA disabled: GGML_RPC_NO_RDMA is set")
    # and with the variable gone the same GID table gives RDMA on mlx5_0 GID 3
    with_rdma(server, FakeVerbs(fabric, ports=ports, environ={}))
    with connect_client("127.0.0.1", server.port, provider=FakeVerbs(fabric)) as conn:
        assert conn.transport.name == "RDMA"
        exercise(conn, 1024)
    assert "mlx5_0 port 1 GID 3 (RoCE v2)" in server_lines(logs, server)[-1][1]


def test_v7_server_negotiates_the_same_way(server_factory):
    srv = server_factory(mem=1 << 30, proto=7)
    fabric = FakeFabric()
    with_rdma(srv, FakeVerbs(fabric))
    with connect_client("127.0.0.1", srv.port, provider=FakeVerbs(fabric)) as conn:
        assert conn.version == (7, 0, 0) and conn.transport.name == "RDMA"
        assert msg.parse_u32(conn.call(Cmd.DEVICE_COUNT, b"", 4)) == 1


def test_caps_report_shows_both_sides_and_the_transport(server):
    fabric = FakeFabric()
    with_rdma(server, FakeVerbs(fabric))
    info = probe("127.0.0.1", server.port, provider=FakeVerbs(fabric))
    assert info["transport"] == "RDMA"
    assert info["client_rdma"]["gid"].endswith("(127.0.0.1)")
    assert info["server_rdma"]["psn"] == info["server_rdma"]["qpn"] & 0xFFFFFF
    text = render(info)
    assert "transport       RDMA  (RDMA (qpn 0x" in text
    assert "1024 MiB total" in text
    info = probe("127.0.0.1", server.port, provider=None)
    assert info["transport"] == "TCP" and info["client_offer"] == "RDMA not requested"
    assert "client caps     " + "00" * 24 + "  (none: RDMA not requested)" in render(info)


def test_apple_layout_caps_are_answered_with_tcp(server, logs):
    """qpn u32, lid u16, reserved u16, gid: psn != qpn & 0xFFFFFF, so not the RC transport."""
    import socket

    fabric = FakeFabric()
    with_rdma(server, FakeVerbs(fabric))
    apple = struct.pack("<IHH", 0x1234, 0x0001, 0) + bytes(_native.rdma_target_gid("10.0.0.3"))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(bytes([Cmd.HELLO]) + struct.pack("<Q", 24) + apple)
        rsp = b""
        while len(rsp) < 36:
            rsp += s.recv(36 - len(rsp))
    assert rsp[8:12] == bytes([8, 0, 0, 0]) and rsp[12:] == NO_CAPS
    assert fabric.stats.qps_created == 0
    [(_, line)] = server_lines(logs, server)
    assert line.endswith(
        "caps are not the Linux verbs layout (psn 0x1 != qpn 0x1234 & 0xFFFFFF; "
        "Apple RDMA transport?)"
    )
