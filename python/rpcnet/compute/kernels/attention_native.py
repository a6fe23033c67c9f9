"""FLASH_ATTN_EXT fast path: f16 K/V (the KV cache) read in place by the native kernel.

`_native.flash_attn_ext_step` follows ggml's CPU backend path for path: below 64 query rows
one row at a time (q rounded to f16, ggml's f16 dot product, online softmax with the f16 V
accumulator, the split-KV decode path for >= 512 positions); from 64 rows ggml's tiled f32 path
(K and V f16 or f32). Its output matches the reference server's bit for bit where the thread
counts match. It reads only the `n_kv` positions the graph passes, so the cost grows with the
used context, not with the cache size.
"""

from __future__ import annotations

from rpcnet import _native
from rpcnet.compute.kernels.attention import Q_TILE
from rpcnet.compute.kernels.kernel_table import Step
from rpcnet.compute.kernels.native_args import device_threads, native_kernel, tensor_arg
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType, traits_of


def _supported(node: Tensor) -> bool:
    src = tuple(node.src) + (None,) * (5 - len(node.src))
    q, k, v, mask, sinks = src[:5]
    if q is None or k is None or v is None or node.type != GgmlType.F32 or q.type != GgmlType.F32:
        return False
    dk, n_q, n_head, n3 = q.ne
    kv_types = (GgmlType.F16, GgmlType.F32) if n_q >= Q_TILE else (GgmlType.F16,)
    if k.type != v.type or k.type not in kv_types or q.nb[0] != 4:
        return False
    if k.nb[0] != traits_of(k.type).type_size or v.nb[0] != traits_of(v.type).type_size:
        return False
    if k.ne[0] != dk or v.ne[1] != k.ne[1]:
        return False
    if tuple(node.ne) != (v.ne[0], n_head, n_q, n3) or node.nb[0] != 4:
        return False
    if node.nb[1] != 4 * node.ne[0] or node.nb[2] != node.nb[1] * n_head:
        return False
    if node.nb[3] != node.nb[2] * n_q:
        return False
    for t in (k, v):
        if t.ne[2] <= 0 or t.ne[3] <= 0 or n_head % t.ne[2] or n3 % t.ne[3]:
            return False
    if mask is not None:
        if mask.type != GgmlType.F16 or mask.nb[0] != 2 or mask.ne[0] < k.ne[1] or mask.ne[1] < n_q:
            return False
        if mask.ne[2] <= 0 or mask.ne[3] <= 0 or n_head % mask.ne[2] or n3 % mask.ne[3]:
            return False
    if sinks is not None:
        if sinks.type != GgmlType.F32 or sinks.nb[0] != 4 or sinks.ne[0] < n_head:
            return False
        if sinks.ne[1] * sinks.ne[2] * sinks.ne[3] != 1:
            return False
    return True


@native_kernel(
    Op.FLASH_ATTN_EXT,
    "f32 q x f16 k, v (f32 too from 64 rows; +f16 mask, sinks) (native)",
    _supported,
)
def flash_attn_ext_native(node: Tensor) -> Step:
    src = tuple(node.src) + (None,) * (5 - len(node.src))
    q, k, v, mask, sinks = src[:5]
    assert q is not None and k is not None and v is not None
    return _native.flash_attn_ext_step(
        tensor_arg(q),
        tensor_arg(k),
        tensor_arg(v),
        tensor_arg(mask) if mask is not None else None,
        tensor_arg(sinks) if sinks is not None else None,
        tensor_arg(node),
        node.f32(0),
        node.f32(1),
        node.f32(2),
        device_threads(node),
        kv_f32=k.type == GgmlType.F32,
    )
