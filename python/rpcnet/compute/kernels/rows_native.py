"""GET_ROWS, SET_ROWS, CPY and CONT between f32 and f16 by the native kernels.

SET_ROWS of f32 rows into an f16 (or f32) KV cache and GET_ROWS of f32/f16 embeddings run once
per layer per token; f16 results are rounded to nearest even like ggml's conversion. Quantized
destinations and other types stay with the NumPy kernels.
"""

from __future__ import annotations

from rpcnet import _native
from rpcnet.compute.kernels.kernel_table import Step
from rpcnet.compute.kernels.native_args import (
    TensorArg,
    device_threads,
    native_kernel,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import storage
from rpcnet.ggml_types import GgmlType

ELEM = {GgmlType.F32: 4, GgmlType.F16: 2}


def _float_rows(t: Tensor) -> bool:
    return t.type in ELEM and rows_contiguous(t, ELEM[t.type])


def _get_rows_supported(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    if a is None or b is None or b.type != GgmlType.I32 or node.type != GgmlType.F32:
        return False
    if not rows_contiguous(b, 4):
        return False
    if not (_float_rows(a) and _float_rows(node)):
        return False
    if tuple(node.ne) != (a.ne[0], b.ne[0], b.ne[1], b.ne[2]):
        return False
    return a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1


@native_kernel(Op.GET_ROWS, "f32/f16 rows x i32 ids -> f32 (native)", _get_rows_supported)
def get_rows_native(node: Tensor) -> Step:
    a, b = node.src[0], node.src[1]
    assert a is not None and b is not None
    return _native.get_rows_step(
        tensor_arg(a), a.type, tensor_arg(b), tensor_arg(node), device_threads(node)
    )


def _set_rows_supported(node: Tensor) -> bool:
    rows, idx = node.src[0], node.src[1]
    if rows is None or idx is None or idx.type not in (GgmlType.I32, GgmlType.I64):
        return False
    if rows.type != GgmlType.F32 or not _float_rows(rows) or not _float_rows(node):
        return False
    if not rows_contiguous(idx, 8 if idx.type == GgmlType.I64 else 4):
        return False
    if node.ne[0] != rows.ne[0] or node.ne[2] != rows.ne[2] or node.ne[3] != rows.ne[3]:
        return False
    if rows.ne[1] != idx.ne[0] or idx.ne[3] != 1 or idx.ne[1] <= 0 or idx.ne[2] <= 0:
        return False
    return rows.ne[2] % idx.ne[1] == 0 and rows.ne[3] % idx.ne[2] == 0


@native_kernel(Op.SET_ROWS, "f32 rows x i32/i64 ids -> f32/f16 (native)", _set_rows_supported)
def set_rows_native(node: Tensor) -> Step:
    rows, idx = node.src[0], node.src[1]
    assert rows is not None and idx is not None
    return _native.set_rows_step(
        tensor_arg(rows),
        tensor_arg(idx),
        idx.type,
        tensor_arg(node),
        node.type,
        device_threads(node),
    )


def _copy_supported(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    if a is None or not (_float_rows(a) and _float_rows(node)):
        return False
    if tuple(a.ne) != tuple(node.ne) and not _reshaped_contiguous(node, a):
        return False
    # overlapping source and destination (other than exactly in place) need the NumPy copy
    same = node.buffer is a.buffer
    return not same or _disjoint(node, a)


def _contiguous_nb(ne: tuple[int, ...], elem: int) -> tuple[int, ...]:
    nb = [elem]
    for n in ne[:-1]:
        nb.append(nb[-1] * n)
    return tuple(nb)


def _reshaped_contiguous(node: Tensor, a: Tensor) -> bool:
    """A contiguous destination of another shape (CONT_2D of a permuted view): its elements in
    order are the source's in logical row-major order, so it is the source's shape, packed."""
    return node.nelements == a.nelements and tuple(node.nb) == _contiguous_nb(
        tuple(node.ne), ELEM[node.type]
    )


def _dest_arg(node: Tensor, a: Tensor) -> TensorArg:
    if tuple(a.ne) == tuple(node.ne):
        return tensor_arg(node)
    ne = tuple(a.ne)
    return (storage(node), node.offset, ne, _contiguous_nb(ne, ELEM[node.type]))


def _disjoint(a: Tensor, b: Tensor) -> bool:
    return a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset


def _copy(node: Tensor) -> Step:
    a = node.src[0]
    assert a is not None
    return _native.copy_step(
        tensor_arg(a), a.type, _dest_arg(node, a), node.type, device_threads(node)
    )


@native_kernel(Op.CPY, "f32/f16 -> f32/f16, same shape (native)", _copy_supported)
def cpy_native(node: Tensor) -> Step:
    return _copy(node)


@native_kernel(Op.CONT, "f32/f16 -> f32/f16, same shape or packed (native)", _copy_supported)
def cont_native(node: Tensor) -> Step:
    return _copy(node)


@native_kernel(Op.DUP, "f32/f16 -> f32/f16, same shape (native)", _copy_supported)
def dup_native(node: Tensor) -> Step:
    return _copy(node)
