"""Per-tenant tokens (`serve --tokens`): the file, the preamble, refusals, reloads, the tenant's
shared MEM, and cache namespaces (the FNV-1a poisoning attack). In-process servers, real sockets
on loopback, rpcnet's own client through in-process tunnels."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest
from rpcnet import _native
from rpcnet.client import RpcClient, ServerClosed
from rpcnet.server.config import size_bytes
from rpcnet.server.tokens import (
    MAGIC,
    TokensError,
    encode_answer,
    encode_request,
    parse_request_head,
    parse_tokens,
)
from support import require
from support.raw import HELLO
from support.secure import Pki, TunnelThread, present_token, tls_socket, write_tokens
from support.waiting import wait_until

ALICE, BOB, MALLORY = "alice-token-0123456789", "bob-token-abcdefghijkl", "mallory-token-zyxwvu"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    require.module("cryptography")
    pki = Pki(tmp_path_factory.mktemp("pki"))
    pki.good = pki.leaf("server", ("127.0.0.1",))
    return pki


def serve(server_factory, pki, tokens: Path, **config):
    cert, key = pki.good
    return server_factory(mem=512 << 20, tls_cert=cert, tls_key=key, tokens=tokens, **config)


# ------------------------------------------------------------------------------ sans-I/O parts


def test_tokens_file_parsing():
    table = parse_tokens(
        "# tenants\nalice  alice-token-0123456789  512M  # a comment\n\n"
        "bob\tbob-token-abcdefghijkl\n",
        size_bytes,
    )
    assert [(t.name, t.mem) for t in table.tenants] == [("alice", 512 << 20), ("bob", None)]
    assert table.match(ALICE.encode()).name == "alice"
    assert table.match(BOB.encode()).name == "bob"
    assert table.match(b"alice-token-012345678") is None  # a prefix is not the token
    assert table.match(b"") is None


@pytest.mark.parametrize(
    "text,message",
    [
        ("alice\n", "expected NAME TOKEN [MEM]"),
        ("alice tok 1G extra\n", "expected NAME TOKEN [MEM]"),
        ("alice short\n", "16 to 1024 bytes"),
        (f"alice {ALICE}\nalice {BOB}\n", "appears twice"),
        (f"alice {ALICE}\nbob {ALICE}\n", "reuses another tenant's token"),
        (f"alice {ALICE} lots\n", "MEM"),
        (f"root {ALICE}\n", "tenant name"),
        (f"a/b {ALICE}\n", "tenant name"),
    ],
)
def test_tokens_file_errors_name_the_line(text, message):
    with pytest.raises(TokensError, match=re.escape(message)) as err:
        parse_tokens("# header\n" + text, size_bytes)
    assert str(err.value).startswith(f"line {1 + text.count(chr(10))}:")


def test_preamble_bytes():
    assert encode_request(b"t" * 20) == MAGIC + (20).to_bytes(2, "little") + b"t" * 20
    assert parse_request_head(encode_request(b"x" * 17)[:10]) == 17
    assert encode_answer(0, "alice") == MAGIC + b"\x00\x05alice"
    with pytest.raises(ValueError):
        parse_request_head(HELLO[:10])


# ------------------------------------------------------------------------------ refusals


def test_wrong_token_and_no_token_refused(server_factory, pki, tmp_path, caplog):
    tokens = write_tokens(tmp_path / "tokens", {"alice": (ALICE, None)})
    srv = serve(server_factory, pki, tokens)
    with tls_socket(srv.port) as sock:
        assert present_token(sock, "alice-token-0123456788") == (1, "")
        assert sock.recv(1) == b""
    with tls_socket(srv.port) as sock:  # a plain ggml client's first bytes, inside TLS
        sock.sendall(HELLO)
        assert sock.recv(1) == b""
    tunnel = TunnelThread([("127.0.0.1", srv.port)], MALLORY, ca=pki.ca_path).start()
    try:
        with pytest.raises((ServerClosed, ConnectionError, asyncio.IncompleteReadError)):
            asyncio.run(RpcClient.connect("127.0.0.1", tunnel.ports[0]))
        wait_until(lambda: "the server refused the token" in caplog.text)
    finally:
        tunnel.stop()
    wait_until(lambda: caplog.text.count("refused: wrong token") == 2)
    assert "refused: no token preamble" in caplog.text
    for secret in (ALICE, MALLORY, "alice-token-0123456788"):
        assert secret not in caplog.text
    wait_until(lambda: srv.connection_count() == 0)
    assert srv.memory_held() == 0


def test_slow_token_times_out(server_factory, pki, tmp_path, caplog):
    tokens = write_tokens(tmp_path / "tokens", {"alice": (ALICE, None)})
    srv = serve(server_factory, pki, tokens, hello_timeout=1.0)
    with tls_socket(srv.port) as sock:
        sock.settimeout(5)
        assert sock.recv(1) == b""
    wait_until(lambda: "refused: no token preamble within 1 s" in caplog.text)
    wait_until(lambda: srv.connection_count() == 0)
    assert srv.memory_held() == 0
    assert srv.call(lambda: srv.server.stats.refused.get("token", 0)) >= 1


# ------------------------------------------------------------------------------ reloads


def test_reload_closes_connections_whose_token_is_gone(server_factory, pki, tmp_path, caplog):
    tokens = write_tokens(tmp_path / "tokens", {"alice": (ALICE, None), "bob": (BOB, None)})
    srv = serve(server_factory, pki, tokens, tokens_poll=0.1)
    tunnels = {
        name: TunnelThread([("127.0.0.1", srv.port)], tok, ca=pki.ca_path).start()
        for name, tok in (("alice", ALICE), ("bob", BOB), ("carol", "carol-token-000000000"))
    }

    async def logged(line: str) -> None:  # the poll runs every 0.1 s; a loaded host is slower
        deadline = time.monotonic() + 30
        while line not in caplog.text:
            assert time.monotonic() < deadline, f"never logged: {line}"
            await asyncio.sleep(0.05)

    async def main() -> None:
        alice = await RpcClient.connect("127.0.0.1", tunnels["alice"].ports[0])
        bob = await RpcClient.connect("127.0.0.1", tunnels["bob"].ports[0])
        await alice.alloc_buffer(1 << 20)
        await bob.alloc_buffer(1 << 20)
        with pytest.raises((ServerClosed, ConnectionError, asyncio.IncompleteReadError)):
            await RpcClient.connect("127.0.0.1", tunnels["carol"].ports[0])
        # bob is removed, carol added
        write_tokens(tokens, {"alice": (ALICE, None), "carol": ("carol-token-000000000", None)})
        os.utime(tokens, (time.time() + 5, time.time() + 5))
        await logged("bob's token is no longer in --tokens")
        with pytest.raises((ServerClosed, ConnectionError, asyncio.IncompleteReadError)):
            await bob.device_count()
        assert await alice.device_count() == 1  # alice is untouched
        carol = await RpcClient.connect("127.0.0.1", tunnels["carol"].ports[0])
        assert await carol.device_count() == 1
        # a broken file keeps the tenants read before
        tokens.write_text("carol\n")
        os.utime(tokens, (time.time() + 10, time.time() + 10))
        await logged("keeping the tenants read before")
        assert await carol.device_count() == 1 and await alice.device_count() == 1
        await carol.close()
        await alice.close()
        await bob.close()

    try:
        asyncio.run(main())
    finally:
        for t in tunnels.values():
            t.stop()
    assert "keeping the tenants read before" in caplog.text
    wait_until(lambda: srv.connection_count() == 0)
    assert srv.memory_held() == 0


def test_tenant_mem_caps_all_its_connections(server_factory, pki, tmp_path):
    tokens = write_tokens(tmp_path / "tokens", {"alice": (ALICE, "3M"), "bob": (BOB, None)})
    srv = serve(server_factory, pki, tokens)
    ta = TunnelThread([("127.0.0.1", srv.port)], ALICE, ca=pki.ca_path).start()
    tb = TunnelThread([("127.0.0.1", srv.port)], BOB, ca=pki.ca_path).start()

    async def main() -> None:
        a1 = await RpcClient.connect("127.0.0.1", ta.ports[0])
        a2 = await RpcClient.connect("127.0.0.1", ta.ports[0])
        b = await RpcClient.connect("127.0.0.1", tb.ports[0])
        assert (await a1.alloc_buffer(2 << 20))[0] != 0
        assert (await a2.alloc_buffer(2 << 20))[0] == 0  # together over 3M
        assert (await a2.alloc_buffer(1 << 20))[0] != 0
        assert (await b.alloc_buffer(8 << 20))[0] != 0  # bob has no cap
        await a1.close()
        deadline = time.monotonic() + 30
        while srv.connection_count() > 2:  # the server has seen a1 leave
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert (await a2.alloc_buffer(2 << 20))[0] != 0  # a1's share is free again
        await a2.close()
        await b.close()

    try:
        asyncio.run(main())
    finally:
        ta.stop()
        tb.stop()
    wait_until(lambda: srv.connection_count() == 0)
    assert srv.memory_held() == 0


# ------------------------------------------------------------------------------ the cache


def weak_hash(data) -> int:
    """A hash with collisions a test can make: the first byte only."""
    view = memoryview(data).cast("B")
    return 0x1000 + (view[0] if len(view) else 0)


async def upload(port: int, data: bytes, cache: bool = True) -> None:
    async with await RpcClient.connect("127.0.0.1", port) as c:
        handle, _ = await c.alloc_buffer(len(data))
        base = await c.buffer_base(handle)
        t = _native.RpcTensor(id=1, type=0, buffer=handle, data=base, ne=(len(data) // 4, 1, 1, 1))
        await c.set_tensor(t, 0, data, cache=cache)
        await c.device_count()  # the store has finished


async def load_by_hash(port: int, digest: int, size: int) -> bytes | None:
    async with await RpcClient.connect("127.0.0.1", port) as c:
        handle, _ = await c.alloc_buffer(size)
        base = await c.buffer_base(handle)
        t = _native.RpcTensor(id=1, type=0, buffer=handle, data=base, ne=(size // 4, 1, 1, 1))
        if not await c.set_tensor_hash(t, 0, digest):
            return None
        return await c.get_tensor(t, 0, size)


def test_poisoning_attack_fails_across_tenants(server_factory, pki, tmp_path, monkeypatch, caplog):
    """Mallory uploads content with the hash of Alice's weights (a collision: the hash is made
    weak for the test, as a forged FNV-1a collision would be). Without tokens that poisons what
    the next SET_TENSOR_HASH loads; with tokens Mallory's upload stays in Mallory's namespace,
    Alice loads her own weights, and a colliding upload into a shared namespace is refused."""
    monkeypatch.setattr(_native, "fnv1a64", weak_hash)
    weights = b"\x07" + os.urandom((1 << 20) - 1)
    forged = b"\x07" + os.urandom((1 << 20) - 1)  # same weak hash, other content
    digest = weak_hash(weights)
    assert weak_hash(forged) == digest and forged != weights

    # Without tokens (one tenant): the attack works, which is why namespaces exist.
    open_srv = server_factory(mem=256 << 20, cache_dir=tmp_path / "open")
    asyncio.run(upload(open_srv.port, forged))
    assert asyncio.run(load_by_hash(open_srv.port, digest, len(weights))) == forged
    asyncio.run(upload(open_srv.port, weights))  # ... but the collision is detected and refused
    assert "FNV-1a collision on 0000000000001007" in caplog.text

    caplog.clear()
    tokens = write_tokens(
        tmp_path / "tokens", {"alice": (ALICE, None), "mallory": (MALLORY, None), "op": (BOB, None)}
    )
    srv = serve(server_factory, pki, tokens, cache_dir=tmp_path / "cache", cache_shared=("op",))
    tun = TunnelThread([("127.0.0.1", srv.port)] * 3, "unused", ca=pki.ca_path)
    alice = TunnelThread([("127.0.0.1", srv.port)], ALICE, ca=pki.ca_path).start()
    mallory = TunnelThread([("127.0.0.1", srv.port)], MALLORY, ca=pki.ca_path).start()
    operator = TunnelThread([("127.0.0.1", srv.port)], BOB, ca=pki.ca_path).start()
    del tun
    try:
        asyncio.run(upload(mallory.ports[0], forged))  # mallory goes first
        assert asyncio.run(load_by_hash(mallory.ports[0], digest, len(forged))) == forged
        assert asyncio.run(load_by_hash(alice.ports[0], digest, len(weights))) is None  # a miss
        asyncio.run(upload(alice.ports[0], weights))  # alice uploads after her miss
        assert asyncio.run(load_by_hash(alice.ports[0], digest, len(weights))) == weights
        asyncio.run(upload(mallory.ports[0], forged))  # again: still only mallory's namespace
        assert asyncio.run(load_by_hash(alice.ports[0], digest, len(weights))) == weights
        # the operator's shared namespace: every tenant trusts it, a collision is refused
        asyncio.run(upload(operator.ports[0], weights))
        asyncio.run(upload(mallory.ports[0], b"\x07" + os.urandom((1 << 20) - 1)))
        assert "FNV-1a collision on 0000000000001007" in caplog.text
        assert "the shared namespace 'op'" in caplog.text
        assert asyncio.run(load_by_hash(alice.ports[0], digest, len(weights))) == weights
    finally:
        for t in (alice, mallory, operator):
            t.stop()
    cache = tmp_path / "cache" / "tenants"
    assert (cache / "alice" / "0000000000001007").read_bytes() == weights
    assert (cache / "mallory" / "0000000000001007").read_bytes() == forged
    assert not (tmp_path / "cache" / "0000000000001007").exists()  # root: the operator's only
