"""SOFT_MAX of f32 rows by the native kernel: ggml's AVX2 vector expf and its float32 chunk sums
added in double, so attention without flash attention matches the reference bit for bit."""

from __future__ import annotations

from rpcnet import _native
from rpcnet.compute.kernels.kernel_table import Step
from rpcnet.compute.kernels.native_args import (
    device_threads,
    native_kernel,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.kernels.softmax import operands_supported
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

ELEM = {GgmlType.F32: 4, GgmlType.F16: 2}


def _supported(node: Tensor) -> bool:
    """`softmax`'s conditions, plus rows the kernel walks by stride and no partial aliasing."""
    if not operands_supported(node):
        return False
    a = node.src[0]
    mask = node.src[1] if len(node.src) > 1 else None
    sinks = node.src[2] if len(node.src) > 2 else None
    assert a is not None
    if not (rows_contiguous(a, 4) and rows_contiguous(node, 4)):
        return False
    if mask is not None and not rows_contiguous(mask, ELEM[mask.type]):
        return False
    if sinks is not None and (sinks.nb[0] != 4 or sinks.ne[1] * sinks.ne[2] * sinks.ne[3] != 1):
        return False
    if node.buffer is a.buffer and node.offset != a.offset:
        return a.offset + a.nbytes <= node.offset or node.offset + node.nbytes <= a.offset
    return node.buffer is not a.buffer or tuple(node.nb) == tuple(a.nb)


@native_kernel(Op.SOFT_MAX, "f32 (+f16/f32 mask, f32 sinks) (native)", _supported)
def soft_max_native(node: Tensor) -> Step:
    a = node.src[0]
    mask = node.src[1] if len(node.src) > 1 else None
    sinks = node.src[2] if len(node.src) > 2 else None
    assert a is not None
    return _native.soft_max_step(
        tensor_arg(a),
        tensor_arg(mask) if mask is not None else None,
        mask.type if mask is not None else GgmlType.F32,
        tensor_arg(sinks) if sinks is not None else None,
        tensor_arg(node),
        node.f32(0),
        node.f32(1),
        device_threads(node),
    )
