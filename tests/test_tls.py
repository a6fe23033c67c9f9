"""TLS on the wire: `serve --tls-*` accepts TLS 1.3 only, and what does not pass the handshake is
refused with one log line and holds nothing. In-process servers and tunnels, real sockets on
loopback, rpcnet's own client through `rpcnet tunnel`."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import stat
import time
from struct import pack as struct_pack
from struct import unpack as struct_unpack

import pytest
from rpcnet.client import RpcClient
from rpcnet.transport import tls
from support import require
from support.raw import HELLO, RawConn
from support.secure import Pki, TunnelThread, present_token, tls_socket, write_tokens
from support.waiting import wait_until

TOKEN = "alice-token-0123456789"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    require.module("cryptography")
    pki = Pki(tmp_path_factory.mktemp("pki"))
    pki.good = pki.leaf("server", ("127.0.0.1", "127.0.0.2", "127.0.0.3"))
    pki.expired = pki.leaf("expired", ("127.0.0.1",), expired=True)
    return pki


@pytest.fixture
def tokens(tmp_path):
    return write_tokens(tmp_path / "tokens", {"alice": (TOKEN, None)})


def secure_server(server_factory, pki, tokens=None, cert=None, **config):
    cert_path, key_path = cert or pki.good
    return server_factory(
        mem=256 << 20, tls_cert=cert_path, tls_key=key_path, tokens=tokens, **config
    )


def assert_nothing_held(srv) -> None:
    wait_until(lambda: srv.connection_count() == 0)
    assert srv.memory_held() == 0


async def roundtrip(port: int) -> bytes:
    async with await RpcClient.connect("127.0.0.1", port) as c:
        handle, _ = await c.alloc_buffer(1 << 20)
        base = await c.buffer_base(handle)
        from rpcnet import _native

        t = _native.RpcTensor(id=1, type=0, buffer=handle, data=base, ne=(1 << 18, 1, 1, 1))
        data = os.urandom(1 << 20)
        await c.set_tensor(t, 0, data)
        got = await c.get_tensor(t, 0, 1 << 20)
        assert got == data
        return got


def test_self_signed_pair_made_once_and_private(tmp_path, monkeypatch):
    require.module("cryptography")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    cert, key = tls.self_signed()
    assert cert.parent == tmp_path / "state" / "rpcnet" / "tls"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    first = tls.cert_fingerprint(cert)
    assert tls.self_signed() == (cert, key) and tls.cert_fingerprint(cert) == first
    tls.server_context(cert, key)  # loads


def test_fingerprint_parsing():
    hexed = "ab" * 32
    assert tls.parse_fingerprint(":".join(["AB"] * 32)) == hexed
    assert tls.parse_fingerprint(hexed.upper()) == hexed
    for bad in ("ab" * 31, "zz" * 32, ""):
        with pytest.raises(tls.TlsSetupError):
            tls.parse_fingerprint(bad)


def test_tunnel_to_self_signed_server_pinned(server_factory, tmp_path, monkeypatch, caplog):
    """--tls-self-signed: the fingerprint the server logs is the one the tunnel pins; bytes
    arrive intact both ways; the tunnel's status line names TLS 1.3, fingerprint, tenant."""
    require.module("cryptography")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    tokens = write_tokens(tmp_path / "tokens", {"alice": (TOKEN, None)})
    srv = server_factory(mem=256 << 20, tls_self_signed=True, tokens=tokens)
    fp = srv.server.fingerprint
    assert fp == tls.cert_fingerprint(tmp_path / "state/rpcnet/tls/server.pem")
    tunnel = TunnelThread([("127.0.0.1", srv.port)], TOKEN, fingerprint=fp).start()
    try:
        with caplog.at_level(logging.INFO):
            asyncio.run(roundtrip(tunnel.ports[0]))
        line = next(r.getMessage() for r in caplog.records if "tunnel to" in r.getMessage())
        assert "TLSv1.3" in line and tls.colon_hex(fp) in line and "tenant alice" in line
        assert TOKEN not in caplog.text
    finally:
        tunnel.stop()
    assert_nothing_held(srv)


def test_tunnel_with_ca(server_factory, pki, tokens):
    srv = secure_server(server_factory, pki, tokens)
    tunnel = TunnelThread([("127.0.0.1", srv.port)], TOKEN, ca=pki.ca_path).start()
    try:
        asyncio.run(roundtrip(tunnel.ports[0]))
    finally:
        tunnel.stop()
    assert_nothing_held(srv)


def test_tls_only_1_3(server_factory, pki, caplog):
    srv = secure_server(server_factory, pki)
    with pytest.raises(ssl.SSLError):
        tls_socket(srv.port, maximum_version=ssl.TLSVersion.TLSv1_2)
    wait_until(lambda: "refused: TLS handshake failed" in caplog.text)
    with tls_socket(srv.port) as sock:  # 1.3 works, and TLS without tokens needs no preamble
        assert sock.version() == "TLSv1.3"
        sock.sendall(HELLO)
        assert sock.recv(8)[:1] == b"\x1c"
    assert_nothing_held(srv)


def test_plain_tcp_to_tls_port_refused(server_factory, pki, tokens, caplog):
    srv = secure_server(server_factory, pki, tokens)
    with pytest.raises(ConnectionError):
        RawConn(srv.port)  # a plain llama.cpp-like HELLO
    wait_until(lambda: "plain TCP client on a TLS port" in caplog.text)
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, [r.getMessage() for r in refusals]
    assert_nothing_held(srv)


def test_tls_to_plain_port_refused(server_factory, caplog):
    srv = server_factory(mem=256 << 20)
    tunnel = TunnelThread([("127.0.0.1", srv.port)], TOKEN, fingerprint="00" * 32).start()
    try:
        with socket.create_connection(("127.0.0.1", tunnel.ports[0]), timeout=10) as sock:
            sock.sendall(HELLO)
            assert sock.recv(8) == b""  # the tunnel could not open: the client is closed
        wait_until(lambda: "a TLS handshake on a plain TCP port" in caplog.text)
        wait_until(lambda: "tunnel to" in caplog.text)
    finally:
        tunnel.stop()
    assert_nothing_held(srv)


def test_slow_handshake_times_out(server_factory, pki, caplog):
    srv = secure_server(server_factory, pki, hello_timeout=1.0)
    with socket.create_connection(("127.0.0.1", srv.port)) as sock:
        sock.settimeout(5)
        assert sock.recv(1) == b""  # closed by the server, nothing sent
    wait_until(lambda: "refused: no TLS handshake within 1 s" in caplog.text)
    assert_nothing_held(srv)


def test_expired_certificate_refused_by_tunnel(server_factory, pki, tokens, caplog):
    srv = secure_server(server_factory, pki, tokens, cert=pki.expired)
    tunnel = TunnelThread([("127.0.0.1", srv.port)], TOKEN, ca=pki.ca_path).start()
    try:
        with socket.create_connection(("127.0.0.1", tunnel.ports[0]), timeout=10) as sock:
            sock.sendall(HELLO)
            assert sock.recv(8) == b""
        wait_until(lambda: "certificate has expired" in caplog.text)
    finally:
        tunnel.stop()
    assert_nothing_held(srv)


def test_wrong_certificate_refused_before_the_token_leaves(
    server_factory, pki, tokens, tmp_path, caplog
):
    """A pinned fingerprint that is not the server's, and a CA that did not sign it: the tunnel
    closes after the handshake; the server never sees the token."""
    srv = secure_server(server_factory, pki, tokens)
    other = Pki(tmp_path / "other", "other-ca")
    for kw in ({"fingerprint": "11" * 32}, {"ca": other.ca_path}):
        tunnel = TunnelThread([("127.0.0.1", srv.port)], TOKEN, **kw).start()
        try:
            with socket.create_connection(("127.0.0.1", tunnel.ports[0]), timeout=10) as sock:
                sock.sendall(HELLO)
                assert sock.recv(8) == b""
        finally:
            tunnel.stop()
    wait_until(lambda: "is not the pinned" in caplog.text)
    assert "TLS handshake failed: unable to get local issuer certificate" in caplog.text
    wait_until(lambda: caplog.text.count("refused:") >= 2)
    assert "tenant alice" not in caplog.text
    assert_nothing_held(srv)


def test_refused_connections_do_not_disturb_others(server_factory, pki, tokens):
    srv = secure_server(server_factory, pki, tokens)
    tunnel = TunnelThread([("127.0.0.1", srv.port)], TOKEN, ca=pki.ca_path).start()

    async def main() -> None:
        async with await RpcClient.connect("127.0.0.1", tunnel.ports[0]) as honest:
            handle, _ = await honest.alloc_buffer(1 << 20)
            for _ in range(3):
                with pytest.raises(ConnectionError):
                    RawConn(srv.port)
                with tls_socket(srv.port) as s:
                    assert present_token(s, "not-the-token-at-all") in (None, (1, ""))
            assert await honest.buffer_base(handle)

    try:
        asyncio.run(main())
    finally:
        tunnel.stop()
    assert_nothing_held(srv)


def test_unread_response_holds_little_ciphertext(server_factory, pki, tokens, monkeypatch):
    """A client that asks for 64 MiB and reads nothing: the server encrypts a piece at a time
    (transport/tlssocket.py), the next only once the socket took the last, so it holds at most
    one piece of ciphertext, and the rest stays a view of the buffer. Then it reads it all,
    intact."""
    from rpcnet import _native
    from rpcnet.transport.tlssocket import SEND_PIECE
    from support.raw import frame

    monkeypatch.setenv("RPCNET_SHARE_WEIGHTS", "0")  # the buffer's own bytes, read in place
    srv = secure_server(server_factory, pki, tokens)
    size = 64 << 20
    with tls_socket(srv.port) as s:
        s.settimeout(10)
        assert present_token(s, TOKEN) == (0, "alice")

        def call(cmd: int, payload: bytes, n: int) -> bytes:
            s.sendall(frame(cmd, payload))
            head = b""
            while len(head) < 8:
                head += s.recv(8 - len(head))
            assert int.from_bytes(head, "little") == n
            out = bytearray()
            while len(out) < n:
                out += s.recv(n - len(out))
            return bytes(out)

        call(HELLO[0], bytes(24), 28)
        handle, _ = struct_unpack("<QQ", call(0, struct_pack("<IQ", 0, size), 16))
        base = struct_unpack("<Q", call(3, struct_pack("<Q", handle), 8))[0]
        t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(size, 1, 1, 1))
        head = os.urandom(1 << 20)
        s.sendall(frame(6, t.to_bytes() + b"\0" + struct_pack("<Q", 0) + head))
        s.sendall(frame(8, t.to_bytes() + struct_pack("<QQ", 0, size)))  # GET_TENSOR, unread

        def transport():
            conns = list(srv.server.connections.values())
            return conns[0].stream.transport if conns else None

        wait_until(lambda: srv.call(lambda: bool(transport() and transport()._pending)))
        time.sleep(0.3)  # let it settle where the socket stops taking bytes
        cipher, pending, views = srv.call(
            lambda: (
                transport().ciphertext_held(),
                transport().get_write_buffer_size(),
                [type(v.obj) for v in transport()._pending],
            )
        )
        assert cipher <= SEND_PIECE + (16 << 10), cipher  # a piece and its records' overhead
        assert pending > size // 2  # the rest is still the buffer's own bytes, not ciphertext
        assert bytes not in views and bytearray not in views, views
        got = bytearray()
        (n,) = struct_unpack("<Q", _recv_exactly(s, 8))
        assert n == size
        got = _recv_exactly(s, size)
        assert got[: 1 << 20] == head and not any(got[-4096:])
    assert_nothing_held(srv)


def test_a_client_that_stops_reading_holds_one_read_of_ciphertext(server_factory, pki, tokens):
    """Frames keep coming while the server waits for the client to read a 64 MiB GET_TENSOR:
    the stream's staging fills, reading pauses, and the server holds at most one socket read of
    ciphertext not yet decrypted; the rest stays in the kernel's socket buffers."""
    from rpcnet import _native
    from rpcnet.server.stream import STAGING
    from rpcnet.transport.tlssocket import READ_SIZE, RECORD
    from support.raw import frame

    srv = secure_server(server_factory, pki, tokens)
    size = 64 << 20
    with tls_socket(srv.port) as s:
        s.settimeout(10)
        assert present_token(s, TOKEN) == (0, "alice")
        s.sendall(frame(HELLO[0], bytes(24)))
        assert len(_recv_exactly(s, 8 + 28)) == 36
        s.sendall(frame(0, struct_pack("<IQ", 0, size)))
        handle, _ = struct_unpack("<QQ", _recv_exactly(s, 8 + 16)[8:])
        s.sendall(frame(3, struct_pack("<Q", handle)))
        base = struct_unpack("<Q", _recv_exactly(s, 8 + 8)[8:])[0]
        t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(size, 1, 1, 1))
        s.sendall(frame(8, t.to_bytes() + struct_pack("<QQ", 0, size)))  # GET_TENSOR, unread
        s.settimeout(2)
        more = frame(15) * (1 << 20)  # GET_DEVICE_COUNT frames, 9 MiB of them
        sent = 0
        try:
            while sent < len(more):
                sent += s.send(more[sent : sent + (1 << 20)])
        except TimeoutError:
            pass  # the server stopped reading: everything is full
        assert sent > STAGING + READ_SIZE

        def held() -> tuple[int, int]:
            conn = next(iter(srv.server.connections.values()))
            return conn.stream.transport._incoming.pending, len(conn.stream.staged())

        time.sleep(0.3)
        cipher, staged = srv.call(held)
        assert cipher <= READ_SIZE + RECORD, cipher
        assert staged <= STAGING
    assert_nothing_held(srv)


def _recv_exactly(sock, n: int) -> bytes:
    out = bytearray(n)
    view, got = memoryview(out), 0
    while got < n:
        k = sock.recv_into(view[got:])
        assert k, "closed"
        got += k
    return bytes(out)


def test_tunnel_holds_little_for_a_client_that_does_not_read(server_factory, pki, tokens):
    """Through the tunnel, a 64 MiB GET_TENSOR the client does not read: the tunnel stops
    reading the server once its queue to the client is full (4 MiB, plus one read burst), and
    the server keeps the rest as a view of the buffer."""
    from rpcnet import _native
    from rpcnet.tunnelio import READ_BURST, WRITE_HIGH
    from support.raw import frame

    srv = secure_server(server_factory, pki, tokens)
    tunnel = TunnelThread([("127.0.0.1", srv.port)], TOKEN, ca=pki.ca_path).start()
    size = 64 << 20
    try:
        c = RawConn(tunnel.ports[0])
        handle, _ = struct_unpack("<QQ", c.call(0, struct_pack("<IQ", 0, size), 16))
        base = struct_unpack("<Q", c.call(3, struct_pack("<Q", handle), 8))[0]
        t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(size, 1, 1, 1))
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
        c.send(frame(8, t.to_bytes() + struct_pack("<QQ", 0, size)))  # GET_TENSOR, unread

        def server_waits() -> bool:
            conns = list(srv.server.connections.values())
            return bool(conns and conns[0].stream.transport.get_write_buffer_size())

        wait_until(lambda: srv.call(server_waits))
        time.sleep(0.3)
        sides = list(tunnel.tunnel.sides)
        assert len(sides) == 1
        queued = asyncio.run_coroutine_threadsafe(_write_buffer(sides[0]), tunnel.loop).result(5)
        assert queued <= WRITE_HIGH + READ_BURST, queued
        assert c.read_response(size) is not None  # then everything arrives
        c.sock.close()
    finally:
        tunnel.stop()
    assert_nothing_held(srv)


async def _write_buffer(side) -> int:
    return side.transport.get_write_buffer_size()
