"""`--max-clients-per-addr`: connections per client address over real sockets on loopback
addresses, refused with one log line and counted in /metrics (scraped over real HTTP)."""

from __future__ import annotations

import logging
import socket
import struct
import subprocess
import sys
import time

import pytest
from rpcnet.server.access import AddressQuota
from support.raw import HELLO, RawConn
from support.refenv import free_port
from support.serve import start_rpcnet
from test_limits import wait_until
from test_metrics import scrape

COUNT = 15  # GET_DEVICE_COUNT


def refused(port: int, source: str) -> bool:
    """Whether a connection from `source` is closed before it is answered."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    sock.settimeout(5)
    try:
        sock.sendall(HELLO)
        return sock.recv(64) == b""
    except ConnectionResetError:
        return True
    finally:
        sock.close()


class FromAddress(RawConn):
    """A RawConn whose socket comes from `source` (another loopback address)."""

    def __init__(self, port: int, source: str) -> None:
        self.sock = socket.create_connection(
            ("127.0.0.1", port), timeout=5, source_address=(source, 0)
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(HELLO)
        self.read_response(28)


def admitted(port: int, source: str, timeout: float = 10.0) -> FromAddress:
    """A connection from `source` once the server has seen earlier ones leave (start_rpcnet's
    readiness probe is counted until its close is handled)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return FromAddress(port, source)
        except (ConnectionError, struct.error):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_third_connection_from_one_address_is_refused(server_factory, caplog):
    caplog.set_level(logging.WARNING, logger="rpcnet.server")
    srv = server_factory(mem=1 << 30, max_clients_per_addr=2, metrics=("127.0.0.1", 0))
    held = [FromAddress(srv.port, "127.0.0.1"), FromAddress(srv.port, "127.0.0.1")]
    assert refused(srv.port, "127.0.0.1")
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "2 connections from 127.0.0.1" in lines[0]
    # another address has its own count
    other = FromAddress(srv.port, "127.0.0.2")
    assert struct.unpack("<I", other.call(COUNT, b"", 4))[0] == 1
    # the held ones still work; once one leaves, its address has room again
    assert struct.unpack("<I", held[1].call(COUNT, b"", 4))[0] == 1
    held[0].close()
    wait_until(lambda: srv.connection_count() == 2)
    again = FromAddress(srv.port, "127.0.0.1")
    assert struct.unpack("<I", again.call(COUNT, b"", 4))[0] == 1
    assert srv.server is not None and srv.server.metrics is not None
    m = scrape(srv.server.metrics.port)
    reason = (("reason", "max_clients_per_addr"),)
    assert m[("rpcnet_connections_refused_total", reason)] == 1
    assert m[("rpcnet_connections_refused_total", (("reason", "max_clients"),))] == 0
    for conn in (again, other, held[1]):
        conn.close()


def test_the_serve_option_limits_connections_per_address():
    port = free_port()
    proc = start_rpcnet(port, "--max-clients-per-addr", "1", capture=True)
    try:
        first = admitted(port, "127.0.0.1")
        assert refused(port, "127.0.0.1")
        first.close()
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert "refused: 1 connections from 127.0.0.1 already" in out


def test_address_quota_counts_ipv4_mapped_addresses_as_ipv4():
    quota = AddressQuota(1)
    assert quota.admit("::ffff:10.0.0.7")
    assert not quota.admit("10.0.0.7")
    quota.release("10.0.0.7")
    assert quota.admit("10.0.0.7")
    assert AddressQuota(None).admit("10.0.0.7")


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_limit_below_one_is_refused_by_the_cli(value):
    out = subprocess.run(
        [sys.executable, "-m", "rpcnet.cli", "serve", "--max-clients-per-addr", value],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--max-clients-per-addr" in out.stderr
