"""SOFT_MAX along ne0 with scale, optional mask (ALiBi-sloped when max_bias > 0) and sinks.

The NumPy kernel takes every layout; the native one (ggml's AVX2 vector expf and its float32
chunk sums added in double, so attention without flash attention matches the reference bit for
bit) takes rows the kernel walks by stride.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute import convert
from rpcnet.compute.kernels.floatmath import AVX2_LANES, exp, simd_then_scalar, v_expf
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import (
    ELEM,
    native_row,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.ops import Op
from rpcnet.compute.scratch import logical_f32, used_mask_f32
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily("softmax", cuda=("rpcnet.compute.cuda.kernels.attention",))

f32 = np.float32


def alibi_slopes(n_head: int, max_bias: float) -> Any:
    """Per-head ALiBi slopes as ggml computes them (all 1 when max_bias <= 0), float32 (n_head,)."""
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=f32)
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = f32(2.0 ** float(f32(-f32(max_bias) / f32(n_head_log2))))
    m1 = f32(2.0 ** float(f32(-f32(f32(max_bias) / f32(2.0)) / f32(n_head_log2))))
    out = np.empty(n_head, dtype=f32)
    for h in range(n_head):
        if h < n_head_log2:
            out[h] = f32(float(m0) ** (h + 1))
        else:
            out[h] = f32(float(m1) ** (2 * (h - n_head_log2) + 1))
    return out


def tile_heads(values: Any, n3: int, n2: int) -> Any:
    """Index dims 0, 1 (ggml dims 3, 2) modulo their size: ggml's mask broadcast."""
    m3, m2 = values.shape[0], values.shape[1]
    if m3 not in (1, n3):
        values = values[np.arange(n3) % m3]
    if m2 not in (1, n2):
        values = values[:, np.arange(n2) % m2]
    return values


def used_mask(mask: Tensor | None, ne0: int, ne1: int) -> Tensor | None:
    """The mask narrowed to the columns and rows a kernel reads (it may be padded, or a view
    that repeats rows many times): only those are converted."""
    if mask is None:
        return None
    ne = (min(mask.ne[0], ne0), min(mask.ne[1], ne1), mask.ne[2], mask.ne[3])
    return dataclasses.replace(mask, ne=ne, src=())


def operands_supported(node: Tensor) -> bool:
    """SOFT_MAX's operand types, shapes and mask broadcast, whatever computes it."""
    a = node.src[0]
    mask = node.src[1] if len(node.src) > 1 else None
    sinks = node.src[2] if len(node.src) > 2 else None
    if (
        a is None
        or a.type != GgmlType.F32
        or node.type != GgmlType.F32
        or tuple(node.ne) != tuple(a.ne)
    ):
        return False
    if mask is not None:
        if (
            mask.type not in (GgmlType.F16, GgmlType.F32)
            or mask.ne[0] != a.ne[0]
            or mask.ne[1] < a.ne[1]
        ):
            return False
        if mask.ne[2] <= 0 or mask.ne[3] <= 0 or a.ne[2] % mask.ne[2] or a.ne[3] % mask.ne[3]:
            return False
    elif node.f32(1) > 0.0:
        return False
    if sinks is not None and (sinks.type != GgmlType.F32 or sinks.nelements < a.ne[2]):
        return False
    return True


def _vec_sum(e: Any) -> Any:
    """ggml_vec_soft_max_f32's sum: each 8-lane chunk reduced in float32 ((hi + lo), then
    (0 + 2) + (1 + 3)), the chunk sums and the scalar tail added left to right in double."""
    n = e.shape[-1]
    cut = n - n % AVX2_LANES
    lanes = e[..., :cut].reshape(e.shape[:-1] + (cut // AVX2_LANES, AVX2_LANES))
    half = lanes[..., 4:] + lanes[..., :4]
    chunks = (half[..., 0] + half[..., 2]) + (half[..., 1] + half[..., 3])
    parts = np.concatenate([chunks, e[..., cut:]], axis=-1).astype(np.float64)
    if parts.shape[-1] == 0:
        return np.zeros(e.shape[:-1] + (1,))
    return np.cumsum(parts, axis=-1)[..., -1:]  # sequential, not pairwise


@FAMILY.kernel(Op.SOFT_MAX, "f32 (+f16/f32 mask, f32 sinks)", operands_supported)
def soft_max(node: Tensor, context: BuildContext) -> Step:
    a_t = node.src[0]
    mask_t = node.src[1] if len(node.src) > 1 else None
    sinks_t = node.src[2] if len(node.src) > 2 else None
    assert a_t is not None
    scale = f32(node.f32(0))
    max_bias = node.f32(1)
    n3, n2, n1 = a_t.ne[3], a_t.ne[2], a_t.ne[1]
    slopes = alibi_slopes(n2, max_bias).reshape(1, n2, 1, 1)
    use_slopes = max_bias > 0.0
    av, out = plain_view(a_t), plain_view(node)
    mask_rows = used_mask(mask_t, a_t.ne[0], n1)

    def run() -> None:
        w = av * scale
        if mask_rows is not None:
            m = tile_heads(convert.load_f32(mask_rows), n3, n2)
            w += slopes * m if use_slopes else m
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            mx = w.max(axis=-1, keepdims=True)
            if sinks_t is not None:
                sk = convert.load_f32(sinks_t).reshape(-1)[:n2].reshape(1, n2, 1, 1)
                mx = np.maximum(mx, sk)
            e = simd_then_scalar(w - mx, v_expf, exp)  # ggml_vec_soft_max_f32's exps
            total = _vec_sum(e)
            if sinks_t is not None:
                total += exp(sk - mx).astype(np.float64)
            np.multiply(e, (1.0 / total).astype(f32), out=out)

    return run


def _native_supported(node: Tensor) -> bool:
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


@native_row(FAMILY, Op.SOFT_MAX, "f32 (+f16/f32 mask, f32 sinks) (native)", _native_supported)
def soft_max_native(node: Tensor, context: BuildContext) -> Step:
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
        context.threads,
    )


@FAMILY.scratch_rule(Op.SOFT_MAX)
def _scratch(node: Tensor, limit: int | None) -> int:
    """The scaled and masked scores, their exps and sums, the converted mask rows and sinks."""
    mask = node.src[1] if len(node.src) > 1 else None
    masked = 2 * used_mask_f32(mask, node.ne[0], node.ne[1])
    sinks = logical_f32(node.src[2]) if len(node.src) > 2 else 0
    return sinks + 4 * logical_f32(node) + masked + logical_f32(node.src[0])
