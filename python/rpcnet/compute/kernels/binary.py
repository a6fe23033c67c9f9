"""Element-wise ADD, SUB, MUL, DIV with ggml's repeat-broadcast of src1 over src0."""

from __future__ import annotations

import numpy as np

from rpcnet.compute import convert
from rpcnet.compute.kernels.common import repeats_into, same_shape, tile_to
from rpcnet.compute.kernels.kernel_table import Step, kernel
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

_UFUNCS = {Op.ADD: np.add, Op.SUB: np.subtract, Op.MUL: np.multiply, Op.DIV: np.divide}


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


def _build(node: Tensor) -> Step:
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


for _op in _UFUNCS:
    kernel(_op, "f32/f16/bf16 (src1 repeat-broadcast)", _supported)(_build)
