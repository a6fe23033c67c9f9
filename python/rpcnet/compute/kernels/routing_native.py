"""A mixture-of-experts router's small ops as native steps: ARGSORT (the top-k experts),
SUM_ROWS (the selected weights' sum) and CLAMP (that sum's floor) on f32 rows.

With these and MUL_MAT_ID (`moe_native`) native, a MoE layer runs inside the plan's detached
runs from its router product to its weighted sum, so a MoE decode step crosses into Python no
more often than a dense one. The NumPy kernels (`reduce`, `unary`) serve every other layout.
"""

from __future__ import annotations

from rpcnet import _native
from rpcnet.compute.kernels.common import same_shape
from rpcnet.compute.kernels.kernel_table import Step
from rpcnet.compute.kernels.native_args import (
    device_threads,
    disjoint,
    native_kernel,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

F32, I32 = GgmlType.F32, GgmlType.I32


def _f32_rows(t: Tensor | None, dtype: int = F32) -> bool:
    return t is not None and t.type == dtype and rows_contiguous(t, 4)


def _apart(node: Tensor, src: Tensor) -> bool:
    return src.buffer is not node.buffer or disjoint(node, src)


def _argsort_ok(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    return (
        _f32_rows(a)
        and _f32_rows(node, I32)
        and a is not None
        and same_shape(a, node)
        and node.i32(0) in (0, 1)
        and _apart(node, a)
    )


@native_kernel(Op.ARGSORT, "f32 -> i32, stable (native)", _argsort_ok)
def argsort_native(node: Tensor) -> Step:
    a = node.src[0]
    assert a is not None
    descending = node.i32(0) == 1
    return _native.argsort_step(tensor_arg(a), tensor_arg(node), descending, device_threads(node))


def _sum_rows_ok(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    return (
        _f32_rows(a)
        and _f32_rows(node)
        and a is not None
        and node.ne[0] == 1
        and tuple(node.ne[1:]) == tuple(a.ne[1:])
        and _apart(node, a)
    )


@native_kernel(Op.SUM_ROWS, "f32, summed in f64 (native)", _sum_rows_ok)
def sum_rows_native(node: Tensor) -> Step:
    a = node.src[0]
    assert a is not None
    return _native.sum_rows_step(tensor_arg(a), tensor_arg(node), device_threads(node))


def _clamp_ok(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    if not (_f32_rows(a) and _f32_rows(node) and a is not None and same_shape(a, node)):
        return False
    in_place = a.buffer is node.buffer and a.offset == node.offset and a.nb == node.nb
    return in_place or _apart(node, a)


@native_kernel(Op.CLAMP, "f32 (native)", _clamp_ok)
def clamp_native(node: Tensor) -> Step:
    a = node.src[0]
    assert a is not None
    lo, hi = node.f32(0), node.f32(1)
    return _native.clamp_step(tensor_arg(a), tensor_arg(node), lo, hi, device_threads(node))
