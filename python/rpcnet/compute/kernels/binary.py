"""Element-wise ADD, SUB, MUL, DIV with ggml's repeat-broadcast of src1 over src0.

The NumPy kernel takes f32/f16/bf16; f32 tensors run natively (src1 repeated over src0 by
modulo, as ggml broadcasts), so a decode step's residual adds and norm-weight products need no
NumPy.
"""

from __future__ import annotations

import numpy as np

from rpcnet import _native
from rpcnet.compute import convert
from rpcnet.compute.kernels.common import repeats_into, same_shape, tile_to
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import native_row, rows_contiguous, tensor_arg
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily("binary", cuda=("rpcnet.compute.cuda.kernels.elementwise",))

_UFUNCS = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide}
_NATIVE_OPS = {Op.ADD: 0, Op.SUB: 1, Op.MUL: 2, Op.DIV: 3}  # the native kernel's op codes


def _supported(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    return (
        a is not None
        and b is not None
        and same_shape(a, node)
        and repeats_into(b, a)
        and convert.can_load(a.type)
        and convert.can_load(b.type)
        and convert.can_store(node.type)
    )


@FAMILY.kernel(tuple(_UFUNCS), "f32/f16/bf16 (src1 repeat-broadcast)", _supported)
def binary(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    ufunc = _UFUNCS[Op(node.op)]
    if node.type == a_t.type == b_t.type == GgmlType.F32:
        a, b, out = plain_view(a_t), plain_view(b_t), plain_view(node)

        def run_f32() -> None:
            ufunc(a, tile_to(b, out.shape), out=out)

        return run_f32

    def run_mixed() -> None:
        a = convert.load_f32(a_t)
        b = convert.load_f32(b_t)
        convert.store(node, ufunc(a, tile_to(b, a.shape)))

    return run_mixed


def _overlaps_partially(node: Tensor, src: Tensor) -> bool:
    """Shares bytes with the output without being exactly the output (in place is fine)."""
    if src.buffer is not node.buffer:
        return False
    if src.offset == node.offset and tuple(src.nb) == tuple(node.nb):
        return False
    return not (src.offset + src.nbytes <= node.offset or node.offset + node.nbytes <= src.offset)


def _native_supported(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    if a is None or b is None or not (node.type == a.type == b.type == GgmlType.F32):
        return False
    if not all(rows_contiguous(t, 4) for t in (a, b, node)):
        return False
    if not (same_shape(a, node) and repeats_into(b, a)):
        return False
    return not (_overlaps_partially(node, a) or _overlaps_partially(node, b))


@native_row(FAMILY, tuple(_UFUNCS), "f32 (src1 repeat-broadcast, native)", _native_supported)
def binary_native(node: Tensor, context: BuildContext) -> Step:
    a, b = node.src[0], node.src[1]
    assert a is not None and b is not None
    return _native.binary_step(
        tensor_arg(a), tensor_arg(b), tensor_arg(node), _NATIVE_OPS[Op(node.op)], context.threads
    )
