"""RMS_NORM of f32 rows by the native kernel (ggml's double sum and float32 scale)."""

from __future__ import annotations

from rpcnet import _native
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


def _supported(node: Tensor) -> bool:
    x = node.src[0] if node.src else None
    if x is None or x.type != GgmlType.F32 or node.type != GgmlType.F32:
        return False
    return (
        tuple(x.ne) == tuple(node.ne)
        and rows_contiguous(x, 4)
        and rows_contiguous(node, 4)
        and node.f32(0) >= 0.0
    )


@native_kernel(Op.RMS_NORM, "f32 (native)", _supported)
def rms_norm_native(node: Tensor) -> Step:
    x = node.src[0]
    assert x is not None
    return _native.rms_norm_step(tensor_arg(x), tensor_arg(node), node.f32(0), device_threads(node))
