"""Differential single-op graphs: the reference rpc-server and rpcnet on the same inputs."""

from __future__ import annotations

import numpy as np
from support.opgraph import OpGraph, as_f32

ADD, MUL, MUL_MAT = 2, 7, 29


def run_both(graph: OpGraph, outputs, ref: int, ours: int) -> tuple[list[bytes], list[bytes]]:
    return graph.run(ref, outputs), graph.run(ours, outputs)


def test_add_broadcast_and_permuted_matmul(reference_v8, rpcnet_v8):
    rng = np.random.default_rng(0)
    g = OpGraph()
    a = g.input(0, (8, 6, 4, 1), rng.standard_normal(192, dtype=np.float32))
    b = g.input(0, (8, 3, 1, 1), rng.standard_normal(24, dtype=np.float32))
    add = g.op(ADD, 0, (8, 6, 4, 1), (a, b))
    w = g.input(1, (8, 5, 2, 1), rng.standard_normal(80).astype(np.float16))
    # transpose-like view of `add`: swap dims 1 and 2 (a permuted activation)
    perm = g.view(add, (8, 4, 6, 1), (4, 8 * 6 * 4, 8 * 4, 8 * 6 * 4 * 4))
    mm = g.op(MUL_MAT, 0, (5, 4, 6, 1), (w, perm))
    (ref_add, ref_mm), (our_add, our_mm) = run_both(g, [add, mm], reference_v8, rpcnet_v8)
    assert np.array_equal(as_f32(ref_add, (8, 6, 4, 1)), as_f32(our_add, (8, 6, 4, 1)))
    np.testing.assert_allclose(
        as_f32(our_mm, (5, 4, 6)), as_f32(ref_mm, (5, 4, 6)), rtol=2e-3, atol=2e-3
    )
