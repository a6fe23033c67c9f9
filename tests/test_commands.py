"""Every command of both dialects through real sockets, with rpcnet's own client.

Each test runs on two backends (compute/backend.py): host memory, and a backend that moves
bytes the CUDA backend's way (pinned-style staging slots, copies completed only when waited on,
no host view of device memory: tests/support/fakebackend.py).
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.client import RpcClient, ServerClosed
from rpcnet.compute.device import cpu_device
from rpcnet.protocol.commands import Cmd
from support.fakebackend import FakeStagedBackend
from support.inproc import ServerThread

F32 = 0


@pytest.fixture(params=["cpu", "fake-staged"])
def server_factory(request):
    """conftest's factory, per backend (the `server` fixtures build on it)."""
    started: list[ServerThread] = []

    def start(**config) -> ServerThread:
        devices = None
        if request.param == "fake-staged":
            devices = [cpu_device(0, capacity=config.get("mem"))]
            devices[0].backend = FakeStagedBackend(chunk=4096)  # small: payloads take many
        srv = ServerThread(devices, **config).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


def f32_tensor(buffer: int, data: int, ne=(4, 1, 1, 1), tid: int = 1, **kw) -> _native.RpcTensor:
    return _native.RpcTensor(id=tid, type=F32, buffer=buffer, data=data, ne=ne, **kw)


async def connect(srv, proto: int = 8) -> RpcClient:
    return await RpcClient.connect("127.0.0.1", srv.port, proto)


async def test_hello_and_queries(server):
    async with await connect(server) as c:
        assert c.hello_info.version == (8, 0, 0)
        assert c.hello_info.server_caps == bytes(24)
        assert await c.device_count() == 1
        assert await c.alignment() == 32
        assert await c.max_size() == 2**64 - 1
        free, total = await c.device_memory()
        assert total == 1 << 30 and free == total


async def test_v7_hello(server_v7):
    async with await connect(server_v7, 7) as c:
        assert c.hello_info.version == (7, 0, 0)
        assert await c.device_count() == 1


async def test_alloc_set_get_roundtrip(server):
    async with await connect(server) as c:
        handle, size = await c.alloc_buffer(4096)
        assert handle != 0 and size == 4096
        base = await c.buffer_base(handle)
        assert base != 0 and base % 4096 == 0
        free, total = await c.device_memory()
        assert total - free == 4096
        values = np.arange(16, dtype=np.float32)
        t = f32_tensor(handle, base + 64, ne=(16, 1, 1, 1))
        await c.set_tensor(t, 0, values.tobytes())
        got = np.frombuffer(await c.get_tensor(t, 0, 64), dtype=np.float32)
        assert np.array_equal(got, values)
        assert await c.get_tensor(t, 8, 8) == values[2:4].tobytes()
        await c.memset_tensor(t, 4, 8, 0xFF)
        assert (
            await c.get_tensor(t, 0, 16)
            == values[:1].tobytes() + b"\xff" * 8 + values[3:4].tobytes()
        )
        dst = f32_tensor(handle, base + 1024, ne=(16, 1, 1, 1), tid=2)
        assert await c.copy_tensor(t, dst)
        assert await c.get_tensor(dst, 0, 64) == await c.get_tensor(t, 0, 64)
        await c.buffer_clear(handle, 7)
        assert await c.get_tensor(t, 0, 4) == b"\x07" * 4
        await c.free_buffer(handle)
        free, total = await c.device_memory()
        assert free == total


async def test_zero_size_buffer(server):
    async with await connect(server) as c:
        handle, size = await c.alloc_buffer(0)
        assert handle != 0 and size == 0
        assert await c.buffer_base(handle) == 0


async def test_alloc_beyond_memory_answers_zero(server):
    async with await connect(server) as c:
        assert await c.alloc_buffer(2 << 30) == (0, 0)
        assert await c.device_count() == 1  # connection stays open


async def test_alloc_size_is_nbytes(server):
    async with await connect(server) as c:
        t = _native.RpcTensor(type=8, ne=(64, 3, 1, 1))  # q8_0: 2 blocks of 34 bytes per row
        assert await c.alloc_size(t) == 3 * 68


async def test_set_get_2d(server):
    async with await connect(server) as c:
        handle, _ = await c.alloc_buffer(4096)
        base = await c.buffer_base(handle)
        t = f32_tensor(handle, base, ne=(8, 4, 1, 1))
        await c.buffer_clear(handle, 0)
        rows = b"".join(bytes([i]) * 8 for i in range(1, 4))
        await c.set_tensor_2d(t, 4, 8, 32, rows)
        got = await c.get_tensor(t, 0, 128)
        for i in range(3):
            assert got[4 + 32 * i : 12 + 32 * i] == bytes([i + 1]) * 8
        assert await c.get_tensor_2d(t, 4, 8, 3, 32) == rows


async def test_hash_cache_roundtrip(server_factory, tmp_path):
    srv = server_factory(mem=1 << 30, cache_dir=tmp_path)
    data = np.random.default_rng(0).integers(0, 255, 1 << 16, dtype=np.uint8).tobytes()
    digest = _native.fnv1a64(data)
    async with await connect(srv) as c:
        handle, _ = await c.alloc_buffer(1 << 17)
        base = await c.buffer_base(handle)
        t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(1 << 16, 1, 1, 1))
        assert not await c.set_tensor_hash(t, 0, digest)
        await c.set_tensor(t, 0, data, cache=True)
        assert await c.get_tensor(t, 0, 16) == data[:16]
    async with await connect(srv) as c:
        handle, _ = await c.alloc_buffer(1 << 17)
        base = await c.buffer_base(handle)
        t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(1 << 16, 1, 1, 1))
        assert await c.set_tensor_hash(t, 0, digest)  # waits for the background write
        assert await c.get_tensor(t, 0, len(data)) == data
    assert (tmp_path / f"{digest:016x}").read_bytes() == data


async def test_corrupt_cache_file_is_not_served(server_factory, tmp_path):
    srv = server_factory(mem=1 << 30, cache_dir=tmp_path)
    data = bytes(range(256)) * 64
    digest = _native.fnv1a64(data)
    (tmp_path / f"{digest:016x}").write_bytes(data[:-1])  # truncated
    async with await connect(srv) as c:
        handle, _ = await c.alloc_buffer(1 << 16)
        base = await c.buffer_base(handle)
        t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(len(data), 1, 1, 1))
        assert not await c.set_tensor_hash(t, 0, digest)
    assert not (tmp_path / f"{digest:016x}").exists()


def _add_graph(handle: int, base: int, n: int, proto: int = 8):
    a = f32_tensor(handle, base, ne=(n, 1, 1, 1), tid=0xA)
    b = f32_tensor(handle, base + 4 * n, ne=(1, 1, 1, 1), tid=0xB)
    out = f32_tensor(handle, base + 8 * n, ne=(n, 1, 1, 1), tid=0xC, op=2, src=(0xA, 0xB), flags=16)
    return a, b, out


async def test_graph_add_compute_and_recompute(server):
    async with await connect(server) as c:
        handle, _ = await c.alloc_buffer(4096)
        base = await c.buffer_base(handle)
        a, b, out = _add_graph(handle, base, 8)
        await c.set_tensor(a, 0, np.arange(8, dtype=np.float32).tobytes())
        await c.set_tensor(b, 0, np.float32(10).tobytes())
        await c.graph_compute([out.id], [a, b, out], uid=5)
        got = np.frombuffer(await c.get_tensor(out, 0, 32), np.float32)
        assert np.array_equal(got, np.arange(8) + 10)
        await c.set_tensor(b, 0, np.float32(-1).tobytes())
        await c.graph_recompute(uid=5)
        got = np.frombuffer(await c.get_tensor(out, 0, 32), np.float32)
        assert np.array_equal(got, np.arange(8) - 1)


async def test_graph_mul_mat(server):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((6, 16), dtype=np.float32)  # M=6 rows of K=16
    x = rng.standard_normal((3, 16), dtype=np.float32)  # N=3
    async with await connect(server) as c:
        handle, _ = await c.alloc_buffer(4096)
        base = await c.buffer_base(handle)
        tw = f32_tensor(handle, base, ne=(16, 6, 1, 1), tid=1)
        tx = f32_tensor(handle, base + 512, ne=(16, 3, 1, 1), tid=2)
        to = f32_tensor(handle, base + 1024, ne=(6, 3, 1, 1), tid=3, op=29, src=(1, 2), flags=16)
        await c.set_tensor(tw, 0, w.tobytes())
        await c.set_tensor(tx, 0, x.tobytes())
        await c.graph_compute([3], [tw, tx, to], uid=0)
        got = np.frombuffer(await c.get_tensor(to, 0, 72), np.float32).reshape(3, 6)
        np.testing.assert_allclose(got, x @ w.T, rtol=1e-5)


async def test_v7_recompute_uses_last_graph(server_v7):
    async with await connect(server_v7, 7) as c:
        handle, _ = await c.alloc_buffer(4096)
        base = await c.buffer_base(handle)
        a, b, out = _add_graph(handle, base, 4)
        await c.set_tensor(a, 0, np.ones(4, np.float32).tobytes())
        await c.set_tensor(b, 0, np.float32(2).tobytes())
        await c.graph_compute([out.id], [a, b, out])
        await c.set_tensor(b, 0, np.float32(5).tobytes())
        await c.graph_recompute()
        assert np.array_equal(
            np.frombuffer(await c.get_tensor(out, 0, 16), np.float32), np.full(4, 6.0)
        )


async def test_recompute_after_free_closes(server):
    async with await connect(server) as c:
        handle, _ = await c.alloc_buffer(4096)
        base = await c.buffer_base(handle)
        a, b, out = _add_graph(handle, base, 4)
        await c.graph_compute([out.id], [a, b, out], uid=9)
        await c.free_buffer(handle)
        await c.graph_recompute(uid=9)
        with pytest.raises(ServerClosed):
            await c.device_count()


async def test_unsupported_op_closes_only_that_connection(server):
    async with await connect(server) as other, await connect(server) as c:
        handle, _ = await c.alloc_buffer(4096)
        base = await c.buffer_base(handle)
        a = f32_tensor(handle, base, ne=(4, 1, 1, 1), tid=1)
        out = f32_tensor(
            handle, base + 64, ne=(4, 1, 1, 1), tid=2, op=95, src=(1,), flags=16
        )  # CUSTOM
        await c.graph_compute([2], [a, out])
        with pytest.raises(ServerClosed):
            await c.device_count()
        assert await other.device_count() == 1


async def test_comm_init_declines(server):
    async with await connect(server) as c:
        assert not await c.comm_init(0, 0, 3, 51052)  # world must be 2
        assert not await c.comm_init(0, 2, 2, 51052)  # rank must be below world
        assert not await c.comm_init(3, 0, 2, 51052)  # bad device also answers ok = 0
        assert await c.device_count() == 1


def test_cmd_ids_match_spec():
    assert Cmd.HELLO == 14 and Cmd.COMM_FREE == 22
    assert struct.calcsize("<BQ") == 9
