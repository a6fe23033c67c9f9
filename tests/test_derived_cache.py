"""Dequantized weight copies are reused between runs and dropped on any write to their bytes."""

from __future__ import annotations

import numpy as np
from rpcnet.client import RpcClient
from rpcnet.compute.derived import DerivedCache
from rpcnet.compute.memory import MemoryPool
from rpcnet.compute.scratch import PLAN_BYTES_PER_TENSOR
from support import require
from support.ggml_oracle import q8_0_x86_dequantized
from support.mul_mat_wire import mul_mat_tensors
from support.opgraph import contiguous_nb

Q8_0, F16 = 8, 1


async def test_weight_cache_hits_and_invalidation(server):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 64), dtype=np.float32)
    # f16 activations: the native kernels (which keep no f32 copy) take f32 ones, so this runs
    # the NumPy fallback that caches the dequantized weights
    x = rng.standard_normal((12, 64), dtype=np.float32).astype(np.float16)
    gguf = require.module("gguf")  # the oracle's q8_0 codec
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    wq = gguf.quants.quantize(w, q8_0).tobytes()
    async with await RpcClient.connect("127.0.0.1", server.port) as c:
        wh, _ = await c.alloc_buffer(4096)
        wb = await c.buffer_base(wh)
        ah, _ = await c.alloc_buffer(4096)
        ab = await c.buffer_base(ah)
        tw, tx, to = mul_mat_tensors(Q8_0, F16, 64, 4, 12, (wh, wb), (ah, ab), (ah, ab + 3072))
        await c.set_tensor(tw, 0, wq)
        await c.set_tensor(tx, 0, x.tobytes())
        await c.graph_compute([3], [tw, tx, to], uid=1)
        first = np.frombuffer(await c.get_tensor(to, 0, 192), np.float32).reshape(12, 4)
        deq = gguf.quants.dequantize(np.frombuffer(wq, np.uint8).reshape(4, -1), q8_0)
        # ggml's x86 path rounds activations to q8_0 against q8_0 weights
        xq = q8_0_x86_dequantized(x.astype(np.float32))
        np.testing.assert_allclose(first, xq @ deq.T, rtol=1e-5)
        held = server.call(lambda: server.server.devices[0].derived.held)
        assert held == 4 * 64 * 4  # the f32 copy is kept, and counted
        free, total = await c.device_memory()
        # The cached plan (3 tensors) and its compute scratch are counted too.
        scratch = server.call(lambda: server.server.devices[0].scratch.reserved)
        assert 0 < scratch < 1 << 20
        assert total - free == 8192 + held + scratch + 3 * PLAN_BYTES_PER_TENSOR

        # Rewrite the weights: the next run must see the new bytes, not the cached copy.
        w2 = -w
        await c.set_tensor(tw, 0, gguf.quants.quantize(w2, q8_0).tobytes())
        await c.graph_recompute(uid=1)
        second = np.frombuffer(await c.get_tensor(to, 0, 192), np.float32).reshape(12, 4)
        np.testing.assert_allclose(second, -first, rtol=1e-5)

        await c.free_buffer(wh)
        await c.device_count()
        assert server.call(lambda: server.server.devices[0].derived.held) == 0


def test_cache_is_bounded_and_respects_the_pool():
    class Buf:
        generation = 0
        derived_keys: set = set()

    class T:
        def __init__(self, off):
            self.buffer, self.offset, self.type, self.ne, self.nb = (
                Buf,
                off,
                8,
                (32, 1, 1, 1),
                contiguous_nb(8, (32, 1, 1, 1)),
            )

    pool = MemoryPool(1000)
    cache = DerivedCache(pool, limit=300)
    for off in range(5):
        cache.get(T(off), "f32", lambda: np.zeros(25, np.float32))  # 100 bytes each
    assert cache.held == 300 and pool.held == 300
    cache.clear()
    assert pool.held == 0
