"""What `rpcnet tunnel` and a TLS server add for tensor split and for `rpcnet caps`:

- the tunnel's reading of the client's requests: HELLO caps zeroed, COMM_INIT's rank-0 address
  mapped, its own STATUS query answered and never forwarded, every other byte passed unchanged
  whatever the chunking;
- peer links of TLS servers (real sockets on 127.0.0.2 and 127.0.0.3): TLS 1.3, rank 0 admits
  only the tenant of its own COMM_INIT (another tenant's token is refused and rank 0 keeps
  waiting), allreduces over TLS move megabytes both ways at once with the spec's sums;
- `rpcnet caps` at a tunnel's listen address reports the tunnel's TLS version, the server's
  fingerprint and the tenant; at a server directly it reports no tunnel and the server holds
  nothing after.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import struct
import threading
import time

import numpy as np
import pytest
from rpcnet import caps
from rpcnet.server.comm import CommHub
from rpcnet.server.config import size_bytes
from rpcnet.server.peertls import PeerSecurity
from rpcnet.server.tenants import Tenants
from rpcnet.transport import tls
from rpcnet.tunnelwire import Deferred, RequestScanner, parse_status, rewrite_comm_init
from support import require
from support.cli_run import run_cli
from support.secure import Pki, TunnelThread, write_tokens

ALICE, BOB = "alice-token-0123456789", "bob-token-0123456789ab"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    require.module("cryptography")
    pki = Pki(tmp_path_factory.mktemp("pki"))
    pki.good = pki.leaf("server", ("127.0.0.1", "127.0.0.2", "127.0.0.3"))
    return pki


@pytest.fixture
def tokens(tmp_path):
    return write_tokens(tmp_path / "tokens", {"alice": (ALICE, None), "bob": (BOB, None)})


# ----------------------------------------------------------------------------- the scanner


def frame(cmd: int, payload: bytes) -> bytes:
    return struct.pack("<BQ", cmd, len(payload)) + payload


def comm_init(rank: int, port: int, host: bytes) -> bytes:
    return struct.pack("<IIII", 0, rank, 2, port) + host.ljust(64, b"\0")


@pytest.mark.parametrize("chunk", [1, 7, 9, 10, 4096, 1 << 20])
def test_scanner_rewrites_three_frames_and_passes_the_rest(chunk):
    set_tensor = frame(6, os.urandom(305 + 5000))
    stream = (
        frame(14, bytes(range(1, 25)))  # HELLO offering (fake) RDMA caps
        + set_tensor
        + frame(20, comm_init(1, 41000, b"127.0.0.1"))
        + frame(0xFE, b"")  # the tunnel's STATUS
        + frame(15, b"")
        + frame(20, comm_init(1, 555, b"10.0.0.1"))  # no route: unchanged
    )
    expected = (
        frame(14, bytes(24))
        + set_tensor
        + frame(20, comm_init(1, 51000, b"127.0.0.2"))
        + frame(15, b"")
        + frame(20, comm_init(1, 555, b"10.0.0.1"))
    )

    def mapping(rank, host, port):
        return ("127.0.0.2", 51000) if (rank, host, port) == (1, "127.0.0.1", 41000) else None

    asked = []
    scanner = RequestScanner(lambda p: rewrite_comm_init(p, mapping)[0], lambda: asked.append(1))
    out = b"".join(
        bytes(part)
        for i in range(0, len(stream), chunk)
        for part in scanner.feed(stream[i : i + chunk])
    )
    assert out == expected
    assert asked == [1]


def test_scanner_defers_a_comm_init_rewrite_declines():
    frames = frame(20, comm_init(1, 41000, b"127.0.0.1")) + frame(15, b"")
    parts = RequestScanner(lambda p: None, lambda: None).feed(frames)
    assert isinstance(parts[0], Deferred)
    assert parts[0].header == frames[:9] and parts[0].payload == comm_init(1, 41000, b"127.0.0.1")
    assert b"".join(bytes(p) for p in parts[1:]) == frame(15, b"")


def test_rank0_comm_init_keeps_an_empty_host():
    payload, change = rewrite_comm_init(comm_init(0, 41000, b""), lambda r, h, p: ("", 51000))
    assert payload == comm_init(0, 51000, b"")
    assert change == ("", 41000, "", 51000)
    assert parse_status(b"not a tunnel") is None


# ----------------------------------------------------------------------------- peer links


def bf16_widened(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 (round to nearest even) -> f32, from the bit patterns."""
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return (rounded.astype(np.uint32) << 16).view(np.float32)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def test_peer_link_is_tls_for_the_same_tenant_only(pki, tokens, caplog):
    caplog.set_level(logging.INFO)
    cert, key = pki.good
    tenants = Tenants(tokens, size_bytes)
    security = PeerSecurity(
        tls.server_context(cert, key), tls.cert_fingerprint(cert), None, (), tenants
    )
    hub0 = CommHub("127.0.0.2", 5.0, None, security)
    hub1 = CommHub("127.0.0.3", 5.0, None, security)
    port = free_port("127.0.0.2")

    async def pair():
        rank0 = asyncio.ensure_future(hub0.open(0, 0, port, "", "alice", ALICE.encode()))
        # bob's token reaches rank 0's port first: refused, rank 0 keeps waiting
        assert await hub1.open(0, 1, port, "127.0.0.2", "bob", BOB.encode()) is None
        assert not rank0.done()
        link1 = await hub1.open(0, 1, port, "127.0.0.2", "alice", ALICE.encode())
        return await rank0, link1

    link0, link1 = asyncio.run(pair())
    assert link0 is not None and link1 is not None
    assert isinstance(link0.sock, ssl.SSLSocket)
    assert link0.sock.version() == "TLSv1.3" and link1.sock.version() == "TLSv1.3"
    assert "tenant bob, not tenant alice" in caplog.text
    assert ALICE not in caplog.text and BOB not in caplog.text

    rng = np.random.default_rng(7)
    try:
        for n in (1000, 3 << 20):  # exact f32; bf16 on the wire (6 MiB each way)
            a = rng.standard_normal(n, dtype=np.float32)
            b = rng.standard_normal(n, dtype=np.float32)
            ra, rb = a.copy(), b.copy()
            errors = []

            def run(link, region, n=n, errors=errors):
                try:
                    link.allreduce(region.view(np.uint8), 0, n)
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [
                threading.Thread(target=run, args=(link0, ra)),
                threading.Thread(target=run, args=(link1, rb)),
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert not errors
            if n < 32768:
                assert np.array_equal(ra, a + b) and np.array_equal(rb, b + a)
            else:
                assert np.array_equal(ra, a + bf16_widened(b))
                assert np.array_equal(rb, b + bf16_widened(a))
        assert hub0.stats.allreduces == 2 and hub0.stats.bytes_sent == 4000 + (3 << 21)
    finally:
        link0.close()
        link1.close()
    assert not hub0.links and not hub1.links


# ----------------------------------------------------------------------------- caps


def test_caps_at_the_tunnel_reports_tls_fingerprint_and_tenant(server_factory, pki, tokens):
    cert, key = pki.good
    srv = server_factory(mem=256 << 20, tls_cert=cert, tls_key=key, tokens=tokens)
    fp = tls.cert_fingerprint(cert)
    tunnel = TunnelThread([("127.0.0.1", srv.port)], BOB, fingerprint=fp).start()
    try:
        port = tunnel.ports[0]
        info = caps.probe("127.0.0.1", port)
        t = info["tunnel"]
        assert t["tls_version"] == "TLSv1.3" and t["fingerprint"] == fp
        assert t["tenant"] == "bob" and t["server"] == f"127.0.0.1:{srv.port}"
        assert t["listen"] == f"127.0.0.1:{port}" and t["verified_by"] == "pinned fingerprint"
        assert [d["index"] for d in info["devices"]] == [0]
        out = run_cli("caps", f"127.0.0.1:{port}")
        assert out.returncode == 0, out.stderr
        assert f"tunnel          127.0.0.1:{port} -> 127.0.0.1:{srv.port}: TLSv1.3" in out.stdout
        assert tls.colon_hex(fp) in out.stdout and "tenant bob" in out.stdout
        assert BOB not in out.stdout
    finally:
        tunnel.stop()


def test_caps_at_a_server_reports_no_tunnel(server_factory):
    srv = server_factory(mem=256 << 20)
    info = caps.probe("127.0.0.1", srv.port)
    assert info["tunnel"] is None and len(info["devices"]) == 1
    deadline = time.monotonic() + 5
    while srv.connection_count() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert srv.connection_count() == 0 and srv.memory_held() == 0
