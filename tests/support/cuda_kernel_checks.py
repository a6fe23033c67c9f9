"""Kernel checks shared by the CUDA kernel tests: the real launchers of compute/cuda run a
kernel on `be`, and the result is compared with a float64 NumPy oracle. `xp` makes the device
arrays: CuPy on a GPU (tests/test_cuda_gpu.py), the emulator's backend on the CPU
(tests/test_cuda_emulated.py). Sizes are the caller's; the oracles and bounds are these."""

from __future__ import annotations

from typing import Any

import numpy as np

from support.cuda_quant import flash_attn_oracle

GLU_ORACLES = {
    0: lambda a, b: np.maximum(a, 0) * b,
    1: lambda a, b: 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * a * (1 + 0.044715 * a * a))) * b,
    2: lambda a, b: a / (1 + np.exp(-a)) * b,  # SWIGLU
    4: lambda a, b: a / (1 + np.exp(-1.702 * a)) * b,
}


def check_rms_norm(be: Any, xp: Any, rows: int, width: int) -> None:
    """RMS_NORM, alone and with its weight multiplied in (the fused MUL)."""
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(6)
    x = rng.standard_normal((rows, width)).astype(np.float32)
    wt = rng.standard_normal(width).astype(np.float32)
    eps = 1e-6
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + eps)
    out, fused = xp.zeros(x.shape, np.float32), xp.zeros(x.shape, np.float32)
    launch.rms_norm(be, xp.asarray(x), out, eps)
    launch.rms_norm(be, xp.asarray(x), fused, eps, weight=xp.asarray(wt))
    be.synchronize()
    np.testing.assert_allclose(xp.asnumpy(out), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(xp.asnumpy(fused), want * wt, rtol=1e-5, atol=1e-6)


def check_rope(be: Any, xp: Any, mode: int) -> None:
    """ROPE, normal (0) or NeoX (2), on 96 of 128 dims, positions up to 4095."""
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(8)
    tokens, heads, d, n_dims, base = 5, 3, 128, 96, 10000.0
    x = rng.standard_normal((tokens, heads, d)).astype(np.float32)
    pos = np.array([0, 1, 7, 300, 4095], np.int32)
    k = np.arange(n_dims // 2)
    theta = pos[:, None].astype(np.float64) * base ** (-2.0 * k / n_dims)  # ggml: p * base^(-2k/n)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    want = x.astype(np.float64).copy()
    if mode == 0:
        a, b = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        want[..., 0:n_dims:2], want[..., 1:n_dims:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., : n_dims // 2], x[..., n_dims // 2 : n_dims]
        want[..., : n_dims // 2], want[..., n_dims // 2 : n_dims] = a * c - b * s, a * s + b * c
    out = xp.zeros(x.shape, np.float32)
    launch.rope_neox_or_normal(be, xp.asarray(x), xp.asarray(pos), out, n_dims, mode, base)
    be.synchronize()
    # Angles are float32 (as in ggml): one ulp of p * base^(-2k/n) is ~1.2e-7 * p radians, so
    # the tolerance grows with the position (strict for small ones, where mode bugs would show).
    tol = (1e-5 + 2e-6 * pos.astype(np.float64))[:, None, None]
    assert np.all(np.abs(xp.asnumpy(out) - want) <= tol)


def check_glu(be: Any, xp: Any, op: int, width: int) -> None:
    """GLU `op` (a key of GLU_ORACLES) of 6 rows of `width`."""
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(op)
    a = (rng.standard_normal((6, width)) * 3).astype(np.float32)
    b = rng.standard_normal((6, width)).astype(np.float32)
    out = xp.zeros(a.shape, np.float32)
    launch.glu(be, xp.asarray(a), xp.asarray(b), out, op)
    be.synchronize()
    want = GLU_ORACLES[op](a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(xp.asnumpy(out), want, rtol=1e-5, atol=1e-6)


def check_binary_broadcast(be: Any, xp: Any, op: str) -> None:
    """ADD/SUB/MUL/DIV with the second operand repeated over dims 3 and 1, into a contiguous
    and a transposed (non-contiguous) destination."""
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(15)
    a = rng.standard_normal((2, 3, 5, 64)).astype(np.float32)
    b = rng.uniform(0.5, 2, (1, 3, 1, 64)).astype(np.float32)
    want = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide}[op](a, b)
    out = xp.zeros(a.shape, np.float32)
    a_dev = xp.asarray(a)
    launch.binary(be, op, a_dev, xp.asarray(b), out)
    out_t = xp.zeros((64, 5, 3, 2), np.float32).transpose(3, 2, 1, 0)
    launch.binary(be, op, a_dev, xp.asarray(b), out_t)
    be.synchronize()
    np.testing.assert_array_equal(xp.asnumpy(out), want)
    np.testing.assert_array_equal(xp.asnumpy(out_t), want)


def check_flash_attn_decode(
    be: Any, xp: Any, kv_type: str, softcap: float, heads: int, n_kv: int, hidden: np.ndarray
) -> None:
    """FLASH_ATTN_EXT of n_q = len(hidden) queries over `n_kv` positions of a K/V cache of
    `kv_type` (quantized by gguf), GQA (2 KV heads), sinks, and the positions `hidden` masked."""
    import gguf
    from gguf.quants import quantize
    from rpcnet.compute.cuda import launch_attention

    rng = np.random.default_rng(10)
    kv_heads, n_q, d = 2, hidden.shape[0], 128
    q = rng.standard_normal((heads, n_q, d)).astype(np.float32)
    kf = rng.standard_normal((kv_heads, n_kv, d)).astype(np.float32)
    vf = rng.standard_normal((kv_heads, n_kv, d)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kv_type]
    k_raw, v_raw = quantize(kf, qtype), quantize(vf, qtype)  # gguf's own quantizer
    mask = np.where(hidden, -np.inf, 0).astype(np.float16)
    sinks = rng.standard_normal(heads).astype(np.float32)
    scale = 1 / np.sqrt(d)
    want = flash_attn_oracle(q, k_raw, v_raw, kv_type, kf.shape, mask, scale, softcap, sinks)
    out = xp.zeros((n_q, heads, d), np.float32)
    launch_attention.flash_attn_decode(
        be,
        xp.asarray(q),
        xp.asarray(np.ascontiguousarray(k_raw)),
        xp.asarray(np.ascontiguousarray(v_raw)),
        xp.asarray(mask),
        out,
        kv_type,
        scale,
        softcap,
        xp.asarray(sinks),
    )
    be.synchronize()
    # f16 V: an f16 sum can round the other way after a last-bit difference of a dot product
    tol = 2e-3 if kv_type == "F16" else 1e-4
    np.testing.assert_allclose(xp.asnumpy(out), want, rtol=tol, atol=tol * 1e-1)


def gguf_dequant(type_name: str, raw: np.ndarray, n: int) -> np.ndarray:
    """Rows of raw `type_name` blocks decoded by the independent `gguf` package: [rows, n]."""
    import gguf
    from gguf.quants import dequantize

    out = dequantize(np.ascontiguousarray(raw), gguf.GGMLQuantizationType[type_name])
    return np.asarray(out, np.float32).reshape(raw.shape[0], n)
