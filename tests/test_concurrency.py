"""Many clients at once: held connections never block new ones; handles are per connection."""

from __future__ import annotations

import asyncio
import struct

import pytest
from rpcnet import _native
from rpcnet.client import RpcClient, ServerClosed


async def test_sixteen_held_connections_do_not_block_hello(server):
    held = [await RpcClient.connect("127.0.0.1", server.port) for _ in range(16)]
    for c in held:  # every held client owns memory and is mid-session
        await c.alloc_buffer(1 << 16)

    async def short_probe() -> int:
        async with await RpcClient.connect("127.0.0.1", server.port) as c:
            return await c.device_count()

    results = await asyncio.wait_for(asyncio.gather(*(short_probe() for _ in range(12))), 10)
    assert results == [1] * 12
    assert server.connection_count() >= 16
    for c in held:
        await c.close()


async def test_handle_of_another_connection_is_refused(server):
    async with await RpcClient.connect("127.0.0.1", server.port) as owner:
        handle, _ = await owner.alloc_buffer(4096)
        base = await owner.buffer_base(handle)
        async with await RpcClient.connect("127.0.0.1", server.port) as thief:
            with pytest.raises(ServerClosed):
                await thief.buffer_base(handle)
        async with await RpcClient.connect("127.0.0.1", server.port) as thief:
            t = _native.RpcTensor(id=1, type=0, buffer=handle, data=base, ne=(4, 1, 1, 1))
            with pytest.raises(ServerClosed):
                await thief.get_tensor(t, 0, 16)  # treated as "no buffer": close
        assert await owner.buffer_base(handle) == base  # the owner is unaffected


async def test_memory_is_shared_and_released_per_connection(server):
    a = await RpcClient.connect("127.0.0.1", server.port)
    b = await RpcClient.connect("127.0.0.1", server.port)
    await a.alloc_buffer(300 << 20)
    free, total = await b.device_memory()
    assert total - free == 300 << 20
    await a.close()
    for _ in range(100):
        free, total = await b.device_memory()
        if free == total:
            break
        await asyncio.sleep(0.02)
    assert free == total
    await b.close()


async def test_interleaved_clients_keep_their_data(server):
    async def worker(i: int) -> bool:
        async with await RpcClient.connect("127.0.0.1", server.port) as c:
            handle, _ = await c.alloc_buffer(1 << 16)
            base = await c.buffer_base(handle)
            t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(1 << 16, 1, 1, 1))
            payload = struct.pack("<I", i) * (1 << 14)
            for _ in range(5):
                await c.set_tensor(t, 0, payload)
                await asyncio.sleep(0)
                if await c.get_tensor(t, 0, 1 << 16) != payload:
                    return False
            return True

    assert all(await asyncio.gather(*(worker(i) for i in range(8))))
