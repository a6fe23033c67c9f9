"""Element-wise math: UNARY (every ggml_unary_op), SQR/SQRT/LOG/SIN/COS, SCALE, CLAMP,
LEAKY_RELU, FILL.

Values are computed in float32 the way the ggml CPU backend does (f16/bf16 inputs are widened,
results rounded to the destination type):
* GELU and GELU_QUICK on f32/f16 inputs go through ggml's fp16 lookup tables (argument rounded to
  f16, result is the f16 table entry); the same tables are rebuilt here, so results are exact;
* libm functions (expf, tanhf, logf, ...) are evaluated in float64 and rounded once, which agrees
  with glibc far more often than NumPy's float32 SIMD versions; the SiLU family keeps the fast
  float32 exp (the reference uses its own SIMD exp approximation there);
* `a*b + c` that the reference computes with an FMA (SCALE with bias, XIELU) is rounded once.

The helpers at the top (readers, writers, erf, gelu) are shared by the other element-wise kernel
modules (glu, norm, reduce, shape).
"""

from __future__ import annotations

import math
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
    """A zero-arg callable giving the tensor as float32 (ne3, ne2, ne1, ne0); views resolved now."""
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


_ERF_STEP = 1.0 / 1024  # table spacing (a power of two: exact scaling)
_ERF_LIMIT = 6.0  # erf(6) == 1 in float64
_ERF_TABLES: list[Any] = []


def _erf_tables() -> tuple[Any, Any]:
    """erf and its derivative (times the step) on the grid k*_ERF_STEP, 0 <= k*step <= 6."""
    if not _ERF_TABLES:
        grid = [k * _ERF_STEP for k in range(int(_ERF_LIMIT / _ERF_STEP) + 2)]
        values = np.array([math.erf(z) for z in grid])
        slopes = 2.0 / math.sqrt(math.pi) * np.exp(-np.square(np.array(grid))) * _ERF_STEP
        _ERF_TABLES[:] = [values, slopes]
    return _ERF_TABLES[0], _ERF_TABLES[1]


def erf(x: Any) -> Any:
    """erf of a float array as float32 (NumPy has none): cubic Hermite interpolation of an exact
    float64 table (error < 1e-13), so the float32 result is the correctly rounded erf."""
    values, slopes = _erf_tables()
    u = np.fmin(np.abs(x.astype(np.float64)), _ERF_LIMIT) / _ERF_STEP  # NaN -> limit
    k = np.minimum(np.floor(u), len(values) - 2).astype(np.intp)
    t = u - k
    s = 1.0 - t
    f0, f1 = np.take(values, k), np.take(values, k + 1)
    d0, d1 = np.take(slopes, k), np.take(slopes, k + 1)
    y = s * s * ((1.0 + 2.0 * t) * f0 + t * d0) + t * t * ((3.0 - 2.0 * t) * f1 - s * d1)
    return np.where(np.isnan(x), x, np.copysign(y, x).astype(F32))


def _precise(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A float32 function evaluated in float64 and rounded once, like glibc's *f functions.

    NumPy's float32 SIMD versions are a few ulps off (tanh saturates at 1 - 2^-24, which
    `1 + tanh` in GELU turns into a different result); the reference calls libm per element.
    """

    def f32_fn(x: Any) -> Any:
        return fn(x.astype(np.float64)).astype(F32)

    return f32_fn


exp, expm1, tanh, log = _precise(np.exp), _precise(np.expm1), _precise(np.tanh), _precise(np.log)
sin, cos = _precise(np.sin), _precise(np.cos)
# The SiLU family is a hot path and the reference itself uses a SIMD exp approximation there.
exp_fast = np.exp

GELU_COEF_A = F32(0.044715)
GELU_QUICK_COEF = F32(-1.702)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)
SQRT_2_INV = F32(0.70710678118654752440084436210484)
ONE, HALF, ZERO = F32(1.0), F32(0.5), F32(0.0)


def gelu_exact(x: Any) -> Any:
    """ggml_gelu_f32: the tanh approximation in float32."""
    return HALF * x * (ONE + tanh(SQRT_2_OVER_PI * x * (ONE + GELU_COEF_A * x * x)))


def gelu_quick_exact(x: Any) -> Any:
    return x * (ONE / (ONE + exp(GELU_QUICK_COEF * x)))


def gelu_erf(x: Any) -> Any:
    return HALF * x * (ONE + erf(x * SQRT_2_INV))


def silu(x: Any) -> Any:
    return x / (ONE + exp_fast(-x))


_TABLES: dict[str, Any] = {}


def _f16_table(name: str) -> Any:
    """ggml_table_gelu_f16 / ggml_table_gelu_quick_f16 (as float32), built on first use."""
    table = _TABLES.get(name)
    if table is None:
        arg = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(F32)
        with quiet():
            values = gelu_exact(arg) if name == "gelu" else gelu_quick_exact(arg)
        table = _TABLES[name] = round_f16(values)
    return table


def _lookup(name: str, x: Any) -> Any:
    return np.take(_f16_table(name), x.astype(np.float16).view(np.uint16))


def gelu_table(x: Any) -> Any:
    """ggml_table_gelu_f16[f16(x)]: GELU of the f16-rounded argument, rounded to f16."""
    return _lookup("gelu", x)


def gelu_quick_table(x: Any) -> Any:
    return _lookup("gelu_quick", x)


def gelu_f32_path(x: Any) -> Any:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: table lookup, exact outside [-10, 10]."""
    return np.where(x <= -10.0, ZERO, np.where(x >= 10.0, x, gelu_table(x)))


def fma(a: Any, b: Any, c: Any) -> Any:
    """a*b + c rounded once to float32 (the product is exact in float64), like the reference's
    explicit or compiler-contracted FMAs."""
    return (np.asarray(a, np.float64) * b + c).astype(F32)


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
        # the reference's compiler contracts `a*b + c*d` into fma(a, b, c*d)
        bx = beta * x
        neg = fma(expm1(np.fmin(x, eps)) - x, alpha_n, bx)
        return np.where(x > 0, fma(alpha_p * x, x, bx), neg)

    return run


_SIMPLE: dict[int, Callable[[Any], Any]] = {
    Unary.ABS: np.abs,
    Unary.SGN: lambda x: np.where(x > 0, ONE, np.where(x < 0, -ONE, ZERO)),
    Unary.NEG: np.negative,
    Unary.STEP: lambda x: np.where(x > 0, ONE, ZERO),
    Unary.TANH: tanh,
    Unary.ELU: lambda x: np.where(x > 0, x, expm1(x)),
    Unary.RELU: lambda x: np.where(x > 0, x, ZERO),
    Unary.SIGMOID: lambda x: ONE / (ONE + exp(-x)),
    Unary.GELU_ERF: gelu_erf,
    Unary.SILU: silu,
    Unary.HARDSWISH: lambda x: x * np.fmin(ONE, np.fmax(ZERO, (x + F32(3.0)) / F32(6.0))),
    Unary.HARDSIGMOID: lambda x: np.fmin(ONE, np.fmax(ZERO, (x + F32(3.0)) / F32(6.0))),
    Unary.EXP: exp,
    Unary.EXPM1: lambda x: exp(x) - ONE,  # ggml: expf(x) - 1, not expm1f
    Unary.SOFTPLUS: lambda x: np.where(x > F32(20.0), x, log(ONE + exp(x))),
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


_MATH: dict[Op, Callable[[Any], Any]] = {
    Op.SQR: lambda x: x * x,
    Op.SQRT: np.sqrt,
    Op.LOG: log,
    Op.SIN: sin,
    Op.COS: cos,
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
    return _map(node, lambda x: fma(x, s, b))  # ggml_vec_mad1_f32 is an FMA


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
