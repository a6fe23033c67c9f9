"""Scalar float formats: F16 (IEEE binary16) and BF16 (brain float), element-wise, as ggml does.

* f16 -> f32 is exact; NaNs come out quiet with their payload kept (ggml's software conversion
  ``ggml_compute_fp16_to_fp32`` and x86 F16C both do that).
* f32 -> f16 rounds to nearest even, overflows to inf and maps *every* NaN to ``sign | 0x7E00``
  (``ggml_compute_fp32_to_fp16``, the conversion behind ``GGML_FP32_TO_FP16`` and
  ``ggml_fp32_to_fp16_row``).
* f32 -> bf16 rounds to nearest even; NaNs are truncated and forced quiet
  (``ggml_compute_fp32_to_bf16``).  bf16 -> f32 is a 16-bit shift.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.quant._common import errstate


def _f16_bits_to_f32_direct(h: Any, xp: Any) -> Any:
    h = xp.ascontiguousarray(h.astype(xp.uint16, copy=False))
    out = h.view(xp.float16).astype(xp.float32)
    mag = h & xp.uint16(0x7FFF)
    is_nan = mag > xp.uint16(0x7C00)
    # Rebuild NaNs explicitly: sign, all-ones exponent, quiet bit, payload shifted into place.
    h32 = h.astype(xp.uint32)
    nan_bits = ((h32 & xp.uint32(0x8000)) << xp.uint32(16)) | xp.uint32(0x7FC00000)
    nan_bits = nan_bits | ((h32 & xp.uint32(0x3FF)) << xp.uint32(13))
    bits = xp.where(is_nan, nan_bits, out.view(xp.uint32))
    return bits.view(xp.float32)


_F16_TABLES: dict[str, Any] = {}


def _f16_table(xp: Any) -> Any:
    key = getattr(xp, "__name__", str(id(xp)))
    table = _F16_TABLES.get(key)
    if table is None:
        table = _f16_bits_to_f32_direct(xp.arange(65536, dtype=xp.uint32).astype(xp.uint16), xp)
        _F16_TABLES[key] = table
    return table


def f16_bits_to_f32(h: Any, xp: Any = np) -> Any:
    """uint16 bit patterns -> float32 values (any shape), via a 64K-entry table."""
    return xp.take(_f16_table(xp), h)


def f32_to_f16_bits(x: Any, xp: Any = np) -> Any:
    """float32 values -> uint16 bit patterns (any shape), bit-exact with GGML_FP32_TO_FP16."""
    x = xp.ascontiguousarray(x, dtype=xp.float32)
    with errstate(xp):
        h = x.astype(xp.float16).view(xp.uint16)
    sign = (x.view(xp.uint32) >> xp.uint32(16)).astype(xp.uint16) & xp.uint16(0x8000)
    return xp.where(xp.isnan(x), sign | xp.uint16(0x7E00), h)


def bf16_bits_to_f32(b: Any, xp: Any = np) -> Any:
    """uint16 bf16 bit patterns -> float32 values (any shape)."""
    bits = xp.ascontiguousarray(b.astype(xp.uint32) << xp.uint32(16))
    return bits.view(xp.float32)


def f32_to_bf16_bits(x: Any, xp: Any = np) -> Any:
    """float32 values -> uint16 bf16 bit patterns, bit-exact with ggml_compute_fp32_to_bf16."""
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    is_nan = (u & xp.uint32(0x7FFFFFFF)) > xp.uint32(0x7F800000)
    nan_bits = (u >> xp.uint32(16)) | xp.uint32(64)
    # u + 0x7fff + lsb cannot wrap for non-NaN inputs (largest is -inf = 0xff800000)
    rounded = (u + (xp.uint32(0x7FFF) + ((u >> xp.uint32(16)) & xp.uint32(1)))) >> xp.uint32(16)
    return xp.where(is_nan, nan_bits, rounded).astype(xp.uint16)


# ---- row codecs used by the registry ---------------------------------------------------------
# ``raw`` is always a flat, contiguous uint8 array here (see registry); hosts are little-endian,
# as ggml's wire format and buffers are.


def dequantize_f32(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    return raw.view(xp.float32).reshape(n_rows, row_elems).copy()


def quantize_f32(x: Any, xp: Any = np) -> Any:
    n_rows = x.shape[0]
    return xp.ascontiguousarray(x.astype(xp.float32)).view(xp.uint8).reshape(n_rows, -1)


def dequantize_f16(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    return f16_bits_to_f32(raw.view(xp.uint16).reshape(n_rows, row_elems), xp)


def quantize_f16(x: Any, xp: Any = np) -> Any:
    n_rows = x.shape[0]
    return f32_to_f16_bits(x, xp).view(xp.uint8).reshape(n_rows, -1)


def dequantize_bf16(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    return bf16_bits_to_f32(raw.view(xp.uint16).reshape(n_rows, row_elems), xp)


def quantize_bf16(x: Any, xp: Any = np) -> Any:
    n_rows = x.shape[0]
    return f32_to_bf16_bits(x, xp).view(xp.uint8).reshape(n_rows, -1)
