"""Differential tests: reductions and orderings on the REAL reference rpc-server vs rpcnet.

SUM, SUM_ROWS, MEAN, CUMSUM, ARGMAX, ARGSORT, TOP_K, COUNT_EQUAL. Only (op, type, layout)
combinations the reference CPU backend accepts are sent: an assertion there aborts the shared
reference process.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from rpcnet.compute.ops import Op
from support import op_diff
from support.op_diff import (
    BF16,
    F16,
    F32,
    I32,
    I64,
    SETTINGS,
    add_input,
    decode,
    quantize_like,
    run_both,
    seeds,
)
from support.opgraph import OpGraph, pack_params

shapes = st.tuples(st.integers(1, 40), st.integers(1, 5), st.integers(1, 3), st.integers(1, 2))


def normal(seed: int, ne, type_id: int = F32) -> np.ndarray:
    return quantize_like(type_id, op_diff.normal(seed, ne))


# ------------------------------------------------------------------------------------------------


@SETTINGS
@given(
    shape=shapes,
    type_id=st.sampled_from([F32, F16, BF16]),
    layout=st.sampled_from(["contig", "padded", "permuted"]),
    seed=seeds,
)
def test_sum(reference_v8, rpcnet_v8, shape, type_id, layout, seed):
    g = OpGraph()
    a = add_input(g, type_id, normal(seed, shape, type_id), layout)
    out = g.op(Op.SUM, type_id, (1,), (a,))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    # f32: one rounding of a float64 sum; f16/bf16: the same float32 running sums as ggml
    assert r == o


@SETTINGS
@given(shape=shapes, layout=st.sampled_from(["contig", "padded", "permuted"]), seed=seeds)
def test_sum_rows_mean_cumsum(reference_v8, rpcnet_v8, shape, layout, seed):
    rows = (1, *shape[1:])
    g = OpGraph()
    a = add_input(g, F32, normal(seed, shape), layout)
    outs = [
        g.op(Op.SUM_ROWS, F32, rows, (a,)),
        g.op(Op.MEAN, F32, rows, (a,)),
        g.op(Op.CUMSUM, F32, shape, (a,)),
    ]
    ref, ours = run_both(g, outs, reference_v8, rpcnet_v8)
    for name, r, o in zip(("sum_rows", "mean", "cumsum"), ref, ours, strict=True):
        assert r == o, name


@SETTINGS
@given(
    ne=st.tuples(st.integers(1, 40), st.integers(1, 6)),
    ties=st.booleans(),
    layout=st.sampled_from(["contig", "padded"]),
    seed=seeds,
)
def test_argmax(reference_v8, rpcnet_v8, ne, ties, layout, seed):
    rng = np.random.default_rng(seed)
    shape = (1, 1, ne[1], ne[0])
    x = rng.integers(-2, 3, shape).astype(np.float32) if ties else normal(seed, ne)
    g = OpGraph()
    a = add_input(g, F32, x, layout)
    out = g.op(Op.ARGMAX, I32, (ne[1],), (a,))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    assert np.array_equal(decode(o, I32, (ne[1],)), decode(r, I32, (ne[1],)))


@SETTINGS
@given(
    shape=shapes,
    order=st.sampled_from([0, 1]),
    layout=st.sampled_from(["contig", "padded"]),
    seed=seeds,
)
def test_argsort(reference_v8, rpcnet_v8, shape, order, layout, seed):
    g = OpGraph()
    a = add_input(g, F32, normal(seed, shape), layout)  # distinct values: no ties
    out = g.op(Op.ARGSORT, I32, shape, (a,), params=pack_params(order))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    assert np.array_equal(decode(o, I32, shape), decode(r, I32, shape))


@SETTINGS
@given(
    shape=st.tuples(st.integers(1, 16), st.integers(1, 4), st.integers(1, 2), st.integers(1, 2)),
    order=st.sampled_from([0, 1]),
    seed=seeds,
)
def test_argsort_ties_short_rows(reference_v8, rpcnet_v8, shape, order, seed):
    """Rows of at most 16: std::sort is an insertion sort there, so ties keep index order."""
    n0, n1, n2, n3 = shape
    x = np.random.default_rng(seed).integers(-2, 3, (n3, n2, n1, n0)).astype(np.float32)
    g = OpGraph()
    a = add_input(g, F32, x)
    out = g.op(Op.ARGSORT, I32, shape, (a,), params=pack_params(order))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    assert np.array_equal(decode(o, I32, shape), decode(r, I32, shape))


@SETTINGS
@given(
    shape=shapes,
    k_frac=st.floats(0.0, 1.0),
    layout=st.sampled_from(["contig", "padded"]),
    seed=seeds,
)
def test_top_k(reference_v8, rpcnet_v8, shape, k_frac, layout, seed):
    k = max(1, round(shape[0] * k_frac))
    out_ne = (k, *shape[1:])
    x = normal(seed, shape)
    g = OpGraph()
    a = add_input(g, F32, x, layout)
    out = g.op(Op.TOP_K, I32, out_ne, (a,))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    ref_idx, our_idx = decode(r, I32, out_ne), decode(o, I32, out_ne)
    # the order of the k indices is unspecified (the reference swaps the first two on purpose)
    assert np.array_equal(np.sort(our_idx, axis=-1), np.sort(ref_idx, axis=-1))
    # ours come largest first
    picked = np.take_along_axis(x, our_idx.astype(np.int64), axis=-1)
    assert np.all(np.diff(picked, axis=-1) <= 0)


@SETTINGS
@given(ne=st.tuples(st.integers(1, 50), st.integers(1, 6)), p=st.floats(0.0, 1.0), seed=seeds)
def test_count_equal(reference_v8, rpcnet_v8, ne, p, seed):
    rng = np.random.default_rng(seed)
    shape = (1, 1, ne[1], ne[0])
    a_vals = rng.integers(0, 100, shape, dtype=np.int32)
    b_vals = np.where(rng.random(shape) < p, a_vals, rng.integers(0, 100, shape, dtype=np.int32))
    g = OpGraph()
    a = g.input(I32, ne, a_vals)
    b = g.input(I32, ne, b_vals.astype(np.int32))
    out = g.op(Op.COUNT_EQUAL, I64, (1,), (a, b))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    assert r == o
    assert np.frombuffer(o, np.int64)[0] == np.count_nonzero(a_vals == b_vals)
