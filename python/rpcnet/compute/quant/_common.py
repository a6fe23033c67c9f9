"""Shared helpers for the block codecs.

Everything here is written against an array module ``xp`` (NumPy by default) and only uses
operations CuPy also provides, so the codecs can run on either.  Multi-byte block fields are
assembled from single bytes with shifts instead of ``.view`` on strided slices, which keeps the
code independent of memory layout and byte order of the host.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

QK_K = 256  # super-block size of the K-quants and IQ4_XS

_INT32_MIN = -(2**31)
_TWO31 = float(2**31)


def errstate(xp: Any):
    """Silence floating-point warnings (overflow/invalid) where the array module supports it."""
    fn = getattr(xp, "errstate", None)
    if fn is None:
        return contextlib.nullcontext()
    return fn(all="ignore")


def as_bytes(raw: Any, xp: Any) -> Any:
    """Any bytes-like object or array -> flat, contiguous uint8 array of module ``xp``."""
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = np.frombuffer(raw, dtype=np.uint8)
    arr = xp.asarray(raw)
    if arr.dtype != xp.uint8:
        arr = xp.ascontiguousarray(arr).view(xp.uint8)
    return xp.ascontiguousarray(arr).reshape(-1)


def u16(blocks: Any, off: int, xp: Any) -> Any:
    """Little-endian uint16 field at byte ``off`` of every block (rows of a 2-D uint8 array)."""
    lo = blocks[:, off].astype(xp.uint16)
    hi = blocks[:, off + 1].astype(xp.uint16)
    return lo | (hi << xp.uint16(8))


def u32(blocks: Any, off: int, xp: Any) -> Any:
    """Little-endian uint32 field at byte ``off`` of every block."""
    out = blocks[:, off].astype(xp.uint32)
    for k in range(1, 4):
        out = out | (blocks[:, off + k].astype(xp.uint32) << xp.uint32(8 * k))
    return out


def split_u32(v: Any, xp: Any) -> Any:
    """uint32 array (n,) -> uint8 array (n, 4), little-endian."""
    v = v.astype(xp.uint32)
    parts = [((v >> xp.uint32(8 * k)) & xp.uint32(0xFF)).astype(xp.uint8) for k in range(4)]
    return xp.stack(parts, axis=-1)


def c_float_to_int32(v: Any, xp: Any) -> Any:
    """C float -> int conversion as compiled on x86-64 (cvttss2si / cvttps2dq).

    Truncates toward zero; NaN and out-of-range inputs (undefined behaviour in C) give INT32_MIN,
    which is what the hardware returns.  Result dtype int32.
    """
    with errstate(xp):
        t = xp.trunc(v.astype(xp.float32))
        ok = (t >= xp.float32(-_TWO31)) & (t < xp.float32(_TWO31))
        t = xp.where(ok, t, xp.float32(0))
        return xp.where(ok, t.astype(xp.int32), xp.int32(_INT32_MIN))


def c_float_to_int8(v: Any, xp: Any) -> Any:
    """``(int8_t) v`` for a float ``v``: x86 conversion to int32, then keep the low byte (int32)."""
    low = c_float_to_int32(v, xp) & xp.int32(0xFF)
    return (low ^ xp.int32(0x80)) - xp.int32(0x80)


def c_roundf(v: Any, xp: Any) -> Any:
    """C ``roundf``: round half away from zero, exact in float32 (NaN/inf pass through)."""
    with errstate(xp):
        t = xp.trunc(v)
        frac = v - t  # exact: |frac| < 1 and t, v share sign and binade range
        step = xp.where(xp.abs(frac) >= xp.float32(0.5), xp.sign(v), xp.float32(0))
        return (t + step).astype(xp.float32)


def first_absmax(x: Any, xp: Any) -> tuple[Any, Any]:
    """Per row of ``x`` (…, n): the sequential C search

        amax = 0; max = 0;
        for v in row: if (amax < fabsf(v)) { amax = fabsf(v); max = v; }

    NaNs never win (comparisons with NaN are false); ties keep the first element; an all-zero row
    leaves ``max = +0.0``.  Returns (amax, max) with keepdims.
    """
    a = xp.abs(x)
    a = xp.where(xp.isnan(a), xp.float32(0), a)
    idx = xp.argmax(a, axis=-1)[..., None]
    amax = xp.take_along_axis(a, idx, axis=-1)
    vmax = xp.take_along_axis(x, idx, axis=-1)
    vmax = xp.where(amax > xp.float32(0), vmax, xp.float32(0))
    return amax, vmax


def first_min_max(x: Any, xp: Any) -> tuple[Any, Any]:
    """Per row, the C loop

        min = FLT_MAX; max = -FLT_MAX;
        for v in row: { if (v < min) min = v; if (v > max) max = v; }

    NaNs are skipped, ties keep the first element (matters for the sign of a zero).  keepdims.
    """
    flt_max = xp.float32(np.finfo(np.float32).max)
    lo_src = xp.where(xp.isnan(x), xp.float32(np.inf), x)
    hi_src = xp.where(xp.isnan(x), xp.float32(-np.inf), x)
    lo = xp.take_along_axis(lo_src, xp.argmin(lo_src, axis=-1)[..., None], axis=-1)
    hi = xp.take_along_axis(hi_src, xp.argmax(hi_src, axis=-1)[..., None], axis=-1)
    lo = xp.where(lo < flt_max, lo, flt_max)
    hi = xp.where(hi > -flt_max, hi, -flt_max)
    return lo, hi


def prefix_max(v: Any, xp: Any) -> Any:
    """Running maximum along the last axis (Hillis-Steele doubling; only where/maximum/slicing)."""
    v = v.copy()
    n = v.shape[-1]
    shift = 1
    while shift < n:
        shifted = xp.maximum(v[..., shift:], v[..., :-shift])
        v[..., shift:] = shifted
        shift *= 2
    return v
