"""Differential tests: element-wise, GLU, norm and shape ops on the REAL reference rpc-server vs rpcnet.

Every graph only uses (op, type, layout) combinations the reference CPU backend accepts: an
assertion there aborts the shared reference process.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rpcnet.compute.ops import Op, Unary
from rpcnet.compute.views import bf16_to_f32, f32_to_bf16
from support.opgraph import OpGraph, pack_params

F32, F16, I32, I64, BF16 = 0, 1, 26, 27, 30
TYPE_SIZE = {F32: 4, F16: 2, I32: 4, I64: 8, BF16: 2}

SETTINGS = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ------------------------------------------------------------------------------------------------
# helpers


def ne4(ne) -> tuple[int, int, int, int]:
    return tuple(ne) + (1,) * (4 - len(ne))


def encode(type_id: int, values: np.ndarray) -> bytes:
    if type_id == F32:
        return np.ascontiguousarray(values, np.float32).tobytes()
    if type_id == F16:
        return np.ascontiguousarray(values, np.float16).tobytes()
    if type_id == BF16:
        return f32_to_bf16(np.ascontiguousarray(values, np.float32)).tobytes()
    if type_id == I32:
        return np.ascontiguousarray(values, np.int32).tobytes()
    raise ValueError(type_id)


def decode(raw: bytes, type_id: int, ne) -> np.ndarray:
    n3, n2, n1, n0 = reversed(ne4(ne))
    if type_id == F32:
        out = np.frombuffer(raw, np.float32)
    elif type_id == F16:
        out = np.frombuffer(raw, np.float16).astype(np.float32)
    elif type_id == BF16:
        out = bf16_to_f32(np.frombuffer(raw, np.uint16))
    elif type_id == I32:
        out = np.frombuffer(raw, np.int32)
    elif type_id == I64:
        out = np.frombuffer(raw, np.int64)
    else:
        raise ValueError(type_id)
    return out.reshape(n3, n2, n1, n0)


def quantize_like(type_id: int, values: np.ndarray) -> np.ndarray:
    """The float32 values a tensor of `type_id` will actually hold."""
    if type_id == F16:
        return values.astype(np.float16).astype(np.float32)
    if type_id == BF16:
        return bf16_to_f32(f32_to_bf16(values))
    return values.astype(np.float32)


def add_input(g: OpGraph, type_id: int, values: np.ndarray, layout: str = "contig") -> int:
    """A tensor with logical values `values` (numpy order ne3, ne2, ne1, ne0) in some memory layout.

    contig: plain leaf; padded: rows padded (still ggml-contiguous over dims 1..3);
    permuted: dims 1 and 2 swapped in memory (rows contiguous, dims 1/2 not).
    """
    values = np.asarray(values).reshape((1,) * (4 - values.ndim) + values.shape)
    n3, n2, n1, n0 = values.shape
    ts = TYPE_SIZE[type_id]
    if layout == "contig":
        return g.input(type_id, (n0, n1, n2, n3), encode(type_id, values))
    if layout == "padded":
        pad = 3
        phys = np.zeros((n3, n2, n1, n0 + pad), values.dtype)
        phys[..., :n0] = values
        leaf = g.input(type_id, (n0 + pad, n1, n2, n3), encode(type_id, phys))
        row = (n0 + pad) * ts
        return g.view(leaf, (n0, n1, n2, n3), (ts, row, row * n1, row * n1 * n2))
    if layout == "permuted":
        phys = np.ascontiguousarray(values.transpose(0, 2, 1, 3))
        leaf = g.input(type_id, (n0, n2, n1, n3), encode(type_id, phys))
        row = n0 * ts
        return g.view(leaf, (n0, n1, n2, n3), (ts, row * n2, row, row * n1 * n2))
    raise ValueError(layout)


def run_both(g: OpGraph, outs: list[int], ref: int, ours: int) -> tuple[list[bytes], list[bytes]]:
    return g.run(ref, outs), g.run(ours, outs)


def close(ours: np.ndarray, ref: np.ndarray, rtol: float, atol: float, what: str) -> None:
    if rtol == 0 and atol == 0:
        ok = np.array_equal(ours, ref, equal_nan=ours.dtype.kind == "f")
        if not ok:
            bad = np.argwhere(~((ours == ref) | (np.isnan(ours) & np.isnan(ref))))[:5]
            pytest.fail(f"{what}: not bit-equal at {bad.tolist()}: ours {ours[tuple(bad.T)]} ref {ref[tuple(bad.T)]}")
        return
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def type_tol(type_id: int, rtol: float, atol: float) -> tuple[float, float]:
    """Widen a float32 tolerance to one or two ulps of the output type."""
    if type_id == F16:
        return max(rtol, 2e-3), max(atol, 1e-4)
    if type_id == BF16:
        return max(rtol, 1.6e-2), max(atol, 1e-3)
    return rtol, atol


shapes = st.tuples(
    st.integers(1, 37), st.integers(1, 5), st.integers(1, 3), st.integers(1, 2)
)
layouts = st.sampled_from(["contig", "padded", "permuted"])
seeds = st.integers(0, 2**31 - 1)


def normal(seed: int, ne, scale: float = 3.0) -> np.ndarray:
    n0, n1, n2, n3 = ne4(ne)
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n3, n2, n1, n0)) * scale).astype(np.float32)


# ------------------------------------------------------------------------------------------------
# UNARY and the plain math ops

EXACT = 0.0, 0.0
TRANSC = 1e-5, 1e-6
# (unary op, tolerance)
UNARY_CASES = {
    Unary.ABS: EXACT,
    Unary.SGN: EXACT,
    Unary.NEG: EXACT,
    Unary.STEP: EXACT,
    Unary.TANH: TRANSC,
    Unary.ELU: TRANSC,
    Unary.RELU: EXACT,
    Unary.SIGMOID: TRANSC,
    Unary.GELU: (2e-3, 1e-4),  # f16 table: one f16 ulp when the rounding boundary is hit
    Unary.GELU_QUICK: (2e-3, 1e-4),
    Unary.SILU: TRANSC,
    Unary.HARDSWISH: (1e-6, 1e-7),
    Unary.HARDSIGMOID: (1e-6, 1e-7),
    Unary.EXP: TRANSC,
    Unary.EXPM1: TRANSC,
    Unary.SOFTPLUS: TRANSC,
    Unary.GELU_ERF: (1e-5, 1e-6),
    Unary.XIELU: TRANSC,
    Unary.FLOOR: EXACT,
    Unary.CEIL: EXACT,
    Unary.ROUND: EXACT,
    Unary.TRUNC: EXACT,
}
# computed by ops.cpp kernels that only handle dst type == src type
SAME_TYPE_ONLY = {Unary.GELU, Unary.GELU_QUICK, Unary.GELU_ERF, Unary.SILU}
MATH_CASES = {Op.SQR: (1e-6, 0.0), Op.SQRT: TRANSC, Op.LOG: TRANSC, Op.SIN: TRANSC, Op.COS: TRANSC}
TYPE_PAIRS = [(F32, F32), (F16, F16), (BF16, BF16), (F16, F32), (BF16, F32)]
XIELU_PARAMS = (0.8, 0.7, 0.5, -1e-6)


def unary_params(u: Unary) -> bytes:
    if u == Unary.XIELU:
        return pack_params(int(u), *XIELU_PARAMS)
    return pack_params(int(u))


def special_values(values: np.ndarray) -> np.ndarray:
    """Sprinkle halfway points, integers, zeros and out-of-table GELU arguments into the data."""
    flat = values.reshape(-1).copy()
    extras = np.array([0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 2.0, -3.0, 10.0, -10.0, 12.5, -11.0, 25.0],
                      np.float32)
    k = min(len(flat), len(extras))
    flat[:k] = extras[:k]
    return flat.reshape(values.shape)


@SETTINGS
@given(shape=shapes, layout=layouts, pair=st.sampled_from(TYPE_PAIRS), seed=seeds)
def test_unary_all_ops(reference_v8, rpcnet_v8, shape, layout, pair, seed):
    src_t, dst_t = pair
    values = quantize_like(src_t, special_values(normal(seed, shape)))
    g = OpGraph()
    a = add_input(g, src_t, values, layout)
    outs = {}
    for u in UNARY_CASES:
        if src_t != dst_t and u in SAME_TYPE_ONLY:
            continue
        outs[u.name] = (g.op(Op.UNARY, dst_t, shape, (a,), params=unary_params(u)), UNARY_CASES[u])
    for op, tol in MATH_CASES.items():
        outs[op.name] = (g.op(op, dst_t, shape, (a,)), tol)
    ids = [o for o, _ in outs.values()]
    ref, ours = run_both(g, ids, reference_v8, rpcnet_v8)
    for (name, (_, tol)), r, o in zip(outs.items(), ref, ours):
        rtol, atol = type_tol(dst_t, *tol) if tol != EXACT else tol
        close(decode(o, dst_t, shape), decode(r, dst_t, shape), rtol, atol, f"{name} {pair} {layout}")


def test_gelu_f32_table_is_reproduced(reference_v8, rpcnet_v8):
    """Dense sweep across the GELU table range, including the +-10 cut-offs: f16-exact agreement."""
    x = np.linspace(-12.0, 12.0, 4096, dtype=np.float32).reshape(1, 1, 4, 1024)
    g = OpGraph()
    a = g.input(F32, (1024, 4), x)
    outs = [g.op(Op.UNARY, F32, (1024, 4), (a,), params=pack_params(int(u)))
            for u in (Unary.GELU, Unary.GELU_QUICK)]
    ref, ours = run_both(g, outs, reference_v8, rpcnet_v8)
    for r, o in zip(ref, ours):
        r, o = decode(r, F32, (1024, 4)), decode(o, F32, (1024, 4))
        # equal except where our tanh/exp lands on the other side of an f16 rounding boundary
        assert np.mean(r == o) > 0.995
        np.testing.assert_allclose(o, r, rtol=2e-3, atol=1e-6)


def test_unary_inplace(reference_v8, rpcnet_v8):
    """ggml_*_inplace: the output is a view of the input."""
    x = normal(7, (16, 3))
    g = OpGraph()
    a = g.input(F32, (16, 3), x)
    b = g.input(F32, (16, 3), x)
    out_a = g.op(Op.UNARY, F32, (16, 3), (a,), params=pack_params(int(Unary.SILU)), inplace_of=a)
    out_b = g.op(Op.SCALE, F32, (16, 3), (b,), params=pack_params(0.5, 0.25), inplace_of=b)
    ref, ours = run_both(g, [out_a, out_b], reference_v8, rpcnet_v8)
    for r, o in zip(ref, ours):
        close(decode(o, F32, (16, 3)), decode(r, F32, (16, 3)), 1e-6, 1e-7, "inplace")


@SETTINGS
@given(
    shape=shapes,
    layout=st.sampled_from(["contig", "padded"]),
    src_t=st.sampled_from([F32, F16]),
    seed=seeds,
    lo=st.floats(-4, 0, width=32),
    width=st.floats(0, 5, width=32),
    slope=st.sampled_from([0.0, 0.01, 0.2, -1.5]),
    fill=st.sampled_from([0.0, -1.25, 3.3e5, float("-inf")]),
)
def test_clamp_leaky_relu_fill(reference_v8, rpcnet_v8, shape, layout, src_t, seed, lo, width, slope,
                               fill):
    values = quantize_like(src_t, normal(seed, shape))
    values.reshape(-1)[0] = np.nan
    g = OpGraph()
    a = add_input(g, src_t, values, layout)
    c = g.input(src_t, shape, encode(src_t, values))  # FILL needs a contiguous source
    outs = [
        g.op(Op.CLAMP, src_t, shape, (a,), params=pack_params(float(lo), float(lo + width))),
        g.op(Op.LEAKY_RELU, src_t, shape, (a,), params=pack_params(float(slope))),
        g.op(Op.FILL, src_t, shape, (c,), params=pack_params(float(fill))),
    ]
    ref, ours = run_both(g, outs, reference_v8, rpcnet_v8)
    for name, r, o in zip(("clamp", "leaky_relu", "fill"), ref, ours):
        close(decode(o, src_t, shape), decode(r, src_t, shape), 0, 0, name)


@SETTINGS
@given(
    shape=shapes,
    src_t=st.sampled_from([F32, BF16]),
    seed=seeds,
    s=st.sampled_from([1.0, 0.125, -3.5, 1e-3]),
    b=st.sampled_from([0.0, 0.5, -2.0]),
)
def test_scale(reference_v8, rpcnet_v8, shape, src_t, seed, s, b):
    values = quantize_like(src_t, normal(seed, shape))
    g = OpGraph()
    a = g.input(src_t, shape, encode(src_t, values))
    out = g.op(Op.SCALE, src_t, shape, (a,), params=pack_params(float(s), float(b)))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    rtol, atol = type_tol(src_t, 1e-6, 1e-6)
    close(decode(o, src_t, shape), decode(r, src_t, shape), rtol, atol, "scale")
