"""Scratch bounds and the per-device scratch budget (compute/scratch.py)."""

from __future__ import annotations

import gc

import pytest
from rpcnet.compute.device import MemoryPool
from rpcnet.compute.kernels.kernel_table import scratch_bytes
from rpcnet.compute.ops import Op
from rpcnet.compute.scratch import (
    ScratchBudget,
    ScratchExceeded,
    default_max_scratch,
    overlaps_itself,
)
from rpcnet.compute.tensor import Tensor

F32, Q8_0 = 0, 8


def tensor(ne, nb, type_id=F32, op=0, src=()) -> Tensor:
    return Tensor(0, type_id, ne, nb, op, bytes(64), 16, "t", None, 0, src=src)


def test_overlap_detection():
    assert not overlaps_itself(tensor((4, 3, 1, 1), (4, 16, 48, 48)))  # contiguous
    assert not overlaps_itself(tensor((4, 3, 1, 1), (12, 4, 48, 48)))  # transposed
    assert not overlaps_itself(tensor((4, 3, 1, 1), (4, 32, 96, 96)))  # padded rows
    assert overlaps_itself(tensor((4, 3, 1, 1), (4, 0, 0, 0)))  # zero stride
    assert overlaps_itself(tensor((4, 3, 1, 1), (4, 8, 24, 24)))  # rows laid over each other
    assert not overlaps_itself(tensor((4, 1, 1, 1), (4, 0, 0, 0)))  # size-1 dims do not count
    assert not overlaps_itself(tensor((64, 2, 1, 1), (34, 68, 136, 136), Q8_0))  # 2 blocks/row


def test_mul_mat_bound_follows_data_not_the_broadcast_of_weights():
    shared, weights_buf = object(), object()
    a = tensor((1024, 1024, 1, 1), (4, 4096, 4 << 20, 4 << 20))
    b = tensor((1024, 1, 2048, 1), (4, 4096, 0, 0))
    for t in (a, b):
        t.buffer = shared
    out = tensor((1024, 1, 2048, 1), (4, 4096, 4096, 8 << 20), op=Op.MUL_MAT, src=(a, b))
    out.buffer = shared
    # One buffer for all: NumPy may copy the aliased f32 weights once (4 MiB); the activations
    # are stacked (8 MiB logical, twice at most) and the output computed aside once (8 MiB).
    # Never the 8 GiB of repeated weights.
    assert scratch_bytes(out) == (4 << 20) + 2 * (8 << 20) + (8 << 20)
    overlapping = tensor((1024, 1, 2048, 1), (4, 4096, 0, 0), op=Op.MUL_MAT, src=(a, b))
    overlapping.buffer = shared
    assert scratch_bytes(overlapping) == scratch_bytes(out) + (8 << 20)
    # f32 weights in their own buffer are read in place.
    a.buffer = weights_buf
    assert scratch_bytes(out) == 2 * (8 << 20) + (8 << 20)


def test_mul_mat_bound_of_large_quantized_weights_is_one_chunk():
    k, m = 4096, 128 * 1024  # 2 GiB as float32
    a = tensor((k, m, 1, 1), (34, 34 * k // 32, 34 * k // 32 * m, 34 * k // 32 * m), Q8_0)
    b = tensor((k, 8, 1, 1), (4, 4 * k, 32 * k, 32 * k))
    out = tensor((m, 8, 1, 1), (4, 4 * m, 32 * m, 32 * m), op=Op.MUL_MAT, src=(a, b))
    a.buffer, b.buffer, out.buffer = object(), object(), object()
    chunk = (256 << 20) * 5 // 4
    # one chunk of converted rows, the activations (rounded), the output
    assert scratch_bytes(out) == chunk + 2 * (8 * k * 4) + 8 * m * 4


def test_budget_reserves_the_largest_live_need_and_releases_on_drop():
    class Plan:
        pass

    pool = MemoryPool(1000)
    budget = ScratchBudget(pool, limit=500)
    with pytest.raises(ScratchExceeded, match="--max-scratch"):
        budget.admit(501, 0, "x")
    p1, p2 = Plan(), Plan()
    budget.admit(300, 10, "a").bind(p1)
    assert pool.held == 310
    budget.admit(200, 10, "b").bind(p2)
    assert pool.held == 320  # scratch is shared: plans run one at a time
    del p1
    gc.collect()
    assert pool.held == 210  # the largest remaining need (200) and one footprint
    del p2
    gc.collect()
    assert pool.held == 0 and budget.reserved == 0


def test_budget_refuses_when_the_device_is_full():
    pool = MemoryPool(1000)
    assert pool.reserve(900)
    budget = ScratchBudget(pool, limit=500)
    with pytest.raises(ScratchExceeded, match="--mem"):
        budget.admit(200, 0, "x")
    assert pool.held == 900


def test_default_budget():
    assert default_max_scratch(4 << 30) == (4 << 30) // 10
    assert default_max_scratch(64 << 30) == 1 << 30


async def test_large_quantized_weights_are_converted_in_row_chunks(server, monkeypatch):
    """The chunked MUL_MAT path (weights over WEIGHT_CHUNK) against gguf's dequantizer."""
    import gguf
    import gguf.quants as gq
    import numpy as np
    from rpcnet.client import RpcClient
    from rpcnet.compute.kernels import matmul
    from rpcnet.compute.kernels.operands import vec_dot_operand
    from support.mul_mat_wire import mul_mat_tensors

    monkeypatch.setattr(matmul, "WEIGHT_CHUNK", 7 * 64 * 4)  # 7 rows of 64 at a time
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 64), dtype=np.float32)
    x = rng.standard_normal((12, 64), dtype=np.float32)  # N > 8: not the native decode path
    wq = gq.quantize(w, gguf.GGMLQuantizationType.Q8_0)
    deq = gq.dequantize(wq, gguf.GGMLQuantizationType.Q8_0).reshape(40, 64)
    async with await RpcClient.connect("127.0.0.1", server.port) as c:
        h, _ = await c.alloc_buffer(16384)
        base = await c.buffer_base(h)
        at = [(h, base + offset) for offset in (0, 4096, 8192)]
        tw, tx, to = mul_mat_tensors(Q8_0, F32, 64, 40, 12, *at)
        await c.set_tensor(tw, 0, wq.tobytes())
        await c.set_tensor(tx, 0, x.tobytes())
        await c.graph_compute([3], [tw, tx, to])
        got = np.frombuffer(await c.get_tensor(to, 0, 40 * 12 * 4), np.float32).reshape(12, 40)
    want = vec_dot_operand(x, Q8_0).astype(np.float64) @ deq.T.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert server.call(lambda: server.server.devices[0].derived.held) == 0  # never cached


@pytest.mark.parametrize("w_type", [F32, 1, Q8_0])  # f32, f16, q8_0
@pytest.mark.parametrize("zero_stride", [False, True])
def test_mul_mat_weight_broadcast_matches_the_reference(
    reference_v8, rpcnet_v8, w_type, zero_stride
):
    """Weights (ne2 = 2, ne3 = 1) broadcast over a 6 x 3 batch (r2 = 3, r3 = 3), the activations
    real or one row repeated by zero strides: the same bytes to the REAL rpc-server and rpcnet."""
    import numpy as np
    from rpcnet.compute import quant
    from support.opgraph import OpGraph, as_f32

    rng = np.random.default_rng(4)
    k, m, n = 64, 24, 5
    w = rng.standard_normal((1, 2, m, k), dtype=np.float32)
    raw = {F32: w.tobytes(), 1: w.astype(np.float16).tobytes()}.get(w_type)
    if raw is None:
        raw = quant.quantize(w_type, w.reshape(-1, k)).tobytes()
    g = OpGraph()
    a = g.input(w_type, (k, m, 2, 1), raw)
    if zero_stride:
        row = g.input(F32, (k,), rng.standard_normal(k, dtype=np.float32))
        b = g.view(row, (k, n, 6, 3), (4, 0, 0, 0))
    else:
        b = g.input(F32, (k, n, 6, 3), rng.standard_normal((3, 6, n, k), dtype=np.float32))
    out = g.op(Op.MUL_MAT, F32, (m, n, 6, 3), (a, b))
    (ref,) = g.run(reference_v8, [out])
    (ours,) = g.run(rpcnet_v8, [out])
    want = as_f32(ref, (m, n, 6, 3))
    np.testing.assert_allclose(as_f32(ours, (m, n, 6, 3)), want, rtol=1e-5, atol=1e-5)
