"""FLASH_ATTN_EXT: softmax(scale · Q·Kᵀ (softcapped) + slope · mask) · V, with sinks and GQA.

Layouts (ggml order): q [DK, n_q, n_head, ne3] f32, k [DK, n_kv, n_head_kv, ne3], v [DV, n_kv,
n_head_v, ne3] (f32/f16/bf16/quantized, usually permuted views of the KV cache), mask f16
[n_kv(+pad), n_q(+pad), 1 or divisor of n_head, ...], sinks f32 [n_head]. The output is
[DV, n_head, n_q, ne3]: heads and query rows are swapped relative to q.

ggml's CPU kernel first converts each q row to the K type's dot-product type (f16 for f16 K,
q8_0/q8_1 for quantized K) unless it takes its f32 tiled path (>= 64 query rows, K and V both
f32 or both f16); the same rounding is applied here. Outside the tiled path ggml runs an online
softmax over the kv positions in order (ops.cpp ``flash_attn_ext_f16_one_chunk``), accumulating
softmax·V in an f16 buffer when V is f16 (each rescale and each FMA rounded to f16) and in f32
otherwise; ``_online_softmax_v`` replays that order and those roundings (the f16 buffer alone
moves the output by ~1e-3 of its scale). ggml's split-KV decode path (one query row, >= 512 kv,
several threads) and the tiled path are not replayed: they accumulate in f32.

The native kernel (`_native.flash_attn_ext_step`) reads f16 K/V (the KV cache) in place and
follows ggml's CPU path for path: below 64 query rows one row at a time (q rounded to f16,
ggml's f16 dot product, online softmax with the f16 V accumulator, the split-KV decode path for
>= 512 positions); from 64 rows ggml's tiled f32 path (K and V f16 or f32). Its output matches
the reference server's bit for bit where the thread counts match, and it reads only the `n_kv`
positions the graph passes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute import convert, quant
from rpcnet.compute.kernels.copy import block_view
from rpcnet.compute.kernels.floatmath import exp, tanh
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import native_row, tensor_arg
from rpcnet.compute.kernels.operands import Q8_0_PARTNERS, vec_dot_operand
from rpcnet.compute.kernels.softmax import alibi_slopes, tile_heads, used_mask
from rpcnet.compute.ops import Op
from rpcnet.compute.scratch import F32 as F32_BYTES
from rpcnet.compute.scratch import default_bound, logical_f32, used_mask_f32
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType, traits_of

FAMILY = OpFamily("attention", cuda=("rpcnet.compute.cuda.kernels.attention",))

f32 = np.float32
Q_TILE = 64  # ggml's GGML_FA_TILE_Q
SCORE_LIMIT = 1 << 24  # score floats per block of the NumPy kernel
# score floats per block of the tiled (exact softmax) path: 4 MiB, so its passes over the
# scores run from cache instead of DRAM (1.5x faster on a 512 x 1536 x 16-head prompt)
_TILEDSCORE_LIMIT = 1 << 20
_SPLIT_KV_MIN = 512  # ggml's split-KV decode path: one query row and at least this many kv


def _rows_ok(t: Tensor) -> bool:
    _, block, size, _ = _native.type_info(t.type)
    return block > 0 and t.ne[0] % block == 0 and t.nb[0] == size


Operands = tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]


def _operands(node: Tensor) -> Operands | None:
    """(q, k, v, mask, sinks) when FLASH_ATTN_EXT's shapes, broadcasts and types fit, whatever
    computes it."""
    src = tuple(node.src) + (None,) * (5 - len(node.src))
    q, k, v, mask, sinks = src[:5]
    if q is None or k is None or v is None or node.type != GgmlType.F32 or q.type != GgmlType.F32:
        return None
    dk, n_q, n_head, n3 = q.ne
    if k.ne[0] != dk or v.ne[1] != k.ne[1] or tuple(node.ne) != (v.ne[0], n_head, n_q, n3):
        return None
    for kv in (k, v):
        if kv.ne[2] <= 0 or kv.ne[3] <= 0 or n_head % kv.ne[2] or n3 % kv.ne[3]:
            return None
    if mask is not None:
        if (
            mask.type not in (GgmlType.F16, GgmlType.F32)
            or mask.ne[0] < k.ne[1]
            or mask.ne[1] < n_q
        ):
            return None
        if mask.ne[2] <= 0 or mask.ne[3] <= 0 or n_head % mask.ne[2] or n3 % mask.ne[3]:
            return None
    if sinks is not None and (sinks.type != GgmlType.F32 or sinks.nelements < n_head):
        return None
    return q, k, v, mask, sinks


def _supported(node: Tensor) -> bool:
    operands = _operands(node)
    if operands is None:
        return False
    q, k, v = operands[:3]
    if not (convert.can_load(k.type) and convert.can_load(v.type)):
        return False
    if not (_rows_ok(q) and _rows_ok(k) and _rows_ok(v)):
        return False
    # any precision hint (op_params[3]) is fine: accumulation here is always f32
    return k.type not in Q8_0_PARTNERS or q.ne[0] % 32 == 0


def _expand_heads(x: Any, n3: int, n2: int) -> Any:
    """ggml's repeat broadcast of K/V heads: q head h uses kv head h // (n_head / n_head_kv)."""
    if x.shape[1] != n2:
        x = np.repeat(x, n2 // x.shape[1], axis=1)
    if x.shape[0] != n3:
        x = np.repeat(x, n3 // x.shape[0], axis=0)
    return x


@FAMILY.kernel(
    Op.FLASH_ATTN_EXT, "f32 q x f32/f16/bf16/quantized k, v (+f16 mask, sinks)", _supported
)
def flash_attn_ext(node: Tensor, context: BuildContext) -> Step:
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
    plain_kv = k_t.type == v_t.type and k_t.type in (GgmlType.F32, GgmlType.F16)
    tiled = n_q >= Q_TILE and plain_kv
    # ggml splits one query row's kv range over its threads (partials reduced in f32)
    split_kv = plain_kv and n_q == 1 and n3 == 1 and n_kv >= _SPLIT_KV_MIN
    replay = not tiled and not split_kv  # ggml's one-chunk online softmax, replayed
    exact_dot = replay and k_t.type in (GgmlType.F32, GgmlType.F16)
    q8_dot = replay and k_t.type == GgmlType.Q8_0
    round_q = not tiled and k_t.type != GgmlType.F32
    out = plain_view(node).transpose(0, 2, 1, 3)  # (ne3, n_head, n_q, DV) view of the output
    qv = plain_view(q_t)
    mask_used = used_mask(mask_t, n_kv, n_q)
    v_f16 = v_t.type == GgmlType.F16
    # query rows per block, bounding the score matrix at ~16M floats (the lane-exact dot
    # products at ~4M float64 of 32 lanes each)
    limit = SCORE_LIMIT // 128 if exact_dot or q8_dot else SCORE_LIMIT
    if tiled:
        limit = _TILEDSCORE_LIMIT
    step = max(1, limit // max(1, n3 * n_head * n_kv))

    def run() -> None:
        q = vec_dot_operand(qv, k_t.type) if round_q else qv
        k = convert.load_f32(k_t)
        v = convert.load_f32(v_t)
        if k.shape[0] != n3 or v.shape[0] != n3 or k.shape[1] != v.shape[1]:
            k, v = _expand_heads(k, n3, n_head), _expand_heads(v, n3, n_head)
        groups = k.shape[1]
        per_group = n_head // groups  # q heads sharing one kv head (GQA)
        kt = k.swapaxes(-1, -2)
        if q8_dot:
            k_parts = _expand_parts(_q8_0_parts(block_view(k_t)), n3, n_head, k.shape[1])
            q_parts = _q8_0_parts(_quantize_rows_q8_0(qv))
        m_all = convert.load_f32(mask_used) if mask_used is not None else None
        sk = None
        if sinks_t is not None:
            sk = convert.load_f32(sinks_t).reshape(-1)[:n_head].reshape(1, n_head, 1, 1)
        for c0 in range(0, n_q, step):
            c1 = min(n_q, c0 + step)
            nc = c1 - c0
            qc = q[:, :, c0:c1].reshape(n3, groups, per_group * nc, dk)
            if exact_dot:
                s = _vec_dot_avx2(qc, k, k_t.type == GgmlType.F16).reshape(n3, n_head, nc, n_kv)
            elif q8_dot:
                qd, qq = (a[:, :, c0:c1].reshape((n3, groups, per_group * nc) + a.shape[3:])
                          for a in q_parts)  # fmt: skip
                s = _vec_dot_q8_0_avx2((qd, qq), k_parts).reshape(n3, n_head, nc, n_kv)
            else:
                s = np.matmul(qc, kt).reshape(n3, n_head, nc, n_kv)
            s *= scale
            if softcap != 0:
                s = tanh(s) * softcap  # libm tanhf (float64, rounded), not NumPy's float32 tanh
            if m_all is not None:
                m = tile_heads(m_all[:, :, c0:c1], n3, n_head)
                s += slopes * m if use_slopes else m
            if replay:
                scores = s.reshape(n3, groups, per_group * nc, n_kv)
                res = _online_softmax_v(scores, v, v_f16, sk, per_group, nc)
                out[:, :, c0:c1] = res.reshape(n3, n_head, nc, -1)
                continue
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


def _vec_dot_avx2(q: Any, k: Any, f16: bool) -> Any:
    """q (..., rows, DK) · k (..., n_kv, DK) -> (..., rows, n_kv) float32, summed like ggml's
    AVX2 ggml_vec_dot_f16 / _f32: 4 accumulators of 8 lanes, one FMA per 32 elements, the
    REDUCE tree (x0+x2, x1+x3, x0+x1, halves, two hadds), then the leftovers (double for f16,
    float for f32). Inputs are float32 (f16 values for ``f16``)."""
    dk = q.shape[-1]
    main = dk - dk % 32
    acc = None
    for c in range(0, main, 32):
        prod = q[..., :, None, c : c + 32].astype(np.float64) * k[..., None, :, c : c + 32]
        acc = (prod if acc is None else prod + acc).astype(f32)  # fma: one rounding
    if acc is None:
        total = np.zeros(q.shape[:-1] + (k.shape[-2],), np.float64)
    else:
        lanes = acc.reshape(acc.shape[:-1] + (4, 8))
        x0 = (lanes[..., 0, :] + lanes[..., 2, :]) + (lanes[..., 1, :] + lanes[..., 3, :])
        t0 = x0[..., :4] + x0[..., 4:]
        total = ((t0[..., 0] + t0[..., 1]) + (t0[..., 2] + t0[..., 3])).astype(np.float64)
    for i in range(main, dk):
        prod = q[..., :, None, i].astype(np.float64) * k[..., None, :, i]
        if f16:  # sumf (double) += (double)(x*y): the f16 product is exact in float
            total = total + prod.astype(f32)
        else:  # float sumf += x*y, contracted to an FMA
            total = (total.astype(f32) + prod).astype(f32).astype(np.float64)
    return total.astype(f32)


def _quantize_rows_q8_0(x: Any) -> Any:
    """(..., DK) float32 -> raw q8_0 blocks (..., DK / 32, 34) as ggml-cpu converts Q rows."""
    rows = np.ascontiguousarray(x, dtype=f32).reshape(-1, x.shape[-1])
    raw = quant.quantize_cpu(GgmlType.Q8_0, rows)
    return raw.reshape(x.shape[:-1] + (x.shape[-1] // 32, 34))


def _q8_0_parts(blocks: Any) -> tuple[Any, Any]:
    """Raw q8_0 blocks (..., nb, 34) -> (scales (..., nb) float32, codes (..., nb, 8, 4) int32)."""
    d = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0].astype(f32)
    qs = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).astype(np.int32)
    return d, qs.reshape(qs.shape[:-1] + (8, 4))


def _expand_parts(parts: tuple[Any, Any], n3: int, n_head: int, groups: int) -> tuple[Any, Any]:
    """K's q8_0 parts broadcast over heads/streams the way K itself was (``_expand_heads``)."""
    d, qs = parts
    if d.shape[0] == n3 and d.shape[1] == groups:
        return d, qs
    return _expand_heads(d, n3, n_head), _expand_heads(qs, n3, n_head)


def _vec_dot_q8_0_avx2(q: tuple[Any, Any], k: tuple[Any, Any]) -> Any:
    """Q rows · K rows as AVX2 ``ggml_vec_dot_q8_0_q8_0``: per block, 8 int32 lanes of 4
    products (maddubs + madd), ``acc = fma(dK * dQ, lanes, acc)`` in float32, then hsum_float_8.
    q: (..., rows, nb) scales and (..., rows, nb, 8, 4) codes; k likewise with n_kv rows."""
    qd, qq = q
    kd, kq = k
    lanes = np.einsum("...rbla,...kbla->...rkbl", qq, kq)  # exact int32 lane sums
    acc = np.zeros(lanes.shape[:-2] + (8,), f32)
    for b in range(lanes.shape[-2]):
        d = (kd[..., None, :, b] * qd[..., :, None, b]).astype(f32)  # f16*f16: exact
        acc = _fma_f32(d[..., None], lanes[..., b, :].astype(f32), acc)
    half = acc[..., 4:] + acc[..., :4]
    return (half[..., 0] + half[..., 2]) + (half[..., 1] + half[..., 3])


def _fma_f32(a: Any, b: Any, c: Any) -> Any:
    """float32 ``fmaf(a, b, c)`` (x86 FMA: one rounding), via float64 where a*b is exact."""
    return (a.astype(np.float64) * b + c).astype(f32)


def _expf(x: Any) -> Any:
    """libm expf (floatmath.exp; NumPy's float32 exp is a few ulps off)."""
    return exp(np.asarray(x, f32))


def _online_softmax_v(s: Any, v: Any, v_f16: bool, sinks: Any, per_group: int, nc: int) -> Any:
    """ggml's online softmax·V over kv positions in order, with its roundings.

    s: scores (n3, groups, rows, n_kv) f32, -inf where the mask skips a position; v: (n3, groups,
    n_kv, DV) f32 (f16 values when ``v_f16``); sinks: (1, n_head, 1, 1) or None. Returns
    (n3, groups, rows, DV) = softmax(s)·V, with the VKQ buffer f16 when V is f16.
    """
    n3, groups, rows, n_kv = s.shape
    shape = (n3, groups, rows, 1)
    m = np.full(shape, -np.inf, f32)
    total = np.zeros(shape, f32)
    acc = np.zeros((n3, groups, rows, v.shape[-1]), np.float16 if v_f16 else f32)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        for ic in range(n_kv):
            si = s[..., ic : ic + 1]
            active = si != -np.inf  # ggml skips masked positions entirely
            new = active & (si > m)
            m_new = np.where(new, si, m)
            ms = np.where(new, _expf(m - m_new), f32(1))
            vs = np.where(new, f32(1), np.where(active, _expf(si - m_new), f32(0)))
            if new.any():  # V *= ms (ggml_vec_scale_f16/_f32: f32 product, stored back)
                scaled = (acc.astype(f32) * ms).astype(acc.dtype)
                acc = np.where(new, scaled, acc)
            vi = v[:, :, ic : ic + 1, :]
            summed = _fma_f32(vi, vs, acc.astype(f32)).astype(acc.dtype)  # V += v * vs
            acc = np.where(active, summed, acc)
            total = np.where(active, _fma_f32(total, ms, vs), total)  # S = S*ms + vs
            m = m_new
        vkq = acc.astype(f32)
        if sinks is not None:  # one more "position" with score sinks[h] and no value
            sk = np.broadcast_to(sinks, (n3, groups * per_group, nc, 1))
            sk = sk.reshape(n3, groups, rows, 1).astype(f32)
            new = sk > m
            ms = np.where(new, _expf(m - sk), f32(1))
            vs = np.where(new, f32(1), _expf(sk - m))
            vkq = np.where(new, vkq * ms, vkq)
            total = _fma_f32(total, ms, vs)
        inv = np.where(total == 0, f32(0), f32(1) / total)
    return vkq * inv


def _native_supported(node: Tensor) -> bool:
    operands = _operands(node)
    if operands is None:
        return False
    q, k, v, mask, sinks = operands
    n_q, n_head = q.ne[1], q.ne[2]
    kv_types = (GgmlType.F16, GgmlType.F32) if n_q >= Q_TILE else (GgmlType.F16,)
    if k.type != v.type or k.type not in kv_types or q.nb[0] != 4:
        return False
    if k.nb[0] != traits_of(k.type).type_size or v.nb[0] != traits_of(v.type).type_size:
        return False
    if node.nb[0] != 4 or node.nb[1] != 4 * node.ne[0] or node.nb[2] != node.nb[1] * n_head:
        return False
    if node.nb[3] != node.nb[2] * n_q:
        return False
    if mask is not None and (mask.type != GgmlType.F16 or mask.nb[0] != 2):
        return False
    if sinks is not None:
        if sinks.nb[0] != 4 or sinks.ne[0] < n_head or sinks.ne[1] * sinks.ne[2] * sinks.ne[3] != 1:
            return False
    return True


@native_row(
    FAMILY,
    Op.FLASH_ATTN_EXT,
    "f32 q x f16 k, v (f32 too from 64 rows; +f16 mask, sinks) (native)",
    _native_supported,
)
def flash_attn_ext_native(node: Tensor, context: BuildContext) -> Step:
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
        context.threads,
        kv_f32=k.type == GgmlType.F32,
    )


@FAMILY.scratch_rule(Op.FLASH_ATTN_EXT)
def _scratch(node: Tensor, limit: int | None) -> int:
    """The NumPy kernel's temporaries: q rounded, K and V converted (and repeated to n_head heads
    when they broadcast), the mask rows it reads, one score block three times (scores, their
    exp, the mask tile), the result before it is stored."""
    q, k, v = node.src[0], node.src[1], node.src[2]
    mask = node.src[3] if len(node.src) > 3 else None
    if q is None or k is None or v is None:
        return default_bound(node)
    n_head, n3 = q.ne[2], q.ne[3]
    n_kv = k.ne[1]
    row = n3 * n_head * n_kv  # scores of one query row over every head
    rows_per_block = min(q.ne[1], max(1, SCORE_LIMIT // max(1, row)))
    block = row * rows_per_block * F32_BYTES
    expand = 1
    if k.ne[2] != v.ne[2] or k.ne[3] != n3 or v.ne[3] != n3:
        expand = max(1, n_head // max(1, min(k.ne[2], v.ne[2]))) * max(1, n3 // max(1, k.ne[3]))
    kv = (logical_f32(k) + logical_f32(v)) * expand
    masked = 2 * used_mask_f32(mask, n_kv, q.ne[1])
    sinks = logical_f32(node.src[4]) if len(node.src) > 4 else 0
    return sinks + 2 * logical_f32(q) + kv + masked + 3 * block + 2 * logical_f32(node)
