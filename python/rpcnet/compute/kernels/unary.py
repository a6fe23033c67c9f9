"""Element-wise math: UNARY (all ggml_unary_op), SQR/SQRT/LOG/SIN/COS, SCALE, CLAMP, LEAKY_RELU, FILL.

Values are computed in float32 the way the ggml CPU backend does (f16/bf16 inputs are widened,
results rounded to the destination type). GELU and GELU_QUICK on f32/f16 inputs go through ggml's
fp16 lookup tables, which this module reproduces by rounding the argument and result to f16.

The helpers at the top (readers, writers, erf, gelu) are shared by the other element-wise kernel
modules (glu, norm, reduce, shape).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rpcnet.compute import convert
from rpcnet.compute.kernels.common import same_shape
from rpcnet.compute.kernels.registry import Step, kernel
from rpcnet.compute.ops import Op, Unary
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import GGML_BF16, GGML_F16, GGML_F32, PLAIN_DTYPES, plain_view

F32 = np.float32
FLOAT_TYPES = frozenset({GGML_F32, GGML_F16, GGML_BF16})

Reader = Callable[[], Any]
Writer = Callable[[Any], None]


# --------------------------------------------------------------------------------------------
# shared helpers


def reader(t: Tensor) -> Reader:
    """A zero-arg callable returning the tensor as float32 (ne3, ne2, ne1, ne0); views resolved now."""
    if t.type == GGML_F32:
        view = plain_view(t)
        return lambda: view
    if t.type in PLAIN_DTYPES and t.type != GGML_BF16:
        view = plain_view(t)
        return lambda: view.astype(F32)
    return lambda: convert.load_f32(t)


def writer(t: Tensor) -> Writer:
    """A callable storing float32 values (broadcastable to the tensor's shape) into the tensor."""
    if t.type in PLAIN_DTYPES and t.type != GGML_BF16:
        view = plain_view(t)

        def write_plain(values: Any) -> None:
            view[...] = values

        return write_plain
    return lambda values: convert.store(t, values)


def float_io(node: Tensor, *srcs: Tensor | None) -> bool:
    """Every given source and the node are f32/f16/bf16 tensors."""
    return node.type in FLOAT_TYPES and all(s is not None and s.type in FLOAT_TYPES for s in srcs)


def round_f16(x: Any) -> Any:
    """Round float32 values to the nearest f16 (ties to even) and widen back."""
    return x.astype(np.float16).astype(F32)


def erf(x: Any) -> Any:
    """erf for float arrays, evaluated in float64 (relative error of erfc below 1.2e-7), as float32.

    Chebyshev fit of erfc (Numerical Recipes `erfcc`); NumPy has no erf and this keeps to ufuncs.
    """
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -1.26551223 + t * (
        1.00002368
        + t
        * (
            0.37409196
            + t
            * (
                0.09678418
                + t
                * (
                    -0.18628806
                    + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))
                )
            )
        )
    )
    erfc_abs = t * np.exp(-z * z + poly)
    return np.where(x >= 0, 1.0 - erfc_abs, erfc_abs - 1.0).astype(F32)


GELU_COEF_A = F32(0.044715)
GELU_QUICK_COEF = F32(-1.702)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)
SQRT_2_INV = F32(0.70710678118654752440084436210484)
ONE, HALF, ZERO = F32(1.0), F32(0.5), F32(0.0)


def gelu_exact(x: Any) -> Any:
    """ggml_gelu_f32: the tanh approximation in float32."""
    return HALF * x * (ONE + np.tanh(SQRT_2_OVER_PI * x * (ONE + GELU_COEF_A * x * x)))


def gelu_quick_exact(x: Any) -> Any:
    return x * (ONE / (ONE + np.exp(GELU_QUICK_COEF * x)))


def gelu_erf(x: Any) -> Any:
    return HALF * x * (ONE + erf(x * SQRT_2_INV))


def silu(x: Any) -> Any:
    return x / (ONE + np.exp(-x))


def gelu_table(x: Any) -> Any:
    """ggml_table_gelu_f16[f16(x)]: GELU of the f16-rounded argument, rounded to f16."""
    return round_f16(gelu_exact(round_f16(x)))


def gelu_quick_table(x: Any) -> Any:
    return round_f16(gelu_quick_exact(round_f16(x)))


def gelu_f32_path(x: Any) -> Any:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: table lookup, exact outside [-10, 10]."""
    return np.where(x <= -10.0, ZERO, np.where(x >= 10.0, x, gelu_table(x)))


def quiet() -> Any:
    """Float warnings off: overflow to inf / NaN propagation is the expected ggml behaviour."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")


# --------------------------------------------------------------------------------------------
# UNARY


def _round_half_away(x: Any) -> Any:
    """C roundf: halfway cases away from zero (np.round rounds them to even)."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= HALF, t + np.sign(x), t)


def _xielu(params: tuple[float, float, float, float]) -> Callable[[Any], Any]:
    alpha_n, alpha_p, beta, eps = (F32(p) for p in params)

    def run(x: Any) -> Any:
        neg = (np.expm1(np.minimum(x, eps)) - x) * alpha_n + beta * x
        return np.where(x > 0, alpha_p * x * x + beta * x, neg)

    return run


_SIMPLE: dict[int, Callable[[Any], Any]] = {
    Unary.ABS: np.abs,
    Unary.SGN: lambda x: np.where(x > 0, ONE, np.where(x < 0, -ONE, ZERO)),
    Unary.NEG: np.negative,
    Unary.STEP: lambda x: np.where(x > 0, ONE, ZERO),
    Unary.TANH: np.tanh,
    Unary.ELU: lambda x: np.where(x > 0, x, np.expm1(x)),
    Unary.RELU: lambda x: np.where(x > 0, x, ZERO),
    Unary.SIGMOID: lambda x: ONE / (ONE + np.exp(-x)),
    Unary.GELU_ERF: gelu_erf,
    Unary.SILU: silu,
    Unary.HARDSWISH: lambda x: x * np.fmin(ONE, np.fmax(ZERO, (x + F32(3.0)) / F32(6.0))),
    Unary.HARDSIGMOID: lambda x: np.fmin(ONE, np.fmax(ZERO, (x + F32(3.0)) / F32(6.0))),
    Unary.EXP: np.exp,
    Unary.EXPM1: lambda x: np.exp(x) - ONE,  # ggml: expf(x) - 1, not expm1f
    Unary.SOFTPLUS: lambda x: np.where(x > F32(20.0), x, np.log(ONE + np.exp(x))),
    Unary.FLOOR: np.floor,
    Unary.CEIL: np.ceil,
    Unary.ROUND: _round_half_away,
    Unary.TRUNC: np.trunc,
}

_VALID_UNARY = frozenset(int(u) for u in Unary)


def _unary_fn(node: Tensor, src_type: int) -> Callable[[Any], Any]:
    op = node.i32(0)
    if op == Unary.GELU:
        if src_type == GGML_F32:
            return gelu_f32_path
        return gelu_table if src_type == GGML_F16 else gelu_exact
    if op == Unary.GELU_QUICK:
        return gelu_quick_table if src_type in (GGML_F32, GGML_F16) else gelu_quick_exact
    if op == Unary.XIELU:
        return _xielu((node.f32(1), node.f32(2), node.f32(3), node.f32(4)))
    return _SIMPLE[op]


def _elementwise_ok(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    return a is not None and same_shape(a, node) and float_io(node, a)


def _unary_ok(node: Tensor) -> bool:
    return _elementwise_ok(node) and node.i32(0) in _VALID_UNARY


def _map(node: Tensor, fn: Callable[[Any], Any]) -> Step:
    src = node.src[0]
    assert src is not None
    load, store = reader(src), writer(node)

    def run() -> None:
        with quiet():
            store(fn(load()))

    return run


@kernel(Op.UNARY, "f32|f16|bf16 -> f32|f16|bf16 (all unary ops, GELU via f16 table)", _unary_ok)
def unary(node: Tensor) -> Step:
    src = node.src[0]
    assert src is not None
    return _map(node, _unary_fn(node, src.type))


_MATH = {
    Op.SQR: lambda x: x * x,
    Op.SQRT: np.sqrt,
    Op.LOG: np.log,
    Op.SIN: np.sin,
    Op.COS: np.cos,
}


def _math(node: Tensor) -> Step:
    return _map(node, _MATH[Op(node.op)])


for _op in _MATH:
    kernel(_op, "f32|f16|bf16 -> f32|f16|bf16", _elementwise_ok)(_math)


@kernel(Op.SCALE, "f32|f16|bf16 (x*s + b)", _elementwise_ok)
def scale(node: Tensor) -> Step:
    s, b = F32(node.f32(0)), F32(node.f32(1))
    if b == 0.0:
        return _map(node, lambda x: x * s)
    return _map(node, lambda x: x * s + b)


@kernel(Op.CLAMP, "f32|f16|bf16", _elementwise_ok)
def clamp(node: Tensor) -> Step:
    lo, hi = F32(node.f32(0)), F32(node.f32(1))

    def fn(x: Any) -> Any:
        # MAX(MIN(x, hi), lo) with ggml's macros: a NaN input becomes hi (then lo if hi < lo)
        m = np.where(x < hi, x, hi)
        return np.where(m > lo, m, lo)

    return _map(node, fn)


@kernel(Op.LEAKY_RELU, "f32|f16|bf16", _elementwise_ok)
def leaky_relu(node: Tensor) -> Step:
    slope = F32(node.f32(0))
    return _map(node, lambda x: np.where(x > 0, x, ZERO) + slope * np.where(x < 0, x, ZERO))


def _fill_ok(node: Tensor) -> bool:
    return node.type in FLOAT_TYPES


@kernel(Op.FILL, "-> f32|f16|bf16", _fill_ok)
def fill(node: Tensor) -> Step:
    value = np.asarray(F32(node.f32(0)))
    store = writer(node)

    def run() -> None:
        store(value)

    return run
