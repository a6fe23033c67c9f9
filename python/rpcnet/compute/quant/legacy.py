"""Legacy 32-element block formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Block layouts (little-endian, ggml-common.h):

    q4_0: f16 d | u8 qs[16]                 x = (nibble - 8) * d
    q4_1: f16 d | f16 m | u8 qs[16]          x = nibble * d + m
    q5_0: f16 d | u32 qh | u8 qs[16]         x = ((nibble | hbit << 4) - 16) * d
    q5_1: f16 d | f16 m | u32 qh | u8 qs[16]  x = (nibble | hbit << 4) * d + m
    q8_0: f16 d | i8 qs[32]                  x = q * d

Element j < 16 lives in the low nibble of qs[j], element j + 16 in its high nibble; bit j of qh is
the fifth bit of element j.  The quantizers follow ``quantize_row_*_ref`` operation by operation in
float32 (including C's float -> int8 truncation as compiled on x86-64 for the NaN/inf cases that
are undefined behaviour in C).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.quant._common import (
    c_float_to_int8,
    c_float_to_int32,
    c_roundf,
    errstate,
    first_absmax,
    first_min_max,
    split_u32,
    u16,
    u32,
)
from rpcnet.compute.quant.simple import f16_bits_to_f32, f32_to_f16_bits

QK = 32


# ---- helpers ---------------------------------------------------------------------------------


def _blocks(raw: Any, type_size: int) -> Any:
    return raw.reshape(-1, type_size)


def _nibbles(qs: Any, xp: Any) -> Any:
    """(nb, 16) packed bytes -> (nb, 32) values 0..15 (low nibbles first), uint8."""
    return xp.concatenate([qs & xp.uint8(0x0F), qs >> xp.uint8(4)], axis=1)


def _high_bits(qh: Any, xp: Any) -> Any:
    """(nb,) uint32 -> (nb, 32) uint8 with bit j of qh in column j, shifted to value 16."""
    shifts = xp.arange(32, dtype=xp.uint32)[None, :]
    return (((qh[:, None] >> shifts) & xp.uint32(1)) << xp.uint32(4)).astype(xp.uint8)


def _pack_nibbles(lo: Any, hi: Any, xp: Any) -> Any:
    """Two (nb, 16) int arrays -> bytes ``lo | hi << 4``, cut to 8 bits as the C stores do."""
    lo = lo.astype(xp.int32) & xp.int32(0xFF)
    hi = hi.astype(xp.int32) & xp.int32(0xFF)
    v = (lo | (hi << xp.int32(4))) & xp.int32(0xFF)
    return v.astype(xp.uint8)


def _inv(d: Any, xp: Any) -> Any:
    """``d ? 1.0f/d : 0.0f`` (NaN is truthy)."""
    with errstate(xp):
        return xp.where(d != xp.float32(0), xp.float32(1) / d, xp.float32(0)).astype(xp.float32)


def _f16_field(d: Any, xp: Any) -> Any:
    """(nb, 1) float32 -> (nb, 2) uint8 of its GGML_FP32_TO_FP16 encoding."""
    h = f32_to_f16_bits(d.reshape(-1), xp)
    return xp.stack(
        [(h & xp.uint16(0xFF)).astype(xp.uint8), (h >> xp.uint16(8)).astype(xp.uint8)], axis=1
    )


def _as_blocks(x: Any, xp: Any) -> Any:
    return xp.ascontiguousarray(x, dtype=xp.float32).reshape(-1, QK)


# ---- dequantizers ----------------------------------------------------------------------------


def dequantize_q4_0(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = _blocks(raw, 18)
    d = f16_bits_to_f32(u16(b, 0, xp), xp)[:, None]
    q = _nibbles(b[:, 2:18], xp).astype(xp.int8) - xp.int8(8)
    return (q.astype(xp.float32) * d).reshape(n_rows, row_elems)


def dequantize_q4_1(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = _blocks(raw, 20)
    d = f16_bits_to_f32(u16(b, 0, xp), xp)[:, None]
    m = f16_bits_to_f32(u16(b, 2, xp), xp)[:, None]
    q = _nibbles(b[:, 4:20], xp).astype(xp.float32)
    return (q * d + m).reshape(n_rows, row_elems)


def dequantize_q5_0(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = _blocks(raw, 22)
    d = f16_bits_to_f32(u16(b, 0, xp), xp)[:, None]
    q = _nibbles(b[:, 6:22], xp) | _high_bits(u32(b, 2, xp), xp)
    q = q.astype(xp.int8) - xp.int8(16)
    return (q.astype(xp.float32) * d).reshape(n_rows, row_elems)


def dequantize_q5_1(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = _blocks(raw, 24)
    d = f16_bits_to_f32(u16(b, 0, xp), xp)[:, None]
    m = f16_bits_to_f32(u16(b, 2, xp), xp)[:, None]
    q = (_nibbles(b[:, 8:24], xp) | _high_bits(u32(b, 4, xp), xp)).astype(xp.float32)
    return (q * d + m).reshape(n_rows, row_elems)


def dequantize_q8_0(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = _blocks(raw, 34)
    d = f16_bits_to_f32(u16(b, 0, xp), xp)[:, None]
    q = xp.ascontiguousarray(b[:, 2:34]).view(xp.int8).astype(xp.float32)
    return (q * d).reshape(n_rows, row_elems)


# ---- quantizers (quantize_row_*_ref) ---------------------------------------------------------


def _symmetric_scale(xb: Any, divisor: float, xp: Any) -> tuple[Any, Any]:
    """q4_0 / q5_0: ``d = max / -divisor`` where max is the first element of largest magnitude."""
    _, vmax = first_absmax(xb, xp)
    with errstate(xp):
        d = (vmax / xp.float32(-divisor)).astype(xp.float32)
    return d, _inv(d, xp)


def _affine_scale(xb: Any, levels: int, xp: Any) -> tuple[Any, Any, Any]:
    """q4_1 / q5_1: ``d = (max - min) / levels``."""
    lo, hi = first_min_max(xb, xp)
    with errstate(xp):
        d = ((hi - lo) / xp.float32(levels)).astype(xp.float32)
    return d, _inv(d, xp), lo


def _scaled(x: Any, idv: Any, offset: float, xp: Any, lo: Any = None) -> Any:
    """``(x - lo) * id + offset`` in f32 (no ``lo``: ``x * id + offset``), as the reference
    computes a code before its integer cast."""
    with errstate(xp):
        return (x if lo is None else x - lo) * idv + xp.float32(offset)


def quantize_q4_0(x: Any, xp: Any = np) -> Any:
    n_rows = x.shape[0]
    xb = _as_blocks(x, xp)
    d, idv = _symmetric_scale(xb, 8.0, xp)
    q = xp.minimum(c_float_to_int8(_scaled(xb, idv, 8.5, xp), xp), xp.int32(15))
    out = xp.concatenate([_f16_field(d, xp), _pack_nibbles(q[:, :16], q[:, 16:], xp)], axis=1)
    return out.reshape(n_rows, -1)


def quantize_q4_1(x: Any, xp: Any = np) -> Any:
    n_rows = x.shape[0]
    xb = _as_blocks(x, xp)
    d, idv, lo = _affine_scale(xb, 15, xp)
    q = xp.minimum(c_float_to_int8(_scaled(xb, idv, 0.5, xp, lo), xp), xp.int32(15))
    out = xp.concatenate(
        [_f16_field(d, xp), _f16_field(lo, xp), _pack_nibbles(q[:, :16], q[:, 16:], xp)], axis=1
    )
    return out.reshape(n_rows, -1)


def _five_bit(q: Any, xp: Any) -> tuple[Any, Any]:
    """(nb, 32) int32 codes (already cut to 8 bits by the uint8 store) -> (qh bytes, qs bytes)."""
    q = q & xp.int32(0xFF)
    qs = _pack_nibbles(q[:, :16] & xp.int32(0xF), q[:, 16:] & xp.int32(0xF), xp)
    bits = ((q >> xp.int32(4)) & xp.int32(1)).astype(xp.uint32)
    weights = xp.uint32(1) << xp.arange(32, dtype=xp.uint32)[None, :]
    qh = (bits * weights).sum(axis=1, dtype=xp.uint32)  # distinct powers of two: sum == or
    return split_u32(qh, xp), qs


def quantize_q5_0(x: Any, xp: Any = np) -> Any:
    n_rows = x.shape[0]
    xb = _as_blocks(x, xp)
    d, idv = _symmetric_scale(xb, 16.0, xp)
    q = xp.minimum(c_float_to_int8(_scaled(xb, idv, 16.5, xp), xp), xp.int32(31))
    qh, qs = _five_bit(q, xp)
    return xp.concatenate([_f16_field(d, xp), qh, qs], axis=1).reshape(n_rows, -1)


def quantize_q5_1(x: Any, xp: Any = np) -> Any:
    n_rows = x.shape[0]
    xb = _as_blocks(x, xp)
    d, idv, lo = _affine_scale(xb, 31, xp)
    # (uint8_t)(x0 + 0.5f): no clamp in the reference
    q = c_float_to_int32(_scaled(xb, idv, 0.5, xp, lo), xp)
    qh, qs = _five_bit(q, xp)
    return xp.concatenate([_f16_field(d, xp), _f16_field(lo, xp), qh, qs], axis=1).reshape(
        n_rows, -1
    )


def _q8_0_amax(xb: Any, xp: Any) -> Any:
    """``amax = MAX(amax, fabsf(v))`` with MAX(a, b) = a > b ? a : b, starting from 0.

    A NaN element resets the running value to NaN and the next element replaces it, so the result
    is the max over the elements after the last NaN, or NaN if the block ends with a NaN.
    """
    n = xb.shape[1]
    pos = xp.arange(n, dtype=xp.int32)[None, :]
    last_nan = xp.max(xp.where(xp.isnan(xb), pos, xp.int32(-1)), axis=1, keepdims=True)
    a = xp.where(pos > last_nan, xp.abs(xb), xp.float32(0))
    amax = xp.max(a, axis=1, keepdims=True)
    return xp.where(last_nan == n - 1, xp.float32(np.nan), amax)


def quantize_q8_0(x: Any, xp: Any = np) -> Any:
    xb = _as_blocks(x, xp)
    d = _q8_0_scale(_q8_0_amax(xb, xp), xp)
    with errstate(xp):
        q = c_float_to_int8(c_roundf(xb * _inv(d, xp), xp), xp)
    return _q8_0_rows(d, q, x.shape[0], xp)


def _q8_0_scale(amax: Any, xp: Any) -> Any:
    """``d = amax / 127`` in f32."""
    with errstate(xp):
        return (amax / xp.float32(127)).astype(xp.float32)


def _q8_0_rows(d: Any, q: Any, n_rows: int, xp: Any) -> Any:
    """Blocks of (f16 d, 32 int8 codes given as int32) as `n_rows` rows of bytes."""
    qs = (q & xp.int32(0xFF)).astype(xp.uint8)
    return xp.concatenate([_f16_field(d, xp), qs], axis=1).reshape(n_rows, -1)


# ---- ggml's x86 AVX/AVX2 quantize_row_q8_0 (arch/x86/quants.c) ------------------------------
#
# What the CPU backend's from_float runs for Q8_0 (SET_ROWS/CPY into a q8_0 KV cache, the q8_0
# activations of Q8_0/Q4_0/... matmuls) on an x86 host with AVX. It differs from the _ref codec
# above: it multiplies by 127/amax (not 1/d), rounds ties to even (vroundps, nearest) instead of
# roundf, and saturates the int32 -> int8 packing.


def _maxps(a: Any, b: Any, xp: Any) -> Any:
    """x86 MAXPS lane rule ``a > b ? a : b``: a NaN in either operand yields ``b``."""
    return xp.where(a > b, a, b)


def _q8_0_amax_avx(xb: Any, xp: Any) -> Any:
    """The AVX reduction of |x| over a block of 32, in its exact lane/tree order (NaN-faithful)."""
    lanes = xp.abs(xb).reshape(-1, 4, 8)  # four __m256 loads of 8 floats
    m = lanes[:, 0]
    for k in (1, 2, 3):
        m = _maxps(m, lanes[:, k], xp)
    m4 = _maxps(m[:, 4:], m[:, :4], xp)  # max(high 128, low 128)
    m2 = _maxps(m4[:, :2], m4[:, 2:], xp)  # max(v, movehl(v))
    return _maxps(m2[:, :1], m2[:, 1:2], xp)  # max_ss(v, movehdup(v)) -> (nb, 1)


def _cvtps_epi32_sat8(v: Any, xp: Any) -> Any:
    """cvtps2dq of integral floats (NaN / out of range -> INT32_MIN), then the signed saturating
    packs to int16 and int8: the int8 code as int32."""
    with errstate(xp):
        ok = (v >= xp.float32(-(2.0**31))) & (v < xp.float32(2.0**31))
        i = xp.where(ok, xp.clip(v, -128.0, 127.0), xp.float32(-128))
    return i.astype(xp.int32)


def quantize_q8_0_x86(x: Any, xp: Any = np) -> Any:
    """Q8_0 as ggml-cpu's AVX/AVX2 ``quantize_row_q8_0`` encodes it."""
    xb = _as_blocks(x, xp)
    amax = _q8_0_amax_avx(xb, xp)
    d = _q8_0_scale(amax, xp)
    with errstate(xp):
        mul = xp.where(amax != xp.float32(0), xp.float32(127) / amax, xp.float32(0))
        v = xp.rint((xb * mul.astype(xp.float32)).astype(xp.float32))  # ties to even
    return _q8_0_rows(d, _cvtps_epi32_sat8(v, xp), x.shape[0], xp)
