"""RMS_NORM, NORM, L2_NORM (per row of ne0) and GROUP_NORM (per group of ne2 channels).

Sums are accumulated in float64 and the statistics rounded to float32 at the points where the
ggml CPU kernels do (NORM over rows that are not contiguous sums left to right in float32, as
ggml's strided path does), so results agree with the reference to float32 rounding. RMS_NORM of
f32 rows also runs natively (ggml's double sum and float32 scale).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute.kernels.common import F32, float_io, quiet, reader, same_shape, writer
from rpcnet.compute.kernels.floatmath import ONE
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import native_row, rows_contiguous, tensor_arg
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily(
    "norm",
    cuda=("rpcnet.compute.cuda.kernels.elementwise", "rpcnet.compute.cuda.kernels.array_code"),
)

F64 = np.float64


def _supported(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    return a is not None and same_shape(a, node) and float_io(node, a) and node.f32(0) >= 0.0


def _elsize(t: Tensor) -> int:
    return _native.type_info(t.type)[2]


def _row_sum(x: Any) -> Any:
    return np.sum(x, axis=-1, dtype=F64, keepdims=True)


def _scaled_rows(node: Tensor, row_scale: Callable[[Any], Any]) -> Step:
    """Each row x of the source stored as x * row_scale(x) (float warnings off)."""
    src = node.src[0]
    assert src is not None
    load, store = reader(src), writer(node)

    def run() -> None:
        x = load()
        with quiet():
            store(x * row_scale(x))

    return run


@FAMILY.kernel(Op.RMS_NORM, "f32|f16|bf16", _supported)
def rms_norm(node: Tensor, context: BuildContext) -> Step:
    eps, n = F32(node.f32(0)), node.ne[0]
    return _scaled_rows(node, lambda x: ONE / np.sqrt((_row_sum(x * x) / n).astype(F32) + eps))


@FAMILY.kernel(Op.NORM, "f32|f16|bf16", _supported)
def norm(node: Tensor, context: BuildContext) -> Step:
    src = node.src[0]
    assert src is not None
    load, store = reader(src), writer(node)
    eps, n = F32(node.f32(0)), node.ne[0]
    # ggml sums contiguous rows in double, strided ones (nb0 != 4) in float, left to right
    contiguous = src.nb[0] == _elsize(src) and node.nb[0] == _elsize(node)

    def row_sum(x: Any) -> Any:
        if contiguous:
            return _row_sum(x).astype(F32)
        return np.cumsum(x, axis=-1, dtype=F32)[..., -1:]

    def run() -> None:
        x = load()
        mean = row_sum(x) / F32(n)
        d = x - mean
        if contiguous:
            var = (_row_sum(d * d) / n).astype(F32)
        else:
            var = row_sum(d * d) / F32(n)
        with quiet():
            store(d * (ONE / np.sqrt(var + eps)))

    return run


@FAMILY.kernel(Op.L2_NORM, "f32|f16|bf16", _supported)
def l2_norm(node: Tensor, context: BuildContext) -> Step:
    eps = F32(node.f32(0))
    return _scaled_rows(node, lambda x: ONE / np.fmax(np.sqrt(_row_sum(x * x).astype(F32)), eps))


def _group_norm_ok(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    return a is not None and same_shape(a, node) and float_io(node, a) and node.i32(0) > 0


@FAMILY.kernel(Op.GROUP_NORM, "f32|f16|bf16 (p0 groups over ne2, p1 eps)", _group_norm_ok)
def group_norm(node: Tensor, context: BuildContext) -> Step:
    src = node.src[0]
    assert src is not None
    load, store = reader(src), writer(node)
    n_groups, eps = node.i32(0), F32(node.f32(1))
    n0, n1, channels = node.ne[0], node.ne[1], node.ne[2]
    per_group = (channels + n_groups - 1) // n_groups
    group_of = np.arange(channels) // per_group  # every channel is in exactly one group
    used = int(group_of.max()) + 1
    onehot = (group_of[:, None] == np.arange(used)[None, :]).astype(F64)  # (channels, groups)
    counts = onehot.sum(axis=0) * (n0 * n1)  # elements per group

    def per_channel(stat: Any) -> Any:
        """(ne3, groups) group statistic -> (ne3, channels, 1, 1) per channel."""
        return stat[:, group_of, None, None]

    def run() -> None:
        x = load()
        sums = np.sum(x, axis=(2, 3), dtype=F64)  # (ne3, channels)
        mean = per_channel(((sums @ onehot) / counts).astype(F32))
        d = x - mean
        sq = np.sum(d * d, axis=(2, 3), dtype=F64)
        var = ((sq @ onehot) / counts).astype(F32)
        with quiet():
            scale = per_channel(ONE / np.sqrt(var + eps))
            store(d * scale)

    return run


def _native_supported(node: Tensor) -> bool:
    x = node.src[0] if node.src else None
    if x is None or x.type != GgmlType.F32 or node.type != GgmlType.F32:
        return False
    return (
        tuple(x.ne) == tuple(node.ne)
        and rows_contiguous(x, 4)
        and rows_contiguous(node, 4)
        and node.f32(0) >= 0.0
    )


@native_row(FAMILY, Op.RMS_NORM, "f32 (native)", _native_supported)
def rms_norm_native(node: Tensor, context: BuildContext) -> Step:
    x = node.src[0]
    assert x is not None
    return _native.rms_norm_step(tensor_arg(x), tensor_arg(node), node.f32(0), context.threads)
