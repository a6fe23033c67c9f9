"""Reductions and orderings: SUM, SUM_ROWS, MEAN, CUMSUM, ARGMAX, ARGSORT, TOP_K, COUNT_EQUAL.

Accumulation order/precision follows the ggml CPU kernels: f32 sums in float64 rounded once,
f16/bf16 SUM and every CUMSUM left to right in float32. ARGMAX returns the last index of the maximum
(ggml's loop); ARGSORT is stable (std::sort is not: ties beyond 16 elements may order
differently from the reference); TOP_K returns the k largest in descending order (which of
several equal values at the k-th place is picked is unspecified, as in ggml). ARGSORT and
SUM_ROWS of f32 rows also run natively (a MoE router's top-k and the selected weights' sum).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute.kernels.common import F32, FLOAT_TYPES, float_io, same_shape, source_io, writer
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import apart, f32_rows, native_row, tensor_arg
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import PLAIN_DTYPES, plain_view
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily("reduce", cuda=("rpcnet.compute.cuda.kernels.array_code",))

F64 = np.float64


def _src(node: Tensor) -> Tensor | None:
    return node.src[0] if node.src else None


def _sequential_sum(x: Any) -> Any:
    """Left-to-right float32 sum of a 1-D array (add.accumulate is sequential)."""
    return np.cumsum(x, dtype=F32)[-1]


def _sum_ok(node: Tensor) -> bool:
    a = _src(node)
    return a is not None and float_io(node, a) and node.nelements == 1


@FAMILY.kernel(Op.SUM, "f32|f16|bf16 -> scalar", _sum_ok)
def sum_all(node: Tensor, context: BuildContext) -> Step:
    a_t, load, store = source_io(node)
    if a_t.type == GgmlType.F32:

        def run_f32() -> None:
            store(np.sum(load(), dtype=F64).astype(F32))

        return run_f32

    def run_half() -> None:
        # ggml_vec_sum_f16_ggf: float32 running sums per row, then over rows
        x = load()
        rows = np.cumsum(x, axis=-1, dtype=F32)[..., -1]
        store(_sequential_sum(rows.reshape(-1)))

    return run_half


def _rows_ok(node: Tensor) -> bool:
    a = _src(node)
    return (
        a is not None
        and float_io(node, a)
        and node.ne[0] == 1
        and tuple(node.ne[1:]) == tuple(a.ne[1:])
    )


@FAMILY.kernel(Op.SUM_ROWS, "f32|f16|bf16", _rows_ok)
def sum_rows(node: Tensor, context: BuildContext) -> Step:
    a_t, load, store = source_io(node)

    def run() -> None:
        store(np.sum(load(), axis=-1, dtype=F64, keepdims=True).astype(F32))

    return run


@FAMILY.kernel(Op.MEAN, "f32|f16|bf16", _rows_ok)
def mean(node: Tensor, context: BuildContext) -> Step:
    a_t, load, store = source_io(node)
    n = F32(a_t.ne[0])

    def run() -> None:
        store(np.sum(load(), axis=-1, dtype=F64, keepdims=True).astype(F32) / n)

    return run


def _same_float_ok(node: Tensor) -> bool:
    a = _src(node)
    return a is not None and float_io(node, a) and same_shape(a, node)


@FAMILY.kernel(Op.CUMSUM, "f32|f16|bf16 along ne0", _same_float_ok)
def cumsum(node: Tensor, context: BuildContext) -> Step:
    a_t, load, store = source_io(node)

    def run() -> None:
        store(np.cumsum(load(), axis=-1, dtype=F32))

    return run


def _float_to_index(node: Tensor) -> Tensor | None:
    """The source of an op from floats to i32 indices, when both types fit."""
    a = _src(node)
    return a if a is not None and a.type in FLOAT_TYPES and node.type == GgmlType.I32 else None


def _argmax_ok(node: Tensor) -> bool:
    a = _float_to_index(node)
    return a is not None and node.nelements == a.ne[1] * a.ne[2] * a.ne[3]


@FAMILY.kernel(Op.ARGMAX, "f32|f16|bf16 -> i32", _argmax_ok)
def argmax(node: Tensor, context: BuildContext) -> Step:
    a_t, load, store = source_io(node)
    last = a_t.ne[0] - 1
    shape = (node.ne[3], node.ne[2], node.ne[1], node.ne[0])

    def run() -> None:
        # ggml keeps the last index that equals the running maximum
        idx = last - np.argmax(load()[..., ::-1], axis=-1)
        store(idx.astype(np.int32).reshape(shape))

    return run


def _argsort_ok(node: Tensor) -> bool:
    a = _float_to_index(node)
    return a is not None and same_shape(a, node) and node.i32(0) in (0, 1)


def _descending(x: Any) -> Any:
    """Stable order, largest first (ties keep index order, like an insertion sort with `>`)."""
    return np.argsort(-x, axis=-1, kind="stable")


@FAMILY.kernel(Op.ARGSORT, "f32|f16|bf16 -> i32 (p0: 0 asc, 1 desc)", _argsort_ok)
def argsort(node: Tensor, context: BuildContext) -> Step:
    a_t, load, store = source_io(node)
    desc = node.i32(0) == 1

    def run() -> None:
        x = load()
        order = _descending(x) if desc else np.argsort(x, axis=-1, kind="stable")
        store(order.astype(np.int32))

    return run


def _top_k_ok(node: Tensor) -> bool:
    a = _float_to_index(node)
    return a is not None and 0 < node.ne[0] <= a.ne[0] and tuple(node.ne[1:]) == tuple(a.ne[1:])


@FAMILY.kernel(Op.TOP_K, "f32|f16|bf16 -> i32 (k = ne0, descending)", _top_k_ok)
def top_k(node: Tensor, context: BuildContext) -> Step:
    a_t, load, store = source_io(node)
    k, n = node.ne[0], a_t.ne[0]

    def run_small_k() -> None:
        x = load()
        # candidates first (linear time), then only those are ordered: largest first, ties by index
        picked = np.sort(np.argpartition(-x, k - 1, axis=-1)[..., :k], axis=-1)
        order = _descending(np.take_along_axis(x, picked, axis=-1))
        store(np.take_along_axis(picked, order, axis=-1).astype(np.int32))

    def run_full() -> None:
        store(_descending(load())[..., :k].astype(np.int32))

    return run_small_k if 4 * k <= n else run_full


def _count_equal_ok(node: Tensor) -> bool:
    a = _src(node)
    b = node.src[1] if len(node.src) > 1 else None
    return (
        a is not None
        and b is not None
        and a.type == b.type
        and a.type in PLAIN_DTYPES
        and same_shape(a, b)
        and node.type == GgmlType.I64
        and node.nelements == 1
    )


@FAMILY.kernel(Op.COUNT_EQUAL, "i32 (any plain type) x same -> i64", _count_equal_ok)
def count_equal(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    a, b = plain_view(a_t), plain_view(b_t)
    store = writer(node)

    def run() -> None:
        store(np.int64(np.count_nonzero(a == b)))

    return run


# --- native kernels (a MoE router's top-k and weight sums) ------------------------------------


def _argsort_native_ok(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    return (
        f32_rows(a)
        and f32_rows(node, GgmlType.I32)
        and a is not None
        and same_shape(a, node)
        and node.i32(0) in (0, 1)
        and apart(node, a)
    )


@native_row(FAMILY, Op.ARGSORT, "f32 -> i32, stable (native)", _argsort_native_ok)
def argsort_native(node: Tensor, context: BuildContext) -> Step:
    a = node.src[0]
    assert a is not None
    descending = node.i32(0) == 1
    return _native.argsort_step(tensor_arg(a), tensor_arg(node), descending, context.threads)


def _sum_rows_native_ok(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    return (
        f32_rows(a)
        and f32_rows(node)
        and a is not None
        and node.ne[0] == 1
        and tuple(node.ne[1:]) == tuple(a.ne[1:])
        and apart(node, a)
    )


@native_row(FAMILY, Op.SUM_ROWS, "f32, summed in f64 (native)", _sum_rows_native_ok)
def sum_rows_native(node: Tensor, context: BuildContext) -> Step:
    a = node.src[0]
    assert a is not None
    return _native.sum_rows_step(tensor_arg(a), tensor_arg(node), context.threads)
