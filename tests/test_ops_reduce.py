"""Differential tests: reductions and orderings on the REAL reference rpc-server vs rpcnet.

SUM, SUM_ROWS, MEAN, CUMSUM, ARGMAX, ARGSORT, TOP_K, COUNT_EQUAL. Only (op, type, layout)
combinations the reference CPU backend accepts are sent: an assertion there aborts the shared
reference process.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rpcnet.compute.ops import Op
from rpcnet.compute.views import bf16_to_f32, f32_to_bf16
from support.hyp import examples
from support.opgraph import OpGraph, encode, ne4, pack_params

F32, F16, I32, I64, BF16 = 0, 1, 26, 27, 30
TYPE_SIZE = {F32: 4, F16: 2, I32: 4, I64: 8, BF16: 2}

SETTINGS = settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

shapes = st.tuples(st.integers(1, 40), st.integers(1, 5), st.integers(1, 3), st.integers(1, 2))
seeds = st.integers(0, 2**31 - 1)


def decode(raw: bytes, type_id: int, ne) -> np.ndarray:
    n0, n1, n2, n3 = ne4(ne)
    dtype = {F32: np.float32, F16: np.float16, I32: np.int32, I64: np.int64, BF16: np.uint16}
    out = np.frombuffer(raw, dtype[type_id])
    if type_id == BF16:
        out = bf16_to_f32(out)
    return out.reshape(n3, n2, n1, n0)


def add_input(g: OpGraph, type_id: int, values: np.ndarray, layout: str = "contig") -> int:
    """`values` (numpy order ne3..ne0) as a contiguous leaf, a row-padded view, or a view with
    dims 1 and 2 swapped in memory."""
    n3, n2, n1, n0 = values.shape
    ts = TYPE_SIZE[type_id]
    if layout == "contig":
        return g.input(type_id, (n0, n1, n2, n3), encode(type_id, values))
    if layout == "padded":
        phys = np.zeros((n3, n2, n1, n0 + 2), values.dtype)
        phys[..., :n0] = values
        leaf = g.input(type_id, (n0 + 2, n1, n2, n3), encode(type_id, phys))
        row = (n0 + 2) * ts
        return g.view(leaf, (n0, n1, n2, n3), (ts, row, row * n1, row * n1 * n2))
    if layout == "permuted":
        phys = np.ascontiguousarray(values.transpose(0, 2, 1, 3))
        leaf = g.input(type_id, (n0, n2, n1, n3), encode(type_id, phys))
        row = n0 * ts
        return g.view(leaf, (n0, n1, n2, n3), (ts, row * n2, row, row * n1 * n2))
    raise ValueError(layout)


def normal(seed: int, ne, type_id: int = F32) -> np.ndarray:
    n0, n1, n2, n3 = ne4(ne)
    x = (np.random.default_rng(seed).standard_normal((n3, n2, n1, n0)) * 3).astype(np.float32)
    if type_id == F16:
        return x.astype(np.float16).astype(np.float32)
    if type_id == BF16:
        return bf16_to_f32(f32_to_bf16(x))
    return x


def run_both(g: OpGraph, outs: list[int], ref: int, ours: int) -> tuple[list[bytes], list[bytes]]:
    return g.run(ref, outs), g.run(ours, outs)


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
