"""GLU: act(x) * g, either split (src1 null: x and g are the halves of src0's rows, `swapped`
exchanges them) or fused (x = src0, g = src1, `swapped` ignored as in ggml).

Per-op arithmetic follows the ggml CPU kernels, including the f16 GELU tables on f32/f16 inputs
and the clamping of SWIGLU_OAI / SWIGLU_CLAMP. SWIGLU and GEGLU on f32 rows also run natively
(ggml's AVX2 SiLU with its vector expf; the f16 GELU table).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute.kernels.common import F32, float_io, quiet, reader, same_shape, writer
from rpcnet.compute.kernels.floatmath import (
    ONE,
    ZERO,
    exp_fast,
    gelu_erf,
    gelu_exact,
    gelu_f16_table,
    gelu_quick_exact,
    gelu_quick_table,
    gelu_table,
    silu,
    silu_rows,
)
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import native_row, rows_contiguous, tensor_arg
from rpcnet.compute.ops import Glu, Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily("glu", cuda=("rpcnet.compute.cuda.kernels.elementwise",))

GluFn = Callable[[Any, Any], Any]


def _geglu(src_type: int) -> GluFn:
    if src_type == GgmlType.F32:
        # ggml_vec_geglu_f32 with GGML_GELU_FP16: exact outside [-10, 10]
        def geglu_f32(x: Any, g: Any) -> Any:
            act = np.where(x >= 10.0, x, gelu_table(x))
            return np.where(x <= -10.0, ZERO, act * g)

        return geglu_f32
    if src_type == GgmlType.F16:
        return lambda x, g: gelu_table(x) * g
    return lambda x, g: gelu_exact(x) * g


def _geglu_quick(src_type: int) -> GluFn:
    if src_type in (GgmlType.F32, GgmlType.F16):
        return lambda x, g: gelu_quick_table(x) * g
    return lambda x, g: gelu_quick_exact(x) * g


def _min_limit(x: Any, limit: Any) -> Any:
    """std::min(x, limit): NaN x stays NaN."""
    return np.where(limit < x, limit, x)


def _clamp_limit(g: Any, limit: Any) -> Any:
    """std::clamp(g, -limit, limit)."""
    return np.where(g < -limit, -limit, np.where(limit < g, limit, g))


def _swiglu_oai(alpha: Any, limit: Any) -> GluFn:
    def run(x: Any, g: Any) -> Any:
        x = _min_limit(x, limit)
        y = _clamp_limit(g, limit)
        return x / (ONE + exp_fast(alpha * -x)) * (y + ONE)

    return run


def _swiglu_clamp(limit: Any) -> GluFn:
    def run(x: Any, g: Any) -> Any:
        gate = _min_limit(x, limit)
        return gate / (ONE + exp_fast(-gate)) * _clamp_limit(g, limit)

    return run


def _glu_fn(node: Tensor, src_type: int) -> GluFn:
    op = node.i32(0)
    if op == Glu.REGLU:
        return lambda x, g: np.where(x > 0, x * g, ZERO)
    if op == Glu.GEGLU:
        return _geglu(src_type)
    if op == Glu.SWIGLU:  # ggml_vec_swiglu_f32 (v_silu lanes) for f32, per element otherwise
        if src_type == GgmlType.F32:
            return lambda x, g: silu_rows(x) * g
        return lambda x, g: silu(x) * g
    if op == Glu.SWIGLU_OAI:
        return _swiglu_oai(F32(node.f32(2)), F32(node.f32(3)))
    if op == Glu.GEGLU_ERF:
        return lambda x, g: gelu_erf(x) * g
    if op == Glu.GEGLU_QUICK:
        return _geglu_quick(src_type)
    if op == Glu.SWIGLU_CLAMP:
        return _swiglu_clamp(F32(node.f32(3)))
    raise AssertionError(f"unsupported GLU op {op}")


_VALID_GLU = frozenset(int(g) for g in Glu)


def _supported(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    b = node.src[1] if len(node.src) > 1 else None
    if a is None or node.i32(0) not in _VALID_GLU or not float_io(node, a):
        return False
    if tuple(node.ne[1:]) != tuple(a.ne[1:]):
        return False
    if b is None:
        return node.ne[0] == a.ne[0] // 2
    return float_io(node, b) and same_shape(a, b) and same_shape(a, node)


@FAMILY.kernel(Op.GLU, "f32|f16|bf16 split or fused (all glu ops, GEGLU via f16 table)", _supported)
def glu(node: Tensor, context: BuildContext) -> Step:
    a_t = node.src[0]
    b_t = node.src[1] if len(node.src) > 1 else None
    assert a_t is not None
    fn = _glu_fn(node, a_t.type)
    store = writer(node)
    load_a = reader(a_t)
    if b_t is not None:
        load_b = reader(b_t)

        def run_fused() -> None:
            with quiet():
                store(fn(load_a(), load_b()))

        return run_fused

    nc = node.ne[0]
    first, second = (
        (slice(nc, 2 * nc), slice(0, nc)) if node.i32(1) else (slice(0, nc), slice(nc, 2 * nc))
    )

    def run_split() -> None:
        a = load_a()
        with quiet():
            store(fn(a[..., first], a[..., second]))

    return run_split


_NATIVE_GLU = frozenset({Glu.SWIGLU, Glu.GEGLU})


def _native_supported(node: Tensor) -> bool:
    """`_supported`'s rules, for SWIGLU and GEGLU on f32 rows (a split takes an even row)."""
    if not _supported(node) or node.i32(0) not in _NATIVE_GLU:
        return False
    a = node.src[0]
    b = node.src[1] if len(node.src) > 1 else None
    assert a is not None
    operands = (a, node) if b is None else (a, b, node)
    if any(t.type != GgmlType.F32 or not rows_contiguous(t, 4) for t in operands):
        return False
    return b is not None or node.ne[0] * 2 == a.ne[0]


@native_row(FAMILY, Op.GLU, "SWIGLU, GEGLU f32 split or fused (native)", _native_supported)
def glu_native(node: Tensor, context: BuildContext) -> Step:
    a, b = node.src[0], node.src[1] if len(node.src) > 1 else None
    assert a is not None
    nc = node.ne[0]
    if b is not None:
        x, g = tensor_arg(a), tensor_arg(b)
    else:
        swapped = node.i32(1) != 0
        x = tensor_arg(a, offset=4 * nc if swapped else 0, ne0=nc)
        g = tensor_arg(a, offset=0 if swapped else 4 * nc, ne0=nc)
    if node.i32(0) == Glu.GEGLU:
        return _native.geglu_step(x, g, tensor_arg(node), gelu_f16_table(), context.threads)
    return _native.swiglu_step(x, g, tensor_arg(node), context.threads)
