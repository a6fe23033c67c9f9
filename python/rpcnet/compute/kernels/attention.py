"""FLASH_ATTN_EXT: softmax(scale · Q·Kᵀ (softcapped) + slope · mask) · V, with sinks and GQA.

Layouts (ggml order): q [DK, n_q, n_head, ne3] f32, k [DK, n_kv, n_head_kv, ne3], v [DV, n_kv,
n_head_v, ne3] (f32/f16/bf16/quantized, usually permuted views of the KV cache), mask f16
[n_kv(+pad), n_q(+pad), 1 or divisor of n_head, ...], sinks f32 [n_head]. The output is
[DV, n_head, n_q, ne3]: heads and query rows are swapped relative to q.

ggml's CPU kernel first converts each q row to the K type's dot-product type (f16 for f16 K,
q8_0/q8_1 for quantized K) unless it takes its f32 tiled path (>= 64 query rows, K and V both
f32 or both f16); the same rounding is applied here so results agree to float32 accuracy. When
V is f16 (and the tiled path is not taken) ggml accumulates softmax·V in an f16 buffer; rpcnet
accumulates in f32, so it is more accurate there and differs from the reference by ~1e-3 of the
output scale (growing with n_kv: ~1e-2 at 1000 kv positions).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute import convert
from rpcnet.compute.kernels.operands import Q8_0_PARTNERS, vec_dot_operand
from rpcnet.compute.kernels.registry import Step, kernel
from rpcnet.compute.kernels.softmax import alibi_slopes, tile_heads, used_mask
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

f32 = np.float32
Q_TILE = 64  # ggml's GGML_FA_TILE_Q
_SCORE_LIMIT = 1 << 24


def _rows_ok(t: Tensor) -> bool:
    _, block, size, _ = _native.type_info(t.type)
    return block > 0 and t.ne[0] % block == 0 and t.nb[0] == size


def _supported(node: Tensor) -> bool:
    src = tuple(node.src) + (None,) * (5 - len(node.src))
    q, k, v, mask, sinks = src[:5]
    if q is None or k is None or v is None or node.type != GgmlType.F32 or q.type != GgmlType.F32:
        return False
    if not (convert.can_load(k.type) and convert.can_load(v.type)):
        return False
    if not (_rows_ok(q) and _rows_ok(k) and _rows_ok(v)):
        return False
    dk, n_q, n_head, n3 = q.ne
    if k.ne[0] != dk or v.ne[1] != k.ne[1] or tuple(node.ne) != (v.ne[0], n_head, n_q, n3):
        return False
    for kv in (k, v):
        if kv.ne[2] <= 0 or kv.ne[3] <= 0 or n_head % kv.ne[2] or n3 % kv.ne[3]:
            return False
    if k.type in Q8_0_PARTNERS and dk % 32:
        return False
    if mask is not None:
        if (
            mask.type not in (GgmlType.F16, GgmlType.F32)
            or mask.ne[0] < k.ne[1]
            or mask.ne[1] < n_q
        ):
            return False
        if mask.ne[2] <= 0 or mask.ne[3] <= 0 or n_head % mask.ne[2] or n3 % mask.ne[3]:
            return False
    elif node.f32(1) > 0.0:
        return False
    if sinks is not None and (sinks.type != GgmlType.F32 or sinks.nelements < n_head):
        return False
    return True  # any precision hint (op_params[3]): accumulation here is always f32


def _expand_heads(x: Any, n3: int, n2: int) -> Any:
    """ggml's repeat broadcast of K/V heads: q head h uses kv head h // (n_head / n_head_kv)."""
    if x.shape[1] != n2:
        x = np.repeat(x, n2 // x.shape[1], axis=1)
    if x.shape[0] != n3:
        x = np.repeat(x, n3 // x.shape[0], axis=0)
    return x


@kernel(Op.FLASH_ATTN_EXT, "f32 q x f32/f16/bf16/quantized k, v (+f16 mask, sinks)", _supported)
def flash_attn_ext(node: Tensor) -> Step:
    src = tuple(node.src) + (None,) * (5 - len(node.src))
    q_t, k_t, v_t, mask_t, sinks_t = src[:5]
    assert q_t is not None and k_t is not None and v_t is not None
    scale = f32(node.f32(0))
    max_bias = node.f32(1)
    softcap = f32(node.f32(2))
    if softcap != 0:
        scale = f32(scale / softcap)
    dk, n_q, n_head, n3 = q_t.ne
    n_kv = k_t.ne[1]
    slopes = alibi_slopes(n_head, max_bias).reshape(1, n_head, 1, 1)
    use_slopes = max_bias > 0.0
    tiled = n_q >= Q_TILE and k_t.type == v_t.type and k_t.type in (GgmlType.F32, GgmlType.F16)
    round_q = not tiled and k_t.type != GgmlType.F32
    out = plain_view(node).transpose(0, 2, 1, 3)  # (ne3, n_head, n_q, DV) view of the output
    qv = plain_view(q_t)
    mask_used = used_mask(mask_t, n_kv, n_q)
    # query rows per block, bounding the score matrix at ~16M floats
    step = max(1, _SCORE_LIMIT // max(1, n3 * n_head * n_kv))

    def run() -> None:
        q = vec_dot_operand(qv, k_t.type) if round_q else qv
        k = convert.load_f32(k_t)
        v = convert.load_f32(v_t)
        if k.shape[0] != n3 or v.shape[0] != n3 or k.shape[1] != v.shape[1]:
            k, v = _expand_heads(k, n3, n_head), _expand_heads(v, n3, n_head)
        groups = k.shape[1]
        per_group = n_head // groups  # q heads sharing one kv head (GQA)
        kt = k.swapaxes(-1, -2)
        m_all = convert.load_f32(mask_used) if mask_used is not None else None
        sk = None
        if sinks_t is not None:
            sk = convert.load_f32(sinks_t).reshape(-1)[:n_head].reshape(1, n_head, 1, 1)
        for c0 in range(0, n_q, step):
            c1 = min(n_q, c0 + step)
            nc = c1 - c0
            qc = q[:, :, c0:c1].reshape(n3, groups, per_group * nc, dk)
            s = np.matmul(qc, kt).reshape(n3, n_head, nc, n_kv)
            s *= scale
            if softcap != 0:
                np.tanh(s, out=s)
                s *= softcap
            if m_all is not None:
                m = tile_heads(m_all[:, :, c0:c1], n3, n_head)
                s += slopes * m if use_slopes else m
            with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
                mx = s.max(axis=-1, keepdims=True)
                if sk is not None:
                    mx = np.maximum(mx, sk)
                mx = np.where(mx == -np.inf, f32(0), mx)  # fully masked rows give zeros
                p = np.exp(s - mx, out=s)
                total = p.sum(axis=-1, keepdims=True)
                if sk is not None:
                    total += np.exp(sk - mx)
                res = np.matmul(p.reshape(n3, groups, per_group * nc, n_kv), v)
                inv = np.where(total == 0, f32(0), f32(1) / total)
                np.multiply(res.reshape(n3, n_head, nc, -1), inv, out=out[:, :, c0:c1])

    return run
