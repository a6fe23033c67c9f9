"""cuda builders of attention: SOFT_MAX and FLASH_ATTN_EXT (the CUDA C decode kernel, and
the array-code fallback)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

from rpcnet import _native
from rpcnet.compute.cuda.kernels import common
from rpcnet.compute.kernels.kernel_table import NATIVE, Step
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

# ---------------------------------------------------------------------------------- attention


def _attention_launchers() -> Any:
    from rpcnet.compute.cuda import launch_attention  # at build time only (it imports CuPy's side)

    return launch_attention


def _soft_max_ok(node: Tensor) -> bool:
    x = common._f32_source(node)
    if x is None:
        return False
    mask = node.src[1] if len(node.src) > 1 else None
    sinks = node.src[2] if len(node.src) > 2 else None
    n, rows, heads = x.ne[0], x.ne[1], x.ne[2]
    if (
        x.ne[3] != 1
        or not (common._contiguous(x) and common._contiguous(node))
        or node.f32(1) != 0.0
    ):
        return False
    if mask is not None and not (
        mask.buffer is not None
        and mask.type in (common.F32, common.F16)
        and mask.ne[0] == n
        and mask.ne[1] >= rows
        and mask.ne[2] == mask.ne[3] == 1
        and common._contiguous(mask)
    ):
        return False
    return sinks is None or (
        sinks.buffer is not None and sinks.type == common.F32 and sinks.ne[0] == heads
    )


@common.cuda_kernel(
    Op.SOFT_MAX, "f32 [n, rows, heads], f32|f16 mask, sinks (no ALiBi)", _soft_max_ok
)
def cuda_soft_max(node: Tensor) -> Step:
    x_t = node.src[0]
    assert x_t is not None
    mask_t = node.src[1] if len(node.src) > 1 else None
    sinks_t = node.src[2] if len(node.src) > 2 else None
    be, launch_attention = common._backend(node), _attention_launchers()
    shape = (node.ne[2], node.ne[1], node.ne[0])
    x, dst, scale = common._view(x_t, shape), common._view(node, shape), node.f32(0)
    mask = None if mask_t is None else common._view(mask_t, (mask_t.ne[1], mask_t.ne[0]))
    sinks = None if sinks_t is None else common._view(sinks_t, (sinks_t.ne[0],))
    return lambda: launch_attention.soft_max(be, x, dst, scale, mask, sinks)


def _fa_srcs(node: Tensor) -> tuple[Tensor | None, ...]:
    return (tuple(node.src) + (None,) * 5)[:5]


def _fa_operands(
    node: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None] | None:
    """(q, k, v, mask, sinks) of an f32 FLASH_ATTN_EXT whose operands all live in buffers."""
    q, k, v, mask, sinks = _fa_srcs(node)
    if q is None or k is None or v is None or node.type != common.F32 or q.type != common.F32:
        return None
    if any(t is not None and t.buffer is None for t in (q, k, v, mask, sinks)):
        return None
    return q, k, v, mask, sinks


def _fa_check(fits: Callable[..., bool]) -> Callable[[Tensor], bool]:
    """A FLASH_ATTN_EXT predicate: fits(node, q, k, v, mask, sinks) where _fa_operands has them."""

    @functools.wraps(fits)
    def ok(node: Tensor) -> bool:
        parts = _fa_operands(node)
        return parts is not None and fits(node, *parts)

    return ok


@_fa_check
def _fa_ok(
    node: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sinks: Tensor | None
) -> bool:
    dk, n_q, n_head, n3 = q.ne
    n_kv = k.ne[1]
    return (
        k.type in (common.F32, common.F16)
        and v.type in (common.F32, common.F16)
        and n3 == k.ne[3] == v.ne[3] == 1
        and k.ne[0] == dk
        and v.ne[1] == n_kv
        and node.ne == (v.ne[0], n_head, n_q, 1)
        and 0 < k.ne[2] == v.ne[2]
        and n_head % k.ne[2] == 0
        and common._contiguous(node)
        and node.f32(1) == 0.0  # no ALiBi
        and (
            mask is None
            or (
                mask.type in (common.F16, common.F32)
                and mask.ne[0] >= n_kv
                and mask.ne[1] >= n_q
                and mask.ne[2] == mask.ne[3] == 1
            )
        )
        and (
            sinks is None
            or (sinks.type == common.F32 and common._contiguous(sinks) and sinks.ne[0] >= n_head)
        )
    )


_FA_KV = {common.F16: "F16", common.BF16: "BF16", GgmlType.Q8_0: "Q8_0"}
FA_DECODE_MAX_Q = 32  # query rows per head for the CUDA C kernel (one block each)
FA_MAX_HEAD = 512  # 32 lanes x RPC_FA_PER_LANE in flash_attn.cu


@_fa_check
def _fa_decode_ok(
    node: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, sinks: Tensor | None
) -> bool:
    """The CUDA C decode kernel: f16, bf16 or q8_0 K/V views as the cache lays them out, f16
    mask."""
    d, n_q, n_head, batches = q.ne
    return (
        (_FA_KV.get(k.type), _FA_KV.get(v.type)) in common.FA_KV_PAIRS
        and q.nb[0] == 4
        and all(q.nb[i] % 4 == 0 for i in (1, 2, 3))
        and k.nb[0] == _native.type_info(k.type)[2]  # blocks (or halves) contiguous along D
        and v.nb[0] == _native.type_info(v.type)[2]
        and d % _native.type_info(k.type)[1] == 0
        and v.ne[0] % _native.type_info(v.type)[1] == 0
        and 1 <= n_q <= FA_DECODE_MAX_Q
        and d <= FA_MAX_HEAD
        and v.ne[0] <= FA_MAX_HEAD
        and k.ne[0] == d
        and v.ne[1] == k.ne[1]
        and 0 < k.ne[2] == v.ne[2]
        and n_head % k.ne[2] == 0
        and k.ne[3] == v.ne[3] == batches
        and batches <= 65535
        and node.ne == (v.ne[0], n_head, n_q, batches)
        and common._contiguous(node)
        and (
            mask is None
            or (
                mask.type == common.F16
                and mask.nb[0] == 2
                and all(mask.nb[i] % 2 == 0 for i in (1, 2, 3))
                and mask.ne[0] >= k.ne[1]
                and mask.ne[1] >= n_q
                and mask.ne[2] > 0
                and mask.ne[3] > 0
            )
        )
        and (
            sinks is None
            or (sinks.type == common.F32 and common._contiguous(sinks) and sinks.ne[0] >= n_head)
        )
    )


@common.cuda_kernel(
    Op.FLASH_ATTN_EXT,
    "f32 q x f16|bf16|q8_0 k, v views, n_q<=32 (+f16 mask, ALiBi, softcap, sinks, GQA; CUDA C)",
    _fa_decode_ok,
    priority=NATIVE,
)
def cuda_flash_attn_decode(node: Tensor) -> Step:
    q_t, k_t, v_t, mask_t, sinks_t = _fa_srcs(node)
    assert q_t is not None and k_t is not None and v_t is not None
    be, launch_attention = common._backend(node), _attention_launchers()
    d, n_q, n_head, batches = q_t.ne
    kv_types = (_FA_KV[GgmlType(k_t.type)], _FA_KV[GgmlType(v_t.type)])
    ptrs = (
        common._view(q_t),
        common._raw(k_t),
        common._raw(v_t),
        None if mask_t is None else common._raw(mask_t),
        None if sinks_t is None else common._view(sinks_t),
        common._view(node),
    )
    dims = (d, v_t.ne[0], n_q, k_t.ne[1], n_head, k_t.ne[2], batches)
    strides = (
        *(q_t.nb[i] // 4 for i in (1, 2, 3)),
        *(k_t.nb[i] for i in (1, 2, 3)),
        *(v_t.nb[i] for i in (1, 2, 3)),
        *((0, 0, 0) if mask_t is None else (mask_t.nb[i] // 2 for i in (1, 2, 3))),
    )
    bcast = (1, 1) if mask_t is None else (mask_t.ne[2], mask_t.ne[3])
    scale, max_bias, softcap = node.f32(0), node.f32(1), node.f32(2)
    request = _offer_q8_1(node, be)

    def run() -> None:
        q8 = request[1] if request is not None and request[0].block == 32 else None
        launch_attention.flash_attn_views(
            be, kv_types, ptrs, dims, strides, bcast, scale, max_bias, softcap, q8
        )

    return run


def _offer_q8_1(node: Tensor, be: Any) -> tuple[common.QuantizeRequest, Any] | None:
    """Offer the decode product that reads the output (the attention projection) its q8_1
    blocks, written by the attention kernel itself (heads are whole 32-blocks)."""
    dv, n_rows = node.ne[0], node.ne[1] * node.ne[2] * node.ne[3]
    if dv % 32 or n_rows > common.MATVEC_MAX_COLS * node.ne[1] or not common._contiguous(node):
        return None
    return common.offer_quantized(be, node, (32,), writes=1)


@common.xp_fallback(
    Op.FLASH_ATTN_EXT,
    "f32 q x f32/f16 k, v (+mask, softcap, sinks, GQA; xp: batched matmuls)",
    _fa_ok,
)
def cuda_flash_attn_xp(node: Tensor) -> Step:
    """softmax(scale·Q·Kᵀ (softcapped) + mask)·V with the array module, on the cache's own
    strided views (no contiguous K/V needed): three batched products, f32 accumulation."""
    q_t, k_t, v_t, mask_t, sinks_t = _fa_srcs(node)
    assert q_t is not None and k_t is not None and v_t is not None
    be = common._backend(node)
    dk, n_q, n_head, _ = q_t.ne
    n_kv = k_t.ne[1]
    scale, softcap = node.f32(0), node.f32(2)
    if softcap != 0:
        scale /= softcap
    q, k, v = common._view(q_t)[0], common._view(k_t)[0], common._view(v_t)[0]  # (heads, rows, d)
    mask = None if mask_t is None else common._view(mask_t)[0, 0, :n_q, :n_kv]
    sinks = None if sinks_t is None else common._view(sinks_t, (sinks_t.ne[0],))[:n_head]
    out = common._view(node)[0]  # (n_q, n_head, dv)
    rep = n_head // k_t.ne[2]
    half_k = k_t.type == common.F16

    def run() -> None:
        xp = be.cp
        f32 = xp.float32
        quiet = getattr(xp, "errstate", None)
        with be.device, be.stream, quiet(all="ignore") if quiet else contextlib.nullcontext():
            kf, vf = k.astype(f32), v.astype(f32)
            if rep > 1:
                kf, vf = xp.repeat(kf, rep, axis=0), xp.repeat(vf, rep, axis=0)
            # f16 K: Q rounded to f16 first, as ggml's CPU kernel converts it for its dot
            qf = q.astype(xp.float16).astype(f32) if half_k else q.astype(f32)
            s = xp.matmul(qf, kf.swapaxes(-1, -2)) * f32(scale)
            if softcap != 0:
                s = xp.tanh(s) * f32(softcap)
            if mask is not None:
                s = s + mask.astype(f32)[None]
            mx = s.max(axis=-1, keepdims=True)
            sk = None if sinks is None else sinks.astype(f32).reshape(n_head, 1, 1)
            if sk is not None:
                mx = xp.maximum(mx, sk)
            mx = xp.where(mx == -xp.inf, f32(0), mx)  # fully masked rows give zeros
            p = xp.exp(s - mx)
            total = p.sum(axis=-1, keepdims=True)
            if sk is not None:
                total = total + xp.exp(sk - mx)
            res = xp.matmul(p, vf)
            res = xp.where(total == 0, f32(0), res / total)
            out[...] = res.transpose(1, 0, 2)

    return run
