"""Identical uploads held once on a GPU (CUDA virtual memory management), on the strict CuPy
stand-in: the real CudaBackend and Device behind an in-process server, real sockets, RpcClient.

As on the CPU (test_shared_weights.py): two clients that upload the same bytes hold one copy
(one device allocation), plans read it, every kind of write gives the writer its own copy
first, the pool gets the bytes back, --client-mem counts them in full, a forged FNV-1a never
shares. On the GPU besides: the granules that only shared ranges cover are unmapped and mapped
again on copy on write, edge granules stay mapped, and the stand-in's VMM refuses misuse.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.client import RpcClient, ServerClosed
from rpcnet.compute.cuda import granules
from rpcnet.compute.ops import Op
from rpcnet.compute.shared_content import device_sharing
from support.strict_cupy import (
    GRANULE,
    MemoryFault,
    StrictCupy,
    VmmMisuse,
    strict_cuda_device,
)
from test_shared_weights import (
    client_mem_counts_shared_bytes,
    copy_on_write_without_room_closes_the_writer,
    forged_fnv_never_shares,
    weak_hash,
    writers,
)

MiB = 1 << 20
SIZE = 4 * MiB
BUF = 8 * MiB
AT = GRANULE  # granules 1 and 2 lie wholly inside the shared range
F32 = 0


def serve(server_factory, capacity: int = 1 << 30, cupy: StrictCupy | None = None, **config):
    """An in-process server whose device 0 is CUDA0 on a strict stand-in."""
    device = strict_cuda_device(capacity, cupy)
    return server_factory(devices=[device], **config)


def cp_of(srv) -> StrictCupy:
    return srv.server.devices[0].backend.cp


def sharing(srv) -> tuple[int, int, int]:
    """(bytes shared, bytes saved, contents held) on device 0, as /metrics reports them."""
    got = srv.call(lambda: device_sharing(srv.server.devices[0]))
    return got["shared"], got["saved"], got["contents"]


def tensor(handle: int, data: int, nbytes: int, **kw) -> _native.RpcTensor:
    ne = kw.pop("ne", (nbytes // 4, 1, 1, 1))
    return _native.RpcTensor(id=kw.pop("id", 1), type=F32, buffer=handle, data=data, ne=ne, **kw)


class Holder:
    """One client with one buffer of BUF bytes and one f32 tensor of `size` bytes at `at`."""

    def __init__(self, c: RpcClient, handle: int, base: int, at: int, size: int) -> None:
        self.c, self.handle, self.base, self.size = c, handle, base, size
        self.t = tensor(handle, base + at, size)
        self.ptr: int | None = None  # its device address, once asked (ptr_of)

    @classmethod
    async def open(
        cls, port: int, data: bytes | None = None, at: int = AT, size: int = SIZE
    ) -> Holder:
        c = await RpcClient.connect("127.0.0.1", port)
        handle, _ = await c.alloc_buffer(BUF)
        assert handle
        h = cls(c, handle, await c.buffer_base(handle), at, size)
        if data is not None:
            await c.set_tensor(h.t, 0, data)
            await c.device_count()  # SET_TENSOR has no reply: this one comes after it is done
        return h

    async def read(self) -> bytes:
        return await self.c.get_tensor(self.t, 0, self.size)


def ptr_of(srv, h: Holder) -> int:
    """The device address of the client's buffer (the protocol's base is synthetic)."""
    if h.ptr is None:
        conns = list(srv.server.connections.values())
        h.ptr = srv.call(
            lambda: next(
                int(b.array.data.ptr) for c in conns for b in c.session.buffers if b.base == h.base
            )
        )
    return h.ptr


def mapped(srv, h: Holder) -> list[bool]:
    """Per granule of the client's buffer: whether GPU memory backs it (the stand-in's view)."""
    return cp_of(srv).vmm.mapped_granules(ptr_of(srv, h))


def test_identical_uploads_are_held_once_and_their_granules_unmapped(server_factory):
    srv = serve(server_factory)
    cp = cp_of(srv)
    data = os.urandom(SIZE)

    async def main() -> None:
        a = await Holder.open(srv.port, data)
        assert srv.memory_held() == BUF
        assert mapped(srv, a) == [True, False, False, True]  # its range moved to the content
        b = await Holder.open(srv.port, data)
        assert srv.memory_held() == 2 * BUF - SIZE
        assert sharing(srv) == (SIZE, SIZE, 1)
        assert mapped(srv, b) == [True, False, False, True]
        free, total = await b.c.device_memory(0)
        assert (free, total) == ((1 << 30) - (2 * BUF - SIZE), 1 << 30)  # the refund shows
        assert await a.read() == data and await b.read() == data
        assert await b.c.get_tensor(b.t, 1000, 64) == data[1000:1064]
        # a read across the range's edges: the buffer's own bytes around the shared ones
        own = bytes(range(256)) * 16
        before = tensor(b.handle, b.base + AT - 4096, 4096, id=2)
        await b.c.set_tensor(before, 0, own)
        around = tensor(b.handle, b.base + AT - 4096, SIZE + 8192, id=3)
        got = await b.c.get_tensor(around, 0, SIZE + 8192)
        assert got[:4096] == own and got[4096 : 4096 + SIZE] == data
        content = srv.call(
            lambda: next(iter(srv.server.devices[0].shared_store._by_sample.values()))[0]
        )
        held_at = int(content.array.data.ptr)
        assert cp.timeline.find(held_at, SIZE) is not None  # one device allocation
        del content
        await a.c.close()
        while srv.memory_held() != BUF:
            await asyncio.sleep(0.01)
        assert await b.read() == data  # the copy lives on with its last user
        await b.c.close()
        while srv.memory_held():
            await asyncio.sleep(0.01)
        assert sharing(srv) == (0, 0, 0)
        srv.call(gc.collect)
        gc.collect()
        assert cp.timeline.find(held_at) is None  # freed with its last user
        assert cp.vmm.reservation(ptr_of(srv, a)) is None
        assert cp.vmm.reservation(ptr_of(srv, b)) is None

    asyncio.run(main())
    cp.assert_clean()


def test_a_buffer_keeps_the_granules_its_own_bytes_live_in(server_factory):
    """A shared range that does not cover whole granules keeps its edge granules mapped; two
    ranges end to end free the granule across their edge; a copy on write of one maps it
    again and the other still reads its shared bytes."""
    srv = serve(server_factory)
    one, two = os.urandom(2 * MiB), os.urandom(2 * MiB)

    async def main() -> None:
        edge = await Holder.open(srv.port, os.urandom(SIZE), at=4096 + 32)
        assert mapped(srv, edge) == [True, False, True, True]
        other = await Holder.open(srv.port)  # holds the same two tensors end to end
        a = [
            tensor(other.handle, other.base + MiB + i * 2 * MiB, 2 * MiB, id=5 + i) for i in (0, 1)
        ]
        h = await Holder.open(srv.port)
        b = [tensor(h.handle, h.base + MiB + i * 2 * MiB, 2 * MiB, id=5 + i) for i in (0, 1)]
        for c, (t1, t2) in ((other.c, a), (h.c, b)):
            await c.set_tensor(t1, 0, one)
            await c.device_count()
            # alone, [1, 3) MiB covers no whole granule
            await c.set_tensor(t2, 0, two)
            await c.device_count()
        assert mapped(srv, h) == [True, False, True, True]  # [2, 4) MiB: shared on both sides
        assert sharing(srv)[0] == 4 * MiB
        await h.c.memset_tensor(b[0], 0, 64, 9)  # copy on write of the first range
        await h.c.device_count()
        assert mapped(srv, h) == [True, True, True, True]
        assert await h.c.get_tensor(b[0], 0, 2 * MiB) == b"\x09" * 64 + one[64:]
        assert await h.c.get_tensor(b[1], 0, 2 * MiB) == two
        assert await other.c.get_tensor(a[0], 0, 2 * MiB) == one
        for x in (edge, other, h):
            await x.c.close()

    asyncio.run(main())
    cp_of(srv).assert_clean()


MATMUL_K, MATMUL_M = 1024, 1024  # 4 MiB of f32 weights


async def _matmul(h: Holder, x: np.ndarray, uid: int) -> np.ndarray:
    """out = W @ x on the GPU, W the client's shared tensor (k x m), x and out in a buffer
    the graph writes."""
    k, m = MATMUL_K, MATMUL_M
    w = tensor(h.handle, h.t.data, k * m * 4, id=41, ne=(k, m, 1, 1))
    io, _ = await h.c.alloc_buffer(8 * k + 4 * m)
    base = await h.c.buffer_base(io)
    xt = tensor(io, base, 4 * k, id=42, ne=(k, 1, 1, 1))
    await h.c.set_tensor(xt, 0, x.astype(np.float32).tobytes())
    out = _native.RpcTensor(
        id=43, type=F32, buffer=io, data=base + 4 * k, ne=(m, 1, 1, 1),
        op=int(Op.MUL_MAT), src=(41, 42), flags=16,
    )  # fmt: skip
    await h.c.graph_compute([43], [w, xt, out], uid=uid)
    await h.c.graph_recompute(uid=uid)
    return np.frombuffer(await h.c.get_tensor(out, 0, 4 * m), np.float32)


def test_plans_read_the_shared_content(server_factory):
    """Both clients' products read the one copy (their own granules there are unmapped: a
    kernel reading them would fault or read poison) and match NumPy's."""
    srv = serve(server_factory)
    rng = np.random.default_rng(7)
    weights = rng.standard_normal((MATMUL_M, MATMUL_K)).astype(np.float32)
    x = rng.standard_normal(MATMUL_K).astype(np.float32)
    want = weights.astype(np.float64) @ x.astype(np.float64)

    async def main() -> None:
        a = await Holder.open(srv.port, weights.tobytes())
        b = await Holder.open(srv.port, weights.tobytes())
        assert sharing(srv)[0] == SIZE and mapped(srv, b)[1:3] == [False, False]
        for h in (a, b):
            got = await _matmul(h, x, uid=5)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
        await a.c.close()
        await b.c.close()

    asyncio.run(main())
    cp_of(srv).assert_clean()


def test_a_plan_built_before_its_weights_were_shared_reads_them_after(server_factory):
    """A cached (and replayed) graph reads a range that is uploaded again afterwards, now
    shared: its granules are gone, and its recompute reads the content."""
    srv = serve(server_factory)
    n = 64 << 10
    first = np.full(SIZE // 4, 1.0, np.float32).tobytes()
    second = np.arange(SIZE // 4, dtype=np.float32).tobytes()

    async def main() -> None:
        other = await Holder.open(srv.port, second)
        h = await Holder.open(srv.port)
        await h.c.set_tensor(h.t, 0, first[:n])  # below SHARE_MIN: its own bytes
        w = tensor(h.handle, h.base + AT, n, id=21)
        outs, _ = await h.c.alloc_buffer(n)
        base = await h.c.buffer_base(outs)
        out = tensor(outs, base, n, id=22, op=int(Op.ADD), src=(21, 21), flags=16)
        for _ in range(3):  # eager, captured, replayed
            await h.c.graph_compute([22], [w, out], uid=3)
        assert await h.c.get_tensor(out, 0, 64) == np.full(16, 2.0, np.float32).tobytes()
        await h.c.set_tensor(h.t, 0, second)  # the same bytes as `other`: shared now
        await h.c.device_count()
        assert sharing(srv)[0] == SIZE and mapped(srv, h)[1:3] == [False, False]
        for _ in range(3):
            await h.c.graph_recompute(uid=3)
        want = 2 * np.arange(16, dtype=np.float32)
        assert await h.c.get_tensor(out, 0, 64) == want.tobytes()
        await other.c.close()
        await h.c.close()

    asyncio.run(main())
    cp_of(srv).assert_clean()


WRITERS = writers(AT, b"\x05" * 64)  # the buffer's last 64 bytes (set below)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_copy_on_write_maps_the_granules_again_and_isolates_the_writer(server_factory, writer):
    srv = serve(server_factory)
    data = os.urandom(SIZE)
    write, at, expect = WRITERS[writer]

    async def main() -> None:
        a = await Holder.open(srv.port, data)
        b = await Holder.open(srv.port, data)
        await b.c.set_tensor(tensor(b.handle, b.base + BUF - 64, 64, id=9), 0, b"\x05" * 64)
        assert srv.memory_held() == 2 * BUF - SIZE
        assert mapped(srv, b) == [True, False, False, True]
        await write(b)
        await b.c.device_count()
        assert mapped(srv, b) == [True, True, True, True]
        got = await b.read()
        assert got[at : at + len(expect)] == expect
        if writer != "BUFFER_CLEAR":  # the rest of the range: the content, copied back
            assert got[:at] == data[:at] and got[at + len(expect) :] == data[at + len(expect) :]
        assert await a.read() == data  # the other client's bytes did not change
        assert mapped(srv, a) == [True, False, False, True]
        held = srv.memory_held()  # the writer's copy is charged again (a plan holds some more)
        assert held == 2 * BUF if writer != "GRAPH_COMPUTE" else held > 2 * BUF
        assert sharing(srv)[0] == 0
        await a.c.close()
        await b.c.close()

    asyncio.run(main())
    cp_of(srv).assert_clean()


def test_client_mem_counts_shared_bytes_in_full(server_factory, caplog):
    srv = serve(server_factory, client_mem=BUF + 2 * MiB)
    client_mem_counts_shared_bytes(srv, Holder, caplog)


def test_a_copy_on_write_without_room_in_mem_closes_the_writer_only(server_factory, caplog):
    srv = serve(server_factory, capacity=2 * BUF)
    copy_on_write_without_room_closes_the_writer(srv, Holder, caplog)
    cp_of(srv).assert_clean()


def test_a_copy_on_write_without_gpu_memory_closes_the_writer_only(server_factory, caplog):
    """--mem has room but the GPU has none left (another process took it): the granules
    cannot be mapped again; the writer closes, the other client reads on."""
    srv = serve(server_factory)
    cp = cp_of(srv)
    data = os.urandom(SIZE)

    async def main() -> None:
        a = await Holder.open(srv.port, data)
        b = await Holder.open(srv.port, data)
        cp.total = cp.timeline.device_bytes() + GRANULE  # room for one granule, not two
        await b.c.memset_tensor(b.t, 0, 64, 1)
        with pytest.raises(ServerClosed):
            await b.c.device_count()
        assert await a.read() == data
        await a.c.close()

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if "copy on write" in r.getMessage()]
    assert len(lines) == 1 and "device memory is full" in lines[0], lines


def test_a_forged_fnv_collision_never_shares(server_factory, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_native, "fnv1a64", weak_hash)
    srv = serve(server_factory, cache_dir=tmp_path / "cache")

    def granules_unmapped(srv, third) -> None:
        assert mapped(srv, third) == [True, False, False, True]

    forged_fnv_never_shares(srv, Holder, caplog, granules_unmapped)
    cp_of(srv).assert_clean()


def test_bytes_that_differ_between_the_samples_are_not_shared(server_factory):
    """Equal sampled keys, one byte apart elsewhere: the comparison with the held content
    (read back from the GPU) tells them apart."""
    from rpcnet.compute.shared_content import sample_key

    srv = serve(server_factory)
    data = bytearray(os.urandom(SIZE))
    near = bytearray(data)
    near[100_000] ^= 0xFF
    assert sample_key(data) == sample_key(near)  # only the full comparison differs

    async def main() -> None:
        a = await Holder.open(srv.port, bytes(data))
        b = await Holder.open(srv.port, bytes(near))
        assert sharing(srv) == (0, 0, 2)
        assert await a.read() == data and await b.read() == near
        c = await Holder.open(srv.port, bytes(near))
        assert sharing(srv) == (SIZE, SIZE, 2)
        assert await c.read() == near
        for h in (a, b, c):
            await h.c.close()

    asyncio.run(main())
    cp_of(srv).assert_clean()


@pytest.mark.parametrize("room", [SIZE - 1, SIZE])
def test_uploads_wait_in_host_memory_within_a_bound(server_factory, monkeypatch, room):
    """An upload waits in host memory to be identified only while the uploads waiting fit
    HOST_IN_FLIGHT; one that does not goes straight to the GPU and keeps its own bytes."""
    from rpcnet.server import shared_weights

    budget = shared_weights.HostBudget(room)
    monkeypatch.setattr(shared_weights, "HOST_IN_FLIGHT", budget)
    srv = serve(server_factory)
    data = os.urandom(SIZE)

    async def main() -> None:
        a = await Holder.open(srv.port, data)
        b = await Holder.open(srv.port, data)
        shared = room >= SIZE
        assert sharing(srv) == ((SIZE, SIZE, 1) if shared else (0, 0, 0))
        assert srv.memory_held() == (2 * BUF - SIZE if shared else 2 * BUF)
        assert await a.read() == data and await b.read() == data
        srv.call(gc.collect)
        assert budget.used == 0  # each array given back once identified
        await a.c.close()
        await b.c.close()

    asyncio.run(main())
    cp_of(srv).assert_clean()


def test_without_vmm_each_buffer_holds_its_own_bytes(server_factory):
    srv = serve(server_factory, cupy=StrictCupy(vmm=False))
    data = os.urandom(SIZE)

    async def main() -> None:
        a = await Holder.open(srv.port, data)
        b = await Holder.open(srv.port, data)
        assert srv.memory_held() == 2 * BUF
        assert sharing(srv) == (0, 0, 0)
        assert await a.read() == data and await b.read() == data
        await a.c.close()
        await b.c.close()

    asyncio.run(main())


def test_a_driver_that_refuses_the_vmm_calls_leaves_plain_allocations(caplog):
    """The backend tries one granule's whole round trip before any buffer depends on it: a
    driver that refuses a call means plain allocations and no sharing, with one warning."""
    from rpcnet.compute.cuda.errors import classify
    from support.strict_cupy import strict_cuda_backend

    cupy = StrictCupy()
    assert cupy.vmm is not None

    def refuse(ptr: int, nbytes: int, device: int) -> None:
        raise classify(1, "cuMemSetAccess")  # CUDA_ERROR_INVALID_VALUE

    cupy.vmm.set_access = refuse  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="rpcnet.cuda"):
        be = strict_cuda_backend(cupy)
    assert not be.shares
    assert any("virtual memory management unusable" in r.message for r in caplog.records)
    buf = be.allocate(4 * GRANULE)
    assert buf is not None and be.granules(buf) is None
    assert cupy.vmm.reservation(int(buf.data.ptr)) is None


def test_metrics_count_shared_bytes_per_device(server_factory):
    srv = serve(server_factory)
    data = os.urandom(SIZE)

    async def main() -> None:
        holders = [await Holder.open(srv.port, data) for _ in range(3)]
        got = srv.call(lambda: device_sharing(srv.server.devices[0]))
        assert (got["shared"], got["saved"], got["contents"]) == (SIZE, 2 * SIZE, 1)
        for h in holders:
            await h.c.close()

    asyncio.run(main())


# ------------------------------------------------------------------ the stand-in's VMM rules


@pytest.fixture
def vmm():
    return StrictCupy().vmm


def test_the_granule_map_of_a_buffer_follows_the_rules(vmm):
    gm = granules.reserve(vmm, 0, 3 * GRANULE + 1, GRANULE)
    assert gm is not None and gm.size == 4 * GRANULE and vmm.mapped_granules(gm.base) == [True] * 4
    gm.unmap(1, 3)
    assert vmm.mapped_granules(gm.base) == [True, False, False, True]
    assert gm.map(0, 4)
    gm.close()
    assert vmm.reservation(gm.base) is None
    assert vmm.owner.timeline.physical == 0
    vmm.owner.assert_clean()


def test_mapping_over_a_mapped_granule_is_refused(vmm):
    base = vmm.reserve(2 * GRANULE, GRANULE)
    h1, h2 = vmm.create(GRANULE, 0), vmm.create(GRANULE, 0)
    vmm.map(base, GRANULE, h1)
    with pytest.raises(VmmMisuse, match="mapped already"):
        vmm.map(base, GRANULE, h2)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda v, base, h: v.map(base + 4096, GRANULE, h), "not whole granules"),
        (lambda v, base, h: v.map(base, GRANULE // 2, h), "not whole granules"),
        (lambda v, base, h: v.map(base + 2 * GRANULE, GRANULE, h), "not inside one reservation"),
        (lambda v, base, h: v.unmap(base, GRANULE), "not all mapped"),
        (lambda v, base, h: v.set_access(base, GRANULE, 0), "not mapped"),
        (lambda v, base, h: v.create(GRANULE + 1, 0), "not whole granules"),
    ],
)
def test_misaligned_or_unmapped_calls_are_refused(vmm, call, match):
    base = vmm.reserve(2 * GRANULE, GRANULE)
    handle = vmm.create(GRANULE, 0)
    with pytest.raises(VmmMisuse, match=match):
        call(vmm, base, handle)
    assert vmm.owner.violations


def test_unmapping_part_of_a_mapping_or_freeing_a_mapped_range_is_refused(vmm):
    base = vmm.reserve(2 * GRANULE, GRANULE)
    handle = vmm.create(2 * GRANULE, 0)
    vmm.map(base, 2 * GRANULE, handle)
    with pytest.raises(VmmMisuse, match="cuts a mapping"):
        vmm.unmap(base, GRANULE)
    with pytest.raises(VmmMisuse, match="still has mappings"):
        vmm.free_range(base, 2 * GRANULE)


def test_memory_used_before_set_access_or_after_unmap_faults():
    from support.strict_cupy import strict_cuda_backend

    be = strict_cuda_backend()
    vmm = be.cp.vmm
    base = vmm.reserve(GRANULE, GRANULE)
    handle = vmm.create(GRANULE, 0)
    vmm.map(base, GRANULE, handle)
    other = be._malloc(64)
    with pytest.raises(MemoryFault):  # mapped, no access yet
        be.cp.cuda.runtime.memcpyAsync(int(other.data.ptr), base, 64, 3, be.copy_stream.ptr)
    vmm.set_access(base, GRANULE, 0)
    be.cp.cuda.runtime.memcpyAsync(int(other.data.ptr), base, 64, 3, be.copy_stream.ptr)
    vmm.unmap(base, GRANULE)
    with pytest.raises(MemoryFault):
        be.cp.cuda.runtime.memcpyAsync(int(other.data.ptr), base, 64, 3, be.copy_stream.ptr)


def test_a_buffer_of_reserved_granules_reads_no_unmapped_bytes():
    """The backend's own reads of a buffer whose middle granules were dropped fault there,
    and read the granules it kept."""
    from support.strict_cupy import strict_cuda_backend

    be = strict_cuda_backend()
    buf = be.allocate(4 * GRANULE)
    assert be.can_share(buf)
    be.to_device(buf, 0, b"\x01" * 64)
    be.drop_pages(buf, GRANULE - 1, 3 * GRANULE + 1)
    assert be.cp.vmm.mapped_granules(int(buf.data.ptr)) == [True, False, False, True]
    assert bytes(be.to_host(buf, 0, 64)) == b"\x01" * 64
    with pytest.raises(MemoryFault):
        be.to_host(buf, GRANULE, 64)
