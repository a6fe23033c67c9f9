"""Host-side launchers of the attention kernels (softmax.cu, flash_attn.cu): grid shapes and
argument packing, on the backend's stream (conventions of launch.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.cuda.device import CudaBackend
from rpcnet.compute.cuda.launch import NULL, _launch, f32, i32, i64, row_bytes

FA_WARPS = 4  # RPC_FA_WARPS in flash_attn.cu
_FA_SUFFIX = {"F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}


def soft_max(
    be: CudaBackend,
    x: Any,
    dst: Any,
    scale: float,
    mask: Any | None = None,
    sinks: Any | None = None,
) -> None:
    """x [heads, rows, n] f32 contiguous; mask [rows, n] f32 or f16 (broadcast over heads)."""
    heads, rows, n = x.shape
    mask_type = 0 if mask is None else (1 if mask.dtype == be.cp.float32 else 2)
    fn = be.kernels.function("softmax", "rpc_soft_max_f32")
    strides = (i64(n), i64(n * rows), i64(n * rows * heads))
    args = (
        x,
        NULL if mask is None else mask,
        i32(mask_type),
        NULL if sinks is None else sinks,
        dst,
        i32(n),
        i32(rows),
        i32(heads),
        *strides,
        *strides,
        i64(n),
        i64(0),
        i64(0),
        i32(1),
        i32(1),
        f32(scale),
        f32(0),
        f32(1),
        f32(1),
        i32(1),
    )
    _launch(be, fn, (rows * heads,), (256,), args)


def _fa_warps(v_type: str) -> int:
    """Warps per (query row, head): one for f16 V (the positions in order, as the CPU)."""
    return 1 if v_type == "F16" else FA_WARPS


def _fa_scale(scale: float, softcap: float) -> float:
    """ggml divides the scale by the softcap up front (s = softcap * tanh(dot * scale'))."""
    return float(np.float32(scale) / np.float32(softcap)) if softcap != 0.0 else scale


def flash_attn_views(
    be: CudaBackend,
    kv_types: tuple[str, str],
    ptrs: tuple[Any, Any, Any, Any | None, Any | None, Any],
    dims: tuple[int, int, int, int, int, int, int],
    strides: tuple[int, ...],
    mask_bcast: tuple[int, int],
    scale: float,
    max_bias: float,
    softcap: float,
    q8: Any | None = None,
) -> None:
    """FLASH_ATTN_EXT on ggml views as they are (the KV cache's strided K/V): `ptrs` q, k, v,
    mask (f16) or None, sinks or None, dst; `dims` d, dv, n_q, n_kv, n_head, n_head_kv,
    batches; `strides`: q (floats) x3, k (bytes) x3, v (bytes) x3, mask (halves) x3;
    `mask_bcast`: the mask's ne2, ne3 (broadcast over heads and batches); `q8` (dv a multiple
    of 32): the output also as q8_1 blocks there."""
    if q8 is not None and dims[1] % 32:
        raise ValueError(f"q8_1 output needs dv a multiple of 32, not {dims[1]}")
    d, dv, n_q, n_kv, n_head, n_head_kv, batches = dims
    k_suffix, v_suffix = (_FA_SUFFIX[t] for t in kv_types)
    fn = be.kernels.function("flash_attn", f"rpc_flash_attn_{k_suffix}_{v_suffix}")
    n_head_log2 = 1 << (n_head.bit_length() - 1)  # ggml's ALiBi slopes
    m0 = 2.0 ** (-max_bias / n_head_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_head_log2)
    q, k, v, mask, sinks, dst = ptrs
    args = (
        q,
        k,
        v,
        NULL if mask is None else mask,
        NULL if sinks is None else sinks,
        dst,
        *(i32(x) for x in (d, dv, n_q, n_kv, n_head, n_head_kv)),
        *(i64(s) for s in strides),
        i32(mask_bcast[0]),
        i32(mask_bcast[1]),
        f32(_fa_scale(scale, softcap)),
        f32(max_bias),
        f32(m0),
        f32(m1),
        i32(n_head_log2),
        f32(softcap),
        NULL if q8 is None else q8,
    )
    _launch(be, fn, (n_q, n_head, batches), (32, _fa_warps(kv_types[1])), args)


def flash_attn_decode(
    be: CudaBackend,
    q: Any,
    k: Any,
    v: Any,
    mask: Any | None,
    dst: Any,
    kv_type: str,
    scale: float,
    softcap: float = 0.0,
    sinks: Any | None = None,
    q8: Any | None = None,
) -> None:
    """q [H, n_q, D] f32; k, v [H_kv, n_kv, D] rows of `kv_type` (F16, BF16 or Q8_0); mask f16
    [n_q, n_kv]; dst [n_q, H, D] f32 (ggml's FA output order); `q8`: dst also as q8_1 blocks."""
    heads, n_q, d = q.shape
    kv_heads = int(k.shape[0])
    n_kv = int(k.shape[1])
    rb = row_bytes(kv_type, d)
    suffix = _FA_SUFFIX[kv_type]
    fn = be.kernels.function("flash_attn", f"rpc_flash_attn_{suffix}_{suffix}")
    args = (
        q,
        k,
        v,
        NULL if mask is None else mask,
        NULL if sinks is None else sinks,
        dst,
        i32(d),
        i32(d),
        i32(n_q),
        i32(n_kv),
        i32(heads),
        i32(kv_heads),
        i64(d),
        i64(d * n_q),
        i64(d * n_q * heads),
        i64(rb),
        i64(rb * n_kv),
        i64(0),
        i64(rb),
        i64(rb * n_kv),
        i64(0),
        i64(n_kv),
        i64(0),
        i64(0),
        i32(1),
        i32(1),
        f32(_fa_scale(scale, softcap)),
        f32(0),
        f32(1),
        f32(1),
        i32(1),
        f32(softcap),
        NULL if q8 is None else q8,
    )
    _launch(be, fn, (n_q, heads, 1), (32, _fa_warps(kv_type)), args)


AD_THREADS = 128  # RPC_AD_THREADS in attn_decode.cu
AD_MAX_KV = 4096  # RPC_AD_MAX_KV
AD_MAX_D = 512  # RPC_AD_MAX_D
_AD_SUFFIX = {("F16", "F16"): "f16_f16", ("BF16", "BF16"): "bf16_bf16", ("F32", "F32"): "f32_f32"}


def attn_decode(
    be: CudaBackend,
    kv_types: tuple[str, str],
    ptrs: tuple[Any, Any, Any, Any | None, Any | None, Any, Any | None],
    dims: tuple[int, int, int, int, int, int],
    strides: tuple[int, int, int, int, int, int, int],
    scale: float,
) -> None:
    """ggml's unfused decode attention (K*Q, SOFT_MAX, V*softmax, permuted) as one kernel:
    `ptrs` q (f32), k, v (raw bytes of the cache views), mask (f32 or f16, [n_q, >= n_kv]) or
    None, sinks or None, dst [n_q, H, Dv] f32, q8 (q8_1 blocks of dst) or None; `dims` d, dv,
    n_q, n_kv, n_head, n_head_kv; `strides` q column and head (floats), K position and head
    (bytes), V row and head (bytes), mask row (elements)."""
    d, dv, n_q, n_kv, n_head, n_head_kv = dims
    if kv_types not in _AD_SUFFIX or n_kv > AD_MAX_KV or max(d, dv) > AD_MAX_D:
        raise ValueError(
            f"unfused decode attention takes {sorted(_AD_SUFFIX)} K/V types, "
            f"n_kv <= {AD_MAX_KV} and D <= {AD_MAX_D}"
        )
    q, k, v, mask, sinks, dst, q8 = ptrs
    if q8 is not None and dv % 32:
        raise ValueError(f"q8_1 output needs dv a multiple of 32, not {dv}")
    mask_type = 0 if mask is None else (1 if mask.dtype == np.float32 else 2)
    fn = be.kernels.function("attn_decode", f"rpc_attn_decode_{_AD_SUFFIX[kv_types]}")
    args = (
        q,
        k,
        v,
        NULL if mask is None else mask,
        i32(mask_type),
        NULL if sinks is None else sinks,
        dst,
        NULL if q8 is None else q8,
        *(i32(x) for x in dims),
        *(i64(s) for s in strides),
        f32(scale),
    )
    _launch(be, fn, (n_q, n_head), (AD_THREADS,), args)
