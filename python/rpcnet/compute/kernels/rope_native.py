"""ROPE (normal and neox modes, f32) by the native kernel, with ggml's float32 angle recurrence,
YaRN ramp and fused rotation; multi-section and vision modes stay with the NumPy kernel."""

from __future__ import annotations

from rpcnet import _native
from rpcnet.compute.kernels.kernel_table import Step
from rpcnet.compute.kernels.native_args import (
    device_threads,
    native_kernel,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.kernels.rope import NEOX, NORMAL, RopeParams
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType


def _supported(node: Tensor) -> bool:
    x, pos = node.src[0], node.src[1]
    ff = node.src[2] if len(node.src) > 2 else None
    if x is None or pos is None or pos.type != GgmlType.I32 or not rows_contiguous(pos, 4):
        return False
    if x.type != GgmlType.F32 or node.type != GgmlType.F32 or tuple(node.ne) != tuple(x.ne):
        return False
    if not (rows_contiguous(x, 4) and rows_contiguous(node, 4)):
        return False
    p = RopeParams(node)
    if p.mode not in (NORMAL, NEOX) or not p.valid(node) or pos.nelements != x.ne[2]:
        return False
    if ff is not None and (ff.type != GgmlType.F32 or ff.ne[0] < p.n_rot or ff.nb[0] != 4):
        return False
    # an in-place rope whose views do not coincide exactly would read rotated values
    if node.buffer is not x.buffer or _disjoint(node, x):
        return True
    return node.offset == x.offset and tuple(node.nb) == tuple(x.nb)


def _disjoint(a: Tensor, b: Tensor) -> bool:
    return a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset


@native_kernel(Op.ROPE, "f32 x i32 positions (+f32 freq factors), normal/neox (native)", _supported)
def rope_native(node: Tensor) -> Step:
    x, pos = node.src[0], node.src[1]
    ff = node.src[2] if len(node.src) > 2 else None
    assert x is not None and pos is not None
    p = RopeParams(node)
    params = (
        p.n_dims,
        p.mode,
        p.n_ctx_orig,
        p.n_offs,
        p.freq_base,
        p.freq_scale,
        p.ext_factor,
        p.attn_factor,
        p.beta_fast,
        p.beta_slow,
    )
    return _native.rope_step(
        tensor_arg(x),
        tensor_arg(pos),
        tensor_arg(ff) if ff is not None else None,
        tensor_arg(node),
        params,
        device_threads(node),
    )
