"""Differential tests: element-wise, GLU, norm and shape ops, REAL reference rpc-server vs rpcnet.

Every graph only uses (op, type, layout) combinations the reference CPU backend accepts: an
assertion there aborts the shared reference process.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rpcnet.compute.ops import Glu, Op, Unary
from support.op_diff import (
    BF16,
    F16,
    F32,
    I32,
    SETTINGS,
    add_input,
    assert_same_bytes,
    decode,
    given_ints,
    normal,
    quantize_like,
    run_both,
    seeds,
)
from support.opgraph import OpGraph, encode, ne4, pack_params

# ------------------------------------------------------------------------------------------------
# helpers


def close(ours: np.ndarray, ref: np.ndarray, rtol: float, atol: float, what: str) -> None:
    if rtol == 0 and atol == 0:
        ok = np.array_equal(ours, ref, equal_nan=ours.dtype.kind == "f")
        if not ok:
            bad = np.argwhere(~((ours == ref) | (np.isnan(ours) & np.isnan(ref))))[:5]
            where = tuple(bad.T)
            pytest.fail(f"{what}: differs at {bad.tolist()}: ours {ours[where]} ref {ref[where]}")
        return
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def type_tol(type_id: int, rtol: float, atol: float) -> tuple[float, float]:
    """Widen a float32 tolerance to one or two ulps of the output type."""
    if type_id == F16:
        return max(rtol, 2e-3), max(atol, 1e-4)
    if type_id == BF16:
        return max(rtol, 1.6e-2), max(atol, 1e-3)
    return rtol, atol


shapes = st.tuples(st.integers(1, 37), st.integers(1, 5), st.integers(1, 3), st.integers(1, 2))
layouts = st.sampled_from(["contig", "padded", "permuted"])


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
    extras = np.array(
        [
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -2.5,
            2.0,
            -3.0,
            10.0,
            -10.0,
            12.5,
            -11.0,
            25.0,
            np.inf,
            -np.inf,
            np.nan,
        ],
        np.float32,
    )
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
        if u == Unary.XIELU and layout == "permuted":
            continue  # its kernel asserts ggml_is_contiguous_1
        outs[u.name] = (g.op(Op.UNARY, dst_t, shape, (a,), params=unary_params(u)), UNARY_CASES[u])
    for op, tol in MATH_CASES.items():
        outs[op.name] = (g.op(op, dst_t, shape, (a,)), tol)
    ids = [o for o, _ in outs.values()]
    ref, ours = run_both(g, ids, reference_v8, rpcnet_v8)
    for (name, (_, tol)), r, o in zip(outs.items(), ref, ours, strict=True):
        rtol, atol = type_tol(dst_t, *tol) if tol != EXACT else tol
        close(
            decode(o, dst_t, shape), decode(r, dst_t, shape), rtol, atol, f"{name} {pair} {layout}"
        )


def test_gelu_f32_table_is_reproduced(reference_v8, rpcnet_v8):
    """Dense sweep across the GELU table range, including the +-10 cut-offs: f16-exact agreement."""
    x = np.linspace(-12.0, 12.0, 4096, dtype=np.float32).reshape(1, 1, 4, 1024)
    g = OpGraph()
    a = g.input(F32, (1024, 4), x)
    outs = [
        g.op(Op.UNARY, F32, (1024, 4), (a,), params=pack_params(int(u)))
        for u in (Unary.GELU, Unary.GELU_QUICK)
    ]
    ref, ours = run_both(g, outs, reference_v8, rpcnet_v8)
    for r, o in zip(ref, ours, strict=True):
        r, o = decode(r, F32, (1024, 4)), decode(o, F32, (1024, 4))
        # equal except where our tanh/exp lands on the other side of an f16 rounding boundary
        assert np.mean(r == o) > 0.999
        np.testing.assert_allclose(o, r, rtol=2e-3, atol=1e-6)


def test_unary_inplace(reference_v8, rpcnet_v8):
    """ggml_*_inplace: the output is a view of the input."""
    x = normal(7, (16, 3))
    g = OpGraph()
    a = g.input(F32, (16, 3), x)
    b = g.input(F32, (16, 3), x)
    out_a = g.op(Op.UNARY, F32, (16, 3), (a,), params=pack_params(int(Unary.SILU)), inplace_of=a)
    c = g.input(F32, (16, 3), x)
    d = g.input(F32, (16, 3), x)
    out_b = g.op(Op.SCALE, F32, (16, 3), (b,), params=pack_params(0.5, 0.25), inplace_of=b)
    out_c = g.op(Op.RMS_NORM, F32, (16, 3), (c,), params=pack_params(1e-6), inplace_of=c)
    out_d = g.op(Op.DIAG_MASK_INF, F32, (16, 3), (d,), params=pack_params(2), inplace_of=d)
    outs = [out_a, out_b, out_c, out_d]
    ref, ours = run_both(g, outs, reference_v8, rpcnet_v8)
    for name, r, o in zip(("silu", "scale", "rms_norm", "diag_mask_inf"), ref, ours, strict=True):
        close(decode(o, F32, (16, 3)), decode(r, F32, (16, 3)), 1e-6, 1e-7, f"{name} in place")


def test_strided_destinations(reference_v8, rpcnet_v8):
    """Outputs whose rows are padded (ggml-contiguous over dims 1..3, nb1 > ne0 * nb0)."""
    ne = (10, 3, 2)
    x = normal(11, ne)
    y = normal(12, ne)
    g = OpGraph()
    a = g.input(F32, ne, x)
    b = g.input(F32, ne, y)
    nb = (4, 64, 64 * 3, 64 * 3 * 2)
    cases = {
        "silu": (Op.UNARY, (a,), pack_params(int(Unary.SILU))),
        "gelu": (Op.UNARY, (a,), pack_params(int(Unary.GELU))),
        "exp": (Op.UNARY, (a,), pack_params(int(Unary.EXP))),
        "rms_norm": (Op.RMS_NORM, (a,), pack_params(1e-6)),
        "norm": (Op.NORM, (a,), pack_params(1e-6)),
        "swiglu": (Op.GLU, (a, b), pack_params(int(Glu.SWIGLU), 0)),
        "clamp": (Op.CLAMP, (a,), pack_params(-1.0, 1.0)),
        "cumsum": (Op.CUMSUM, (a,), b""),
    }
    outs = [g.op(op, F32, ne, srcs, params=p, nb=nb) for op, srcs, p in cases.values()]
    ref, ours = run_both(g, outs, reference_v8, rpcnet_v8)
    for name, r, o in zip(cases, ref, ours, strict=True):
        # read back through the padded layout
        rv = np.frombuffer(r, np.uint8)
        ov = np.frombuffer(o, np.uint8)
        rows = [slice(i * 64, i * 64 + 40) for i in range(6)]
        r_rows = np.concatenate([rv[s] for s in rows]).view(np.float32)
        o_rows = np.concatenate([ov[s] for s in rows]).view(np.float32)
        close(o_rows, r_rows, 1e-5, 1e-6, f"{name} into padded rows")


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
def test_clamp_leaky_relu_fill(
    reference_v8, rpcnet_v8, shape, layout, src_t, seed, lo, width, slope, fill
):
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
    for name, r, o in zip(("clamp", "leaky_relu", "fill"), ref, ours, strict=True):
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
    # b != 0 is an FMA in the reference, reproduced exactly
    close(decode(o, src_t, shape), decode(r, src_t, shape), 0, 0, "scale")


# ------------------------------------------------------------------------------------------------
# GLU

GLU_TYPES = {
    Glu.REGLU: (F32, F16, BF16),
    Glu.GEGLU: (F32, F16, BF16),
    Glu.SWIGLU: (F32, F16, BF16),
    Glu.SWIGLU_OAI: (F32,),
    Glu.GEGLU_ERF: (F32, F16, BF16),
    Glu.GEGLU_QUICK: (F32, F16, BF16),
    Glu.SWIGLU_CLAMP: (F32, F16),
}


def glu_params(op: Glu, swapped: int) -> bytes:
    if op == Glu.SWIGLU_OAI:
        return pack_params(int(op), swapped, 1.702, 7.0)
    if op == Glu.SWIGLU_CLAMP:
        return pack_params(int(op), swapped, 0, 7.0)
    return pack_params(int(op), swapped)


@SETTINGS
@given(
    shape=shapes,
    layout=st.sampled_from(["contig", "padded"]),
    type_id=st.sampled_from([F32, F16, BF16]),
    mode=st.sampled_from(["split", "swapped", "fused", "fused_swapped"]),
    seed=seeds,
)
def test_glu_all_ops(reference_v8, rpcnet_v8, shape, layout, type_id, mode, seed):
    n0, n1, n2, n3 = shape
    fused = mode.startswith("fused")
    swapped = int(mode.endswith("swapped"))
    in_ne = (n0, n1, n2, n3) if fused else (2 * n0 + (seed % 2), n1, n2, n3)  # odd widths too
    x = quantize_like(type_id, special_values(normal(seed, in_ne, 4.0)))
    g = OpGraph()
    a = add_input(g, type_id, x, layout)
    srcs = (a,)
    if fused:
        y = quantize_like(type_id, normal(seed + 1, in_ne, 4.0))
        srcs = (a, add_input(g, type_id, y, layout))
    ops = [op for op, types in GLU_TYPES.items() if type_id in types]
    outs = [g.op(Op.GLU, type_id, shape, srcs, params=glu_params(op, swapped)) for op in ops]
    ref, ours = run_both(g, outs, reference_v8, rpcnet_v8)
    for op, r, o in zip(ops, ref, ours, strict=True):
        if op in (Glu.GEGLU, Glu.GEGLU_QUICK):
            rtol, atol = 2e-3, 1e-4  # f16 GELU table
        else:
            rtol, atol = 1e-5, 1e-5
        rtol, atol = type_tol(type_id, rtol, atol)
        close(decode(o, type_id, shape), decode(r, type_id, shape), rtol, atol, f"{op.name} {mode}")


# ------------------------------------------------------------------------------------------------
# norms


@SETTINGS
@given(
    shape=shapes,
    layout=st.sampled_from(["contig", "padded", "permuted", "transposed"]),
    eps=st.sampled_from([0.0, 1e-6, 1e-5, 0.5]),
    offset=st.sampled_from([0.0, 5.0]),
    seed=seeds,
)
def test_norms(reference_v8, rpcnet_v8, shape, layout, eps, offset, seed):
    x = normal(seed, shape) + np.float32(offset)
    g = OpGraph()
    a = add_input(g, F32, x, layout)
    ops = [Op.NORM, Op.L2_NORM] + ([Op.RMS_NORM] if layout != "transposed" else [])
    outs = [g.op(op, F32, shape, (a,), params=pack_params(float(eps))) for op in ops]
    ref, ours = run_both(g, outs, reference_v8, rpcnet_v8)
    for op, r, o in zip(ops, ref, ours, strict=True):
        close(decode(o, F32, shape), decode(r, F32, shape), 1e-5, 2e-6, f"{op.name} {layout}")


@SETTINGS
@given(
    ne=st.tuples(st.integers(1, 9), st.integers(1, 4), st.integers(1, 7), st.integers(1, 2)),
    groups=st.integers(1, 8),
    eps=st.sampled_from([1e-6, 1e-3]),
    seed=seeds,
    layout=st.sampled_from(["contig", "permuted"]),
)
def test_group_norm(reference_v8, rpcnet_v8, ne, groups, eps, seed, layout):
    x = normal(seed, ne) + np.float32(1.5)
    g = OpGraph()
    a = add_input(g, F32, x, layout)
    out = g.op(Op.GROUP_NORM, F32, ne, (a,), params=pack_params(groups, float(eps)))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    close(decode(o, F32, ne), decode(r, F32, ne), 1e-5, 2e-6, f"group_norm {groups}")


# ------------------------------------------------------------------------------------------------
# shape / structural ops


def raw_values(type_id: int, seed: int, ne) -> np.ndarray:
    if type_id == I32:
        n0, n1, n2, n3 = ne4(ne)
        return np.random.default_rng(seed).integers(-1000, 1000, (n3, n2, n1, n0), dtype=np.int32)
    return quantize_like(type_id, normal(seed, ne))


@SETTINGS
@given(
    shape=shapes,
    extra=st.integers(1, 4),
    dim=st.integers(0, 3),
    type_id=st.sampled_from([F32, F16, BF16, I32]),
    layout=st.sampled_from(["contig", "padded", "permuted"]),
    seed=seeds,
)
def test_concat(reference_v8, rpcnet_v8, shape, extra, dim, type_id, layout, seed):
    ne_b = list(shape)
    ne_b[dim] = extra
    ne_out = list(shape)
    ne_out[dim] += extra
    a_vals, b_vals = raw_values(type_id, seed, shape), raw_values(type_id, seed + 1, ne_b)
    g = OpGraph()
    a = add_input(g, type_id, a_vals, layout)
    b = add_input(g, type_id, b_vals, "contig")
    out = g.op(Op.CONCAT, type_id, ne_out, (a, b), params=pack_params(dim))
    assert_same_bytes(g, out, reference_v8, rpcnet_v8)


def test_concat_quantized(reference_v8, rpcnet_v8):
    """Whole q8_0 blocks (raw bytes) along dims 0 and 1."""
    rng = np.random.default_rng(5)
    q8 = 8  # GGML_TYPE_Q8_0: 34 bytes per 32 values
    g = OpGraph()
    a = g.input(q8, (64, 3), rng.integers(0, 255, 6 * 34, dtype=np.uint8).tobytes())
    b = g.input(q8, (32, 3), rng.integers(0, 255, 3 * 34, dtype=np.uint8).tobytes())
    c = g.input(q8, (64, 2), rng.integers(0, 255, 4 * 34, dtype=np.uint8).tobytes())
    # keep scales finite: the bytes are copied, never decoded
    out0 = g.op(Op.CONCAT, q8, (96, 3), (a, b), params=pack_params(0))
    out1 = g.op(Op.CONCAT, q8, (64, 5), (a, c), params=pack_params(1))
    ref, ours = run_both(g, [out0, out1], reference_v8, rpcnet_v8)
    assert ref == ours


@SETTINGS
@given(
    shape=st.tuples(st.integers(1, 9), st.integers(1, 3), st.integers(1, 3), st.integers(1, 2)),
    reps=st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 2), st.integers(1, 2)),
    type_id=st.sampled_from([F32, F16, BF16, I32]),
    layout=st.sampled_from(["contig", "permuted"]),
    seed=seeds,
)
def test_repeat(reference_v8, rpcnet_v8, shape, reps, type_id, layout, seed):
    ne_out = tuple(s * r for s, r in zip(shape, reps, strict=True))
    g = OpGraph()
    a = add_input(g, type_id, raw_values(type_id, seed, shape), layout)
    out = g.op(Op.REPEAT, type_id, ne_out, (a,))
    assert_same_bytes(g, out, reference_v8, rpcnet_v8)


@SETTINGS
@given(
    shape=shapes,
    pads=st.lists(st.integers(0, 3), min_size=8, max_size=8),
    circular=st.booleans(),
    layout=st.sampled_from(["contig", "permuted", "transposed"]),
    seed=seeds,
)
def test_pad(reference_v8, rpcnet_v8, shape, pads, circular, layout, seed):
    if circular:  # the reference wraps with (i - lp + ne) % ne: lp > ne reads out of bounds
        pads = [min(p, shape[i // 2]) if i % 2 == 0 else p for i, p in enumerate(pads)]
    ne_out = tuple(n + pads[2 * d] + pads[2 * d + 1] for d, n in enumerate(shape))
    g = OpGraph()
    a = add_input(g, F32, normal(seed, shape), layout)
    out = g.op(Op.PAD, F32, ne_out, (a,), params=pack_params(*pads, int(circular)))
    assert_same_bytes(g, out, reference_v8, rpcnet_v8)


@pytest.mark.parametrize(
    "start, stop, step", [(0.0, 10.0, 1.0), (-3.5, 7.25, 0.75), (1.0, 2.0, 0.1), (5.0, 1000.0, 3.3)]
)
def test_arange(reference_v8, rpcnet_v8, start, stop, step):
    n = int(np.ceil(np.float32(np.float32(stop) - np.float32(start)) / np.float32(step)))
    g = OpGraph()
    out = g.op(Op.ARANGE, F32, (n,), (), params=pack_params(start, stop, step))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    close(decode(o, F32, (n,)), decode(r, F32, (n,)), 0, 0, "arange")


@pytest.mark.parametrize("dim, max_period", [(8, 10000), (7, 10000), (32, 100), (1, 5)])
def test_timestep_embedding(reference_v8, rpcnet_v8, dim, max_period):
    t = np.array([0.0, 1.0, 17.5, 250.0, 999.0], np.float32)
    g = OpGraph()
    a = g.input(F32, (5,), t)
    out = g.op(Op.TIMESTEP_EMBEDDING, F32, (dim, 5), (a,), params=pack_params(dim, max_period))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    # cos/sin of arguments up to 1e3: one f32 ulp of the argument moves the result ~6e-5
    close(decode(o, F32, (dim, 5)), decode(r, F32, (dim, 5)), 1e-4, 1e-4, "timestep_embedding")


@SETTINGS
@given(
    n=st.integers(1, 9),
    batch=st.tuples(st.integers(1, 3), st.integers(1, 2)),
    n_past=st.integers(0, 4),
    seed=seeds,
)
def test_tri_and_diag_masks(reference_v8, rpcnet_v8, n, batch, n_past, seed):
    ne = (n, n, *batch)
    x = normal(seed, ne)
    g = OpGraph()
    a = g.input(F32, ne, x)
    outs = [g.op(Op.TRI, F32, ne, (a,), params=pack_params(t)) for t in range(4)]
    outs += [
        g.op(op, F32, ne, (a,), params=pack_params(n_past))
        for op in (Op.DIAG_MASK_INF, Op.DIAG_MASK_ZERO)
    ]
    ref, ours = run_both(g, outs, reference_v8, rpcnet_v8)
    assert ref == ours


@SETTINGS
@given(
    a_ne=st.tuples(st.integers(4, 12), st.integers(2, 5), st.integers(1, 3), st.integers(1, 2)),
    frac=st.tuples(st.floats(0.1, 1), st.floats(0.1, 1), st.floats(0.1, 1), st.floats(0.1, 1)),
    start=st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 2), st.integers(0, 1)),
    seed=seeds,
)
def test_acc(reference_v8, rpcnet_v8, a_ne, frac, start, seed):
    """ggml_acc(a, b, a.nb1, a.nb2, a.nb3, offset): b added onto a window of a."""
    b_ne = tuple(max(1, min(int(n * f), n - s)) for n, f, s in zip(a_ne, frac, start, strict=True))
    start = tuple(min(s, n - m) for s, n, m in zip(start, a_ne, b_ne, strict=True))
    nb = (4, 4 * a_ne[0], 4 * a_ne[0] * a_ne[1], 4 * a_ne[0] * a_ne[1] * a_ne[2])
    offset = sum(s * b for s, b in zip(start, nb, strict=True))
    g = OpGraph()
    a = g.input(F32, a_ne, normal(seed, a_ne))
    b = g.input(F32, b_ne, normal(seed + 1, b_ne))
    out = g.op(Op.ACC, F32, a_ne, (a, b), params=pack_params(nb[1], nb[2], nb[3], offset, 0))
    assert_same_bytes(g, out, reference_v8, rpcnet_v8)


@pytest.mark.parametrize(
    "a_t, b_t", [(F32, F32), (F16, F16), (F16, F32), (BF16, BF16), (BF16, F32)]
)
def test_add1(reference_v8, rpcnet_v8, a_t, b_t):
    ne = (13, 3, 2)
    g = OpGraph()
    a = add_input(g, a_t, quantize_like(a_t, normal(1, ne)), "permuted")
    b = g.input(b_t, (1,), encode(b_t, np.array([1.75], np.float32)))
    out = g.op(Op.ADD1, a_t, ne, (a, b))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    close(decode(o, a_t, ne), decode(r, a_t, ne), 0, 0, "add1")


@pytest.mark.parametrize("q_type", [2, 8])  # Q4_0, Q8_0: dequantize, add, requantize per row
def test_add1_quantized(reference_v8, rpcnet_v8, q_type):
    from rpcnet.compute import quant

    ne = (64, 4)
    x = normal(3, ne).reshape(4, 64)
    raw = np.asarray(quant.quantize(q_type, x)).tobytes()
    g = OpGraph()
    a = g.input(q_type, ne, raw)
    b = g.input(F32, (1,), np.array([0.37], np.float32))
    out = g.op(Op.ADD1, q_type, ne, (a, b))
    assert_same_bytes(g, out, reference_v8, rpcnet_v8)


@given_ints(ne0=(1, 20), n_used=(1, 4), n_tok=(1, 3), n_exp=(1, 6))
def test_add_id(reference_v8, rpcnet_v8, ne0, n_used, n_tok, n_exp, seed):
    rng = np.random.default_rng(seed)
    ne = (ne0, n_used, n_tok)
    ids = rng.integers(0, n_exp, (n_tok, n_used), dtype=np.int32)
    g = OpGraph()
    a = g.input(F32, ne, normal(seed, ne))
    b = g.input(F32, (ne0, n_exp), normal(seed + 1, (ne0, n_exp)))
    i = g.input(I32, (n_used, n_tok), ids)
    out = g.op(Op.ADD_ID, F32, ne, (a, b, i))
    assert_same_bytes(g, out, reference_v8, rpcnet_v8)


@given_ints(d_conv=(1, 5), d_inner=(1, 9), n_t=(1, 6), n_s=(1, 3))
def test_ssm_conv(reference_v8, rpcnet_v8, d_conv, d_inner, n_t, n_s, seed):
    sx_ne = (d_conv - 1 + n_t, d_inner, n_s)
    g = OpGraph()
    sx = g.input(F32, sx_ne, normal(seed, sx_ne))
    c = g.input(F32, (d_conv, d_inner), normal(seed + 1, (d_conv, d_inner)))
    out = g.op(Op.SSM_CONV, F32, (d_inner, n_t, n_s), (sx, c))
    (r,), (o,) = run_both(g, [out], reference_v8, rpcnet_v8)
    # exact for d_conv == 4 (Mamba); other widths: the reference's compiled loop contracts some
    # products into FMAs
    shape = (d_inner, n_t, n_s)
    close(decode(o, F32, shape), decode(r, F32, shape), 1e-5, 1e-6, "ssm_conv")
