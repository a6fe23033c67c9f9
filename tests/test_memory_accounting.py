"""What a connection makes the server hold besides buffers is counted against --mem and
--client-mem: compiled graphs, receive staging and 2-D read responses."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.client import RpcClient, ServerClosed
from rpcnet.compute.scratch import PLAN_BYTES_PER_TENSOR

F32, SCALE = 0, 32
MiB = 1 << 20


def scale_chain(handle: int, base: int, n: int) -> tuple[list[int], list[_native.RpcTensor]]:
    """x -> SCALE -> SCALE ... (n nodes), all in place on one 4-byte tensor."""
    params = np.array([1.0, 1.0], np.float32).tobytes()
    x = _native.RpcTensor(id=1, type=F32, buffer=handle, data=base, ne=(1, 1, 1, 1))
    tensors = [x]
    for i in range(n):
        tensors.append(
            _native.RpcTensor(
                id=2 + i,
                type=F32,
                buffer=handle,
                data=base,
                ne=(1, 1, 1, 1),
                op=SCALE,
                op_params=params,
                src=(1 + i,),
                flags=16,
            )
        )
    return [t.id for t in tensors[1:]], tensors


async def closed(c: RpcClient) -> bool:
    try:
        await asyncio.wait_for(c.device_count(), 5)
    except (ServerClosed, ConnectionError, asyncio.IncompleteReadError, OSError):
        return True
    return False


async def test_cached_graphs_count_against_device_memory_until_dropped(server):
    async with await RpcClient.connect("127.0.0.1", server.port) as c:
        free0, total = await c.device_memory()
        h, _ = await c.alloc_buffer(4096)
        base = await c.buffer_base(h)
        nodes, tensors = scale_chain(h, base, 99)
        await c.graph_compute(nodes, tensors, uid=5)
        free1, _ = await c.device_memory()
        scratch = server.call(lambda: server.server.devices[0].scratch.reserved)
        assert free0 - free1 == 4096 + 100 * PLAN_BYTES_PER_TENSOR + scratch
        await c.free_buffer(h)  # drops the plan that uses it, and its scratch
        await c.device_count()
        assert (await c.device_memory())[0] == free0 == total


async def test_graph_cache_over_client_quota_closes(server_factory):
    srv = server_factory(mem=1 << 30, client_mem=MiB)
    async with await RpcClient.connect("127.0.0.1", srv.port) as c:
        h, _ = await c.alloc_buffer(4096)
        base = await c.buffer_base(h)
        nodes, tensors = scale_chain(h, base, 99)  # ~200 KiB per cached plan
        for uid in range(1, 6):
            await c.graph_compute(nodes, tensors, uid=uid)
        assert not await closed(c)  # 4 KiB + 5 x 200 KiB < 1 MiB
        try:  # the server may close while later graphs are still being sent
            for uid in range(6, 12):
                await c.graph_compute(nodes, tensors, uid=uid)
        except (ServerClosed, ConnectionError, OSError):
            pass
        assert await closed(c)
    async with await RpcClient.connect("127.0.0.1", srv.port) as c2:
        for _ in range(100):  # the server frees a closed connection's state just after closing
            free, total = await c2.device_memory()
            if free == total:
                break
            await asyncio.sleep(0.05)
        assert free == total, f"{total - free} bytes still held"  # plans, scratch released


@pytest.mark.parametrize("stride", [0, 64])
async def test_two_d_reads_are_counted_like_payloads(server_factory, stride):
    srv = server_factory(mem=1 << 30, client_mem=8 * MiB)
    async with await RpcClient.connect("127.0.0.1", srv.port) as c:
        h, _ = await c.alloc_buffer(MiB)
        base = await c.buffer_base(h)
        t = _native.RpcTensor(id=1, type=F32, buffer=h, data=base, ne=(MiB // 4, 1, 1, 1))
        row = np.arange(16, dtype=np.float32).tobytes()
        await c.set_tensor(t, 0, row)
        got = await c.get_tensor_2d(t, 0, 64, 1024, stride)  # 64 KiB: served
        assert got[:64] == row
        # 16 Ki copies of 1 KiB rows: 16 MiB of response from a 1 MiB buffer, over the quota
        with pytest.raises((ServerClosed, ConnectionError, OSError)):
            await asyncio.wait_for(c.get_tensor_2d(t, 0, 1024, 16384, stride), 10)


async def test_large_staged_payload_over_quota_closes(server_factory):
    srv = server_factory(mem=1 << 30, client_mem=4 * MiB)
    async with await RpcClient.connect("127.0.0.1", srv.port) as c:
        h, _ = await c.alloc_buffer(2 * MiB)
        base = await c.buffer_base(h)
        t = _native.RpcTensor(id=1, type=F32, buffer=h, data=base, ne=(MiB // 2, 1, 1, 1))
        rows = bytes(3 * MiB // 2)  # 1.5 MiB staged + 2 MiB buffer <= 4 MiB: fine
        await c.set_tensor_2d(t, 0, 1024, 1024, rows)
        assert not await closed(c)
        # 2 MiB buffer + 2.5 MiB staged > 4 MiB (rows overlap in place: stride 0 is allowed)
        try:  # the server may close (and reset) before the whole payload is sent
            await c.set_tensor_2d(t, 0, 1024, 0, bytes(5 * MiB // 2))
        except (ServerClosed, ConnectionError, OSError):
            pass
        assert await closed(c)
