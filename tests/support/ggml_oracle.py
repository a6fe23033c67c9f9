"""Independent NumPy versions of ggml's x86 activation quantizers (oracles for the tests).

Written from ggml's definitions (arch/x86/quants.c), never from rpcnet's kernels: the scale is
amax/127 stored as f16 (F16C, nearest even), the multiplier 127/amax, codes rounded to nearest
even (vroundps) and saturated to int8.
"""

from __future__ import annotations

import numpy as np

f32 = np.float32


def q8_x86(x: np.ndarray, with_sum: bool = False):
    """quantize_row_q8_0/1 per 32-block of each row of `x`: (d as f16->f32, codes, s or None)."""
    b = np.asarray(x).reshape(np.asarray(x).shape[0], -1, 32).astype(f32)
    amax = np.abs(b).max(axis=2)
    d = (amax / f32(127)).astype(f32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, f32(127) / amax, f32(0)).astype(f32)
    codes = np.clip(np.rint(b * inv[..., None]), -128, 127).astype(np.int64)
    d16 = d.astype(np.float16).astype(f32)
    s16 = (d * codes.sum(axis=2).astype(f32)).astype(np.float16).astype(f32)
    return d16, codes, (s16 if with_sum else None)


def q8_0_x86_bytes(x: np.ndarray) -> bytes:
    """The q8_0 blocks (f16 d, 32 x int8) that ggml's x86 quantize_row_q8_0 writes for `x`."""
    blocks = np.asarray(x, f32).reshape(1, -1)
    d16, codes, _ = q8_x86(blocks)
    out = np.empty((codes.shape[1], 34), np.uint8)
    out[:, :2] = d16[0].astype(np.float16)[:, None].view(np.uint8)
    out[:, 2:] = codes[0].astype(np.int8).view(np.uint8)
    return out.tobytes()


def q8_0_x86_dequantized(x: np.ndarray) -> np.ndarray:
    """Rows of `x` as ggml's x86 path sees them after quantizing to q8_0 (float32)."""
    d16, codes, _ = q8_x86(x)
    return (d16[..., None] * codes).reshape(np.asarray(x).shape).astype(f32)
