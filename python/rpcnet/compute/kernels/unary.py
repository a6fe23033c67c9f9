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

CLAMP (a MoE router's floor under the selected weights' sum), SCALE, TANH and GELU of f32 rows
also run natively (gemma2's soft-capping and GEGLU stay inside the native plan). The
tensor readers/writers live in common.py, the float32 math (erf, gelu, libm) in floatmath.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute.kernels.common import (
    F32,
    FLOAT_TYPES,
    float_io,
    quiet,
    reader,
    same_shape,
    writer,
)
from rpcnet.compute.kernels.floatmath import (
    HALF,
    ONE,
    ZERO,
    cos,
    exp,
    expm1,
    fma,
    gelu_erf,
    gelu_exact,
    gelu_f16_table,
    gelu_f32_path,
    gelu_quick_exact,
    gelu_quick_table,
    gelu_table,
    log,
    silu,
    silu_rows,
    sin,
    tanh,
)
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import apart, f32_rows, native_row, tensor_arg
from rpcnet.compute.ops import Op, Unary
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily(
    "unary",
    cuda=("rpcnet.compute.cuda.kernels.elementwise", "rpcnet.compute.cuda.kernels.array_code"),
)

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
        if src_type == GgmlType.F32:
            return gelu_f32_path
        return gelu_table if src_type == GgmlType.F16 else gelu_exact
    if op == Unary.GELU_QUICK:
        return gelu_quick_table if src_type in (GgmlType.F32, GgmlType.F16) else gelu_quick_exact
    if op == Unary.SILU and src_type == GgmlType.F32:
        return silu_rows  # ggml_vec_silu_f32: v_silu lanes; f16/bf16 rows go element-wise
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


@FAMILY.kernel(
    Op.UNARY, "f32|f16|bf16 -> f32|f16|bf16 (all unary ops, GELU via f16 table)", _unary_ok
)
def unary(node: Tensor, context: BuildContext) -> Step:
    src = node.src[0]
    assert src is not None
    return _map(node, _unary_fn(node, src.type))


_MATH: dict[int, Callable[[Any], Any]] = {
    Op.SQR: lambda x: x * x,
    Op.SQRT: np.sqrt,
    Op.LOG: log,
    Op.SIN: sin,
    Op.COS: cos,
}


@FAMILY.kernel(tuple(_MATH), "f32|f16|bf16 -> f32|f16|bf16", _elementwise_ok)
def _math(node: Tensor, context: BuildContext) -> Step:
    return _map(node, _MATH[Op(node.op)])


@FAMILY.kernel(Op.SCALE, "f32|f16|bf16 (x*s + b)", _elementwise_ok)
def scale(node: Tensor, context: BuildContext) -> Step:
    s, b = F32(node.f32(0)), F32(node.f32(1))
    if b == 0.0:
        return _map(node, lambda x: x * s)
    return _map(node, lambda x: fma(x, s, b))  # ggml_vec_mad1_f32 is an FMA


@FAMILY.kernel(Op.CLAMP, "f32|f16|bf16", _elementwise_ok)
def clamp(node: Tensor, context: BuildContext) -> Step:
    lo, hi = F32(node.f32(0)), F32(node.f32(1))

    def fn(x: Any) -> Any:
        # MAX(MIN(x, hi), lo) with ggml's macros: a NaN input becomes hi (then lo if hi < lo)
        m = np.where(x < hi, x, hi)
        return np.where(m > lo, m, lo)

    return _map(node, fn)


@FAMILY.kernel(Op.LEAKY_RELU, "f32|f16|bf16", _elementwise_ok)
def leaky_relu(node: Tensor, context: BuildContext) -> Step:
    slope = F32(node.f32(0))
    return _map(node, lambda x: np.where(x > 0, x, ZERO) + slope * np.where(x < 0, x, ZERO))


def _fill_ok(node: Tensor) -> bool:
    return node.type in FLOAT_TYPES


@FAMILY.kernel(Op.FILL, "-> f32|f16|bf16", _fill_ok)
def fill(node: Tensor, context: BuildContext) -> Step:
    value = np.asarray(F32(node.f32(0)))
    store = writer(node)

    def run() -> None:
        store(value)

    return run


def _map_native_ok(node: Tensor) -> bool:
    """f32 rows in, f32 rows of the same shape out, in place or apart (the native maps)."""
    a = node.src[0] if node.src else None
    if not (f32_rows(a) and f32_rows(node) and a is not None and same_shape(a, node)):
        return False
    in_place = a.buffer is node.buffer and a.offset == node.offset and a.nb == node.nb
    return in_place or apart(node, a)


@native_row(FAMILY, Op.CLAMP, "f32 (native)", _map_native_ok)
def clamp_native(node: Tensor, context: BuildContext) -> Step:
    a = node.src[0]
    assert a is not None
    lo, hi = node.f32(0), node.f32(1)
    return _native.clamp_step(tensor_arg(a), tensor_arg(node), lo, hi, context.threads)


_NATIVE_UNARY = frozenset({Unary.TANH, Unary.GELU})


def _unary_native_ok(node: Tensor) -> bool:
    return node.i32(0) in _NATIVE_UNARY and _map_native_ok(node)


@native_row(FAMILY, Op.UNARY, "TANH, GELU f32 (native)", _unary_native_ok)
def unary_native(node: Tensor, context: BuildContext) -> Step:
    a = node.src[0]
    assert a is not None
    if node.i32(0) == Unary.TANH:
        return _native.tanh_step(tensor_arg(a), tensor_arg(node), context.threads)
    table = gelu_f16_table()
    return _native.gelu_step(tensor_arg(a), tensor_arg(node), table, context.threads)


@native_row(FAMILY, Op.SCALE, "f32 (native)", _map_native_ok)
def scale_native(node: Tensor, context: BuildContext) -> Step:
    a = node.src[0]
    assert a is not None
    s, b = node.f32(0), node.f32(1)
    return _native.scale_step(tensor_arg(a), tensor_arg(node), s, b, context.threads)
