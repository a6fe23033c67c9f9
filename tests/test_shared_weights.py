"""Identical uploads held once: real sockets on 127.0.0.1, an in-process server, RpcClient.

Two clients that upload the same bytes hold one copy; every kind of write gives the writer its
own copy first (copy on write) and leaves the other client's bytes alone; the pool gets the
bytes back and charges them again on copy; --client-mem still counts them in full; uploads with
the same FNV-1a but other bytes never share.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.client import RpcClient, ServerClosed
from rpcnet.compute.ops import Op
from support.secure import TunnelThread, write_tokens
from test_tokens import ALICE, MALLORY, pki, serve  # noqa: F401 - pki is a fixture

MiB = 1 << 20
SIZE = 4 * MiB
BUF = 8 * MiB
AT = 4096 + 32  # not page-aligned: shares need no alignment
F32 = 0


def sharing(srv) -> tuple[int, int, int]:
    """(bytes shared, bytes saved, contents held) on device 0."""
    return srv.call(lambda: srv.server.devices[0].shared_store.stats())


class Holder:
    """One client with one buffer and one f32 tensor of SIZE bytes at AT."""

    def __init__(self, client: RpcClient, handle: int, base: int) -> None:
        self.c, self.handle, self.base = client, handle, base
        self.t = tensor(handle, base + AT, SIZE)

    @classmethod
    async def open(cls, port: int, data: bytes | None = None, proto: int = 8) -> Holder:
        c = await RpcClient.connect("127.0.0.1", port, proto=proto)
        handle, _ = await c.alloc_buffer(BUF)
        assert handle
        holder = cls(c, handle, await c.buffer_base(handle))
        if data is not None:
            await c.set_tensor(holder.t, 0, data)
            await c.device_count()  # SET_TENSOR has no reply: this one comes after it is done
        return holder

    async def read(self) -> bytes:
        return await self.c.get_tensor(self.t, 0, SIZE)


def tensor(handle: int, data: int, nbytes: int, **kw) -> _native.RpcTensor:
    return _native.RpcTensor(
        id=kw.pop("id", 1), type=F32, buffer=handle, data=data, ne=(nbytes // 4, 1, 1, 1), **kw
    )


def test_identical_uploads_are_held_once_and_freed_with_the_last_user(server_factory):
    srv = server_factory(mem=1 << 30)
    data = os.urandom(SIZE)

    async def main() -> None:
        a = await Holder.open(srv.port, data)
        assert srv.memory_held() == BUF  # one user: the range's bytes moved into the content
        b = await Holder.open(srv.port, data)
        assert srv.memory_held() == 2 * BUF - SIZE  # the second copy is not held
        assert sharing(srv) == (SIZE, SIZE, 1)
        assert await a.read() == data and await b.read() == data
        assert await b.c.get_tensor(b.t, 1000, 64) == data[1000:1064]
        # a read across the range's edges: the buffer's own bytes around the shared ones
        around = tensor(b.handle, b.base + AT - 4096, SIZE + 8192)
        got = await b.c.get_tensor(around, 0, SIZE + 8192)
        assert got[4096 : 4096 + SIZE] == data
        await a.c.close()
        while srv.memory_held() != BUF:
            await asyncio.sleep(0.01)
        assert await b.read() == data  # the copy lives on with its last user
        assert sharing(srv) == (0, 0, 1)
        await b.c.close()
        while srv.memory_held():
            await asyncio.sleep(0.01)
        assert sharing(srv) == (0, 0, 0)

    asyncio.run(main())


async def add_into(h: Holder, at: int) -> None:
    """A graph whose node (ADD of two inputs outside the range) writes 64 KiB at `at` of a
    BUF-byte buffer."""
    n = 64 << 10
    x = tensor(h.handle, h.base + BUF - 2 * n, n, id=11)
    y = tensor(h.handle, h.base + BUF - n, n, id=12)
    await h.c.set_tensor(x, 0, np.full(n // 4, 1.5, np.float32).tobytes())
    await h.c.set_tensor(y, 0, np.full(n // 4, 2.0, np.float32).tobytes())
    out = tensor(h.handle, at, n, id=13, op=int(Op.ADD), src=(11, 12), flags=16)
    await h.c.graph_compute([13], [x, y, out], uid=7)
    await h.c.graph_recompute(uid=7)


def writers(at: int, copied: bytes | None) -> dict[str, tuple[Any, int, bytes | None]]:
    """Every kind of write into a shared range that starts at buffer offset `at`: (the write,
    its offset into the range, the bytes it leaves there; None: not checked). COPY_TENSOR copies
    the buffer's last 64 bytes (`copied`)."""
    return {
        "SET_TENSOR": (lambda h: h.c.set_tensor(h.t, 256, b"\x07" * 64), 256, b"\x07" * 64),
        "SET_TENSOR_2D": (
            lambda h: h.c.set_tensor_2d(h.t, 256, 32, 32, b"\x07" * 64),
            256,
            b"\x07" * 64,
        ),
        "MEMSET_TENSOR": (lambda h: h.c.memset_tensor(h.t, 256, 64, 7), 256, b"\x07" * 64),
        "BUFFER_CLEAR": (lambda h: h.c.buffer_clear(h.handle, 7), 256, b"\x07" * 64),
        "COPY_TENSOR": (
            lambda h: h.c.copy_tensor(
                tensor(h.handle, h.base + BUF - 64, 64, id=9),
                tensor(h.handle, h.base + at + 256, 64),
            ),
            256,
            copied,
        ),
        "GRAPH_COMPUTE": (
            lambda h: add_into(h, h.base + at + 256),
            256,
            np.full(16 << 10, 3.5, np.float32).tobytes(),
        ),
    }


WRITERS = writers(AT, None)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_copy_on_write_isolates_the_writer(server_factory, writer):
    srv = server_factory(mem=1 << 30)
    data = os.urandom(SIZE)
    write, at, expect = WRITERS[writer]

    async def main() -> None:
        a = await Holder.open(srv.port, data)
        b = await Holder.open(srv.port, data)
        assert srv.memory_held() == 2 * BUF - SIZE
        await write(b)
        await b.c.device_count()
        got = await b.read()
        if expect is None:
            expect_b = await b.c.get_tensor(tensor(b.handle, b.base + BUF - 64, 64), 0, 64)
        else:
            expect_b = expect
        assert got[at : at + len(expect_b)] == expect_b
        if writer != "BUFFER_CLEAR":  # the rest of the range is still the uploaded bytes
            assert got[:at] == data[:at] and got[at + len(expect_b) :] == data[at + len(expect_b) :]
        assert await a.read() == data  # the other client's bytes did not change
        held = srv.memory_held()  # the writer's copy is charged again (a plan holds some more)
        assert held == 2 * BUF if writer != "GRAPH_COMPUTE" else held > 2 * BUF
        assert sharing(srv)[0] == 0
        await a.c.close()
        await b.c.close()

    asyncio.run(main())


@pytest.mark.parametrize("proto", [8, 7])
def test_a_plan_built_before_its_weights_were_shared_reads_them_after(server_factory, proto):
    """A cached graph reads a range that is uploaded again afterwards (now shared): its
    recompute sees the new bytes (the plan is resolved anew)."""
    srv = server_factory(mem=1 << 30, proto=proto)
    n = 64 << 10
    first = np.full(SIZE // 4, 1.0, np.float32).tobytes()
    second = np.arange(SIZE // 4, dtype=np.float32).tobytes()

    async def main() -> None:
        other = await Holder.open(srv.port, second, proto)
        h = await Holder.open(srv.port, first, proto)
        w = tensor(h.handle, h.base + AT, n, id=21)  # the first 64 KiB of the range
        outs, _ = await h.c.alloc_buffer(n)  # written by the graph (its uploads never share)
        base = await h.c.buffer_base(outs)
        out = tensor(outs, base, n, id=22, op=int(Op.ADD), src=(21, 21), flags=16)
        await h.c.graph_compute([22], [w, out], uid=3)
        assert await h.c.get_tensor(out, 0, 64) == np.full(16, 2.0, np.float32).tobytes()
        await h.c.set_tensor(h.t, 0, second)  # the same bytes as `other`: shared now
        await h.c.device_count()
        assert sharing(srv)[0] == SIZE
        await h.c.graph_recompute(uid=3)
        want = 2 * np.arange(16, dtype=np.float32)
        assert await h.c.get_tensor(out, 0, 64) == want.tobytes()
        await other.c.close()
        await h.c.close()

    asyncio.run(main())


def test_a_graph_reading_across_a_ranges_edge_gets_its_own_copy(server_factory):
    """A tensor that lies partly in a shared range is read from the client's own copy (made
    when the graph is built); the other client keeps the shared content alone."""
    srv = server_factory(mem=1 << 30)
    data = np.arange(SIZE // 4, dtype=np.float32).tobytes()
    n, before = 64 << 10, 1024

    async def main() -> None:
        a = await Holder.open(srv.port, data)
        b = await Holder.open(srv.port, data)
        await b.c.set_tensor(tensor(b.handle, b.base + AT - before, before, id=5), 0, bytes(before))
        await b.c.device_count()
        assert sharing(srv)[0] == SIZE
        src = tensor(b.handle, b.base + AT - before, n, id=31)  # 1 KiB before the range
        outs, _ = await b.c.alloc_buffer(n)
        base = await b.c.buffer_base(outs)
        out = tensor(outs, base, n, id=32, op=int(Op.ADD), src=(31, 31), flags=16)
        await b.c.graph_compute([32], [src, out], uid=4)
        got = np.frombuffer(await b.c.get_tensor(out, 0, n), np.float32)
        head = np.zeros(before // 4, np.float32)
        want = 2 * np.concatenate([head, np.arange((n - before) // 4, dtype=np.float32)])
        assert np.array_equal(got, want)
        assert sharing(srv) == (0, 0, 1)  # b's range is its own now; a holds the content
        assert await a.read() == data and await b.read() == data
        await a.c.close()
        await b.c.close()

    asyncio.run(main())


def client_mem_counts_shared_bytes(srv: Any, holder: Any, caplog: Any) -> None:
    """Two clients share SIZE on `srv` (--client-mem BUF + 2 MiB); the second still holds BUF
    against its quota. `holder`: the Holder class of the device under test."""

    async def main() -> None:
        data = os.urandom(SIZE)
        a = await holder.open(srv.port, data)
        b = await holder.open(srv.port, data)
        assert sharing(srv)[0] == SIZE
        # b holds BUF against its quota although SIZE of it is shared: 4 MiB more is refused
        assert (await b.c.alloc_buffer(4 * MiB))[0] == 0
        assert (await b.c.alloc_buffer(2 * MiB))[0] != 0
        await a.c.close()
        await b.c.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert "quota" in caplog.text


def test_client_mem_counts_shared_bytes_in_full(server_factory, caplog):
    srv = server_factory(mem=1 << 30, client_mem=BUF + 2 * MiB)
    client_mem_counts_shared_bytes(srv, Holder, caplog)


def test_a_copy_on_write_without_room_closes_the_writer_only(server_factory, caplog):
    # a and b share SIZE: the pool holds 2 * BUF - SIZE; a third client fills it up
    srv = server_factory(mem=2 * BUF)
    copy_on_write_without_room_closes_the_writer(srv, Holder, caplog)


def copy_on_write_without_room_closes_the_writer(srv: Any, holder: Any, caplog: Any) -> None:
    """Two clients share SIZE on `srv` (--mem 2 * BUF), a third fills the rest: the writer's
    copy on write finds no room, so its connection alone closes and the other reads on."""
    data = os.urandom(SIZE)

    async def main() -> None:
        a = await holder.open(srv.port, data)
        b = await holder.open(srv.port, data)
        filler = await RpcClient.connect("127.0.0.1", srv.port)
        assert (await filler.alloc_buffer(SIZE))[0] != 0
        await b.c.memset_tensor(b.t, 0, 64, 1)  # needs SIZE more for b's own copy: none left
        with pytest.raises(ServerClosed):
            await b.c.device_count()
        assert await a.read() == data
        await a.c.close()
        await filler.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "copy on write" in r.getMessage()]
    assert len(lines) == 1 and "closing connection: MEMSET_TENSOR" in lines[0], lines


def weak_hash(data) -> int:
    """A hash with collisions a test can make (a forged FNV-1a collision): the first byte."""
    view = memoryview(data).cast("B")
    return 0x1000 + (view[0] if len(view) else 0)


def forged_fnv_never_shares(srv: Any, holder: Any, caplog: Any, check: Any = None) -> None:
    """With `weak_hash` as FNV-1a on `srv` (a cache): two uploads of one hash and other bytes
    share nothing, and a third client asking by that hash gets the first upload's bytes.
    `check(srv, third)` looks at the device's side of it (optional)."""
    weights = b"\x07" + os.urandom(SIZE - 1)
    forged = b"\x07" + os.urandom(SIZE - 1)  # same (weak) FNV-1a, other bytes
    digest = weak_hash(weights)

    async def main() -> None:
        a = await holder.open(srv.port)
        await a.c.set_tensor(a.t, 0, weights, cache=True)
        await a.c.device_count()
        mallory = await holder.open(srv.port)
        await mallory.c.set_tensor(mallory.t, 0, forged, cache=True)
        await mallory.c.device_count()  # its cache store has finished
        assert sharing(srv) == (0, 0, 2)  # two contents, nothing shared
        assert await a.read() == weights and await mallory.read() == forged
        # a third client asking by that hash gets the weights, never the forged bytes
        c = await holder.open(srv.port)
        assert await c.c.set_tensor_hash(c.t, 0, digest)
        assert await c.read() == weights
        assert sharing(srv) == (SIZE, SIZE, 2)
        if check is not None:
            check(srv, c)
        for h in (a, mallory, c):
            await h.c.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert "FNV-1a collision on 0000000000001007" in caplog.text


def test_a_forged_fnv_collision_never_shares(server_factory, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_native, "fnv1a64", weak_hash)
    srv = server_factory(mem=1 << 30, cache_dir=tmp_path / "cache")
    forged_fnv_never_shares(srv, Holder, caplog)


def test_a_hash_held_in_memory_is_answered_without_the_cache(server_factory, tmp_path):
    srv = server_factory(mem=1 << 30, cache_dir=tmp_path / "cache")
    data = os.urandom(SIZE)
    digest = _native.fnv1a64(data)

    async def main() -> None:
        a = await Holder.open(srv.port)
        await a.c.set_tensor(a.t, 0, data, cache=True)
        await a.c.device_count()
        (tmp_path / "cache" / f"{digest:016x}").unlink()  # only memory can answer now
        b = await Holder.open(srv.port)
        assert await b.c.set_tensor_hash(b.t, 0, digest)
        assert await b.read() == data
        assert sharing(srv) == (SIZE, SIZE, 1)
        # a destination too small for the held content is refused like a cache hit's
        small = tensor(b.handle, b.base + BUF - MiB, MiB)
        assert await b.c.set_tensor_hash(small, 0, 12345) is False  # unknown: a plain miss
        await a.c.close()
        await b.c.close()

    asyncio.run(main())


def test_memory_answers_follow_each_tenants_cache_view(
    server_factory,
    tmp_path,
    monkeypatch,
    caplog,
    pki,  # noqa: F811 - the fixture
):
    """Mallory holds forged bytes under the hash of Alice's weights. Alice's lookups never see
    them (Mallory's namespace is not Alice's); Alice's own upload under that hash is a collision
    (logged) but is still shared, by its bytes, with Alice's next connection; Mallory's lookups
    get Mallory's bytes."""
    monkeypatch.setattr(_native, "fnv1a64", weak_hash)
    tokens = write_tokens(tmp_path / "tokens", {"alice": (ALICE, None), "mallory": (MALLORY, None)})
    srv = serve(server_factory, pki, tokens, cache_dir=tmp_path / "cache")
    alice = TunnelThread([("127.0.0.1", srv.port)], ALICE, ca=pki.ca_path).start()
    mallory = TunnelThread([("127.0.0.1", srv.port)], MALLORY, ca=pki.ca_path).start()
    weights = b"\x07" + os.urandom(SIZE - 1)
    forged = b"\x07" + os.urandom(SIZE - 1)
    digest = weak_hash(weights)

    async def main() -> None:
        m1 = await Holder.open(mallory.ports[0])
        await m1.c.set_tensor(m1.t, 0, forged, cache=True)
        await m1.c.device_count()
        a1 = await Holder.open(alice.ports[0])
        assert not await a1.c.set_tensor_hash(a1.t, 0, digest)  # a miss, not Mallory's bytes
        await a1.c.set_tensor(a1.t, 0, weights, cache=True)
        await a1.c.device_count()
        a2 = await Holder.open(alice.ports[0])
        assert await a2.c.set_tensor_hash(a2.t, 0, digest)
        assert await a2.read() == weights
        m2 = await Holder.open(mallory.ports[0])
        assert await m2.c.set_tensor_hash(m2.t, 0, digest)
        assert await m2.read() == forged
        assert sharing(srv) == (2 * SIZE, 2 * SIZE, 2)  # each content with its own tenant
        for h in (m1, a1, a2, m2):
            await h.c.close()

    try:
        with caplog.at_level(logging.WARNING):
            asyncio.run(main())
    finally:
        alice.stop()
        mallory.stop()
    assert "shared weights: FNV-1a collision on 0000000000001007" in caplog.text
