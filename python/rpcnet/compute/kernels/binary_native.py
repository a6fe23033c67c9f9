"""ADD, SUB, MUL, DIV of f32 tensors by the native kernel (src1 repeated over src0 by modulo,
as ggml broadcasts), so a decode step's residual adds and norm-weight products need no NumPy."""

from __future__ import annotations

from rpcnet import _native
from rpcnet.compute.kernels.common import repeats_into, same_shape
from rpcnet.compute.kernels.kernel_table import Step
from rpcnet.compute.kernels.native_args import (
    device_threads,
    native_kernel,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

_OPS = {Op.ADD: 0, Op.SUB: 1, Op.MUL: 2, Op.DIV: 3}


def _overlaps_partially(node: Tensor, src: Tensor) -> bool:
    """Shares bytes with the output without being exactly the output (in place is fine)."""
    if src.buffer is not node.buffer:
        return False
    if src.offset == node.offset and tuple(src.nb) == tuple(node.nb):
        return False
    return not (src.offset + src.nbytes <= node.offset or node.offset + node.nbytes <= src.offset)


def _supported(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    if a is None or b is None or not (node.type == a.type == b.type == GgmlType.F32):
        return False
    if not all(rows_contiguous(t, 4) for t in (a, b, node)):
        return False
    if not (same_shape(a, node) and repeats_into(b, a)):
        return False
    return not (_overlaps_partially(node, a) or _overlaps_partially(node, b))


def _build(node: Tensor) -> Step:
    a, b = node.src[0], node.src[1]
    assert a is not None and b is not None
    return _native.binary_step(
        tensor_arg(a), tensor_arg(b), tensor_arg(node), _OPS[Op(node.op)], device_threads(node)
    )


for _op in _OPS:
    native_kernel(_op, "f32 (src1 repeat-broadcast, native)", _supported)(_build)
