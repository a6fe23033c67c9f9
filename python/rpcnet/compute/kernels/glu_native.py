"""GLU SWIGLU on f32 rows by the native kernel (ggml's AVX2 SiLU with its vector expf)."""

from __future__ import annotations

from rpcnet import _native
from rpcnet.compute.kernels.kernel_table import Step
from rpcnet.compute.kernels.native_args import (
    device_threads,
    native_kernel,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.ops import Glu, Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType


def _supported(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    b = node.src[1] if len(node.src) > 1 else None
    if (
        a is None
        or node.i32(0) != Glu.SWIGLU
        or a.type != GgmlType.F32
        or node.type != GgmlType.F32
    ):
        return False
    if not (rows_contiguous(a, 4) and rows_contiguous(node, 4)):
        return False
    if tuple(node.ne[1:]) != tuple(a.ne[1:]):
        return False
    if b is None:
        return node.ne[0] * 2 == a.ne[0]
    return (
        b.type == GgmlType.F32
        and rows_contiguous(b, 4)
        and tuple(b.ne) == tuple(a.ne) == tuple(node.ne)
    )


@native_kernel(Op.GLU, "SWIGLU f32 split or fused (native)", _supported)
def swiglu_native(node: Tensor) -> Step:
    a, b = node.src[0], node.src[1] if len(node.src) > 1 else None
    assert a is not None
    nc = node.ne[0]
    if b is not None:
        x, g = tensor_arg(a), tensor_arg(b)
    else:
        swapped = node.i32(1) != 0
        x = tensor_arg(a, offset=4 * nc if swapped else 0, ne0=nc)
        g = tensor_arg(a, offset=0 if swapped else 4 * nc, ne0=nc)
    return _native.swiglu_step(x, g, tensor_arg(node), device_threads(node))
