"""K-quants (256-element super-blocks): dequantization of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Layouts (ggml-common.h, QK_K = 256):

    q2_K (84 B):  u8 scales[16] | u8 qs[64] | f16 d | f16 dmin
    q3_K (110 B): u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d
    q4_K (144 B): f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
    q5_K (176 B): f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
    q6_K (210 B): u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d

Each dequantizer uses the same float32 operations in the same order as ggml's
``dequantize_row_*`` (e.g. q2_K: ``(d * sc) * q - (dmin * m)``; q6_K: ``(d * sc) * q``), so
results are bit-identical to the C reference compiled without FMA contraction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.quant._common import u16
from rpcnet.compute.quant.simple import f16_bits_to_f32


def _shifts(values: list[int], shape: tuple[int, ...], xp: Any) -> Any:
    return xp.asarray(values, dtype=xp.uint8).reshape(shape)


def _f16(b: Any, off: int, xp: Any) -> Any:
    return f16_bits_to_f32(u16(b, off, xp), xp)


def dequantize_q2_k(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = raw.reshape(-1, 84)
    nb = b.shape[0]
    sc = b[:, 0:16]
    d = _f16(b, 80, xp)[:, None]
    dmin = _f16(b, 82, xp)[:, None]
    dl = d * (sc & xp.uint8(0xF)).astype(xp.float32)  # (nb, 16)
    ml = dmin * (sc >> xp.uint8(4)).astype(xp.float32)
    # out index = h*128 + j*32 + p*16 + l  <-  qs[h*32 + p*16 + l] >> 2j,  scale h*8 + 2j + p
    qs = b[:, 16:80].reshape(nb, 2, 1, 32)
    q = ((qs >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), xp)) & xp.uint8(3)).reshape(nb, 16, 16)
    y = dl[:, :, None] * q.astype(xp.float32) - ml[:, :, None]
    return y.reshape(n_rows, row_elems)


def _q3_k_scales(sb: Any, xp: Any) -> Any:
    """(nb, 12) packed -> (nb, 16) int32 6-bit scales minus 32."""
    nb = sb.shape[0]
    low8 = sb[:, 0:8]
    lows = xp.concatenate([low8 & xp.uint8(0xF), low8 >> xp.uint8(4)], axis=1)  # (nb, 16)
    hi = (sb[:, 8:12].reshape(nb, 1, 4) >> _shifts([0, 2, 4, 6], (1, 4, 1), xp)) & xp.uint8(3)
    s = lows | (hi.reshape(nb, 16) << xp.uint8(4))
    return s.astype(xp.int32) - xp.int32(32)


def dequantize_q3_k(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = raw.reshape(-1, 110)
    nb = b.shape[0]
    d = _f16(b, 108, xp)[:, None]
    dl = d * _q3_k_scales(b[:, 96:108], xp).astype(xp.float32)  # (nb, 16)
    qs = b[:, 32:96].reshape(nb, 2, 1, 32)
    q = (qs >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), xp)) & xp.uint8(3)  # (nb, 2, 4, 32)
    hm = b[:, 0:32].reshape(nb, 1, 1, 32)
    hbit = (hm >> xp.arange(8, dtype=xp.uint8).reshape(1, 2, 4, 1)) & xp.uint8(1)
    v = q.astype(xp.int32) - xp.where(hbit != 0, xp.int32(0), xp.int32(4))
    y = dl[:, :, None] * v.reshape(nb, 16, 16).astype(xp.float32)
    return y.reshape(n_rows, row_elems)


def _k4_scale_min(sb: Any, xp: Any) -> tuple[Any, Any]:
    """get_scale_min_k4 for j = 0..7: (nb, 12) packed -> two (nb, 8) uint8 arrays."""
    a, bb, c = sb[:, 0:4], sb[:, 4:8], sb[:, 8:12]
    six = xp.uint8(63)
    sc = xp.concatenate(
        [a & six, (c & xp.uint8(0xF)) | ((a >> xp.uint8(6)) << xp.uint8(4))], axis=1
    )
    mn = xp.concatenate(
        [bb & six, (c >> xp.uint8(4)) | ((bb >> xp.uint8(6)) << xp.uint8(4))], axis=1
    )
    return sc, mn


def _k4_dequantize(b: Any, q: Any, n_rows: int, row_elems: int, xp: Any) -> Any:
    """Q4_K / Q5_K blocks `b` with their codes `q` (nb, 8, 32): d * scale * q - dmin * min."""
    d = _f16(b, 0, xp)[:, None]
    dmin = _f16(b, 2, xp)[:, None]
    sc, mn = _k4_scale_min(b[:, 4:16], xp)
    d1 = d * sc.astype(xp.float32)
    m1 = dmin * mn.astype(xp.float32)
    y = d1[:, :, None] * q.astype(xp.float32) - m1[:, :, None]
    return y.reshape(n_rows, row_elems)


def dequantize_q4_k(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = raw.reshape(-1, 144)
    qs = b[:, 16:144].reshape(b.shape[0], 4, 1, 32)
    q = ((qs >> _shifts([0, 4], (1, 1, 2, 1), xp)) & xp.uint8(0xF)).reshape(-1, 8, 32)
    return _k4_dequantize(b, q, n_rows, row_elems, xp)


def dequantize_q5_k(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = raw.reshape(-1, 176)
    nb = b.shape[0]
    qs = b[:, 48:176].reshape(nb, 4, 1, 32)
    ql = ((qs >> _shifts([0, 4], (1, 1, 2, 1), xp)) & xp.uint8(0xF)).reshape(nb, 8, 32)
    qh = b[:, 16:48].reshape(nb, 1, 32)
    hb = (qh >> xp.arange(8, dtype=xp.uint8).reshape(1, 8, 1)) & xp.uint8(1)
    return _k4_dequantize(b, ql | (hb << xp.uint8(4)), n_rows, row_elems, xp)


def dequantize_q6_k(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = raw.reshape(-1, 210)
    nb = b.shape[0]
    d = _f16(b, 208, xp)[:, None]
    sc = xp.ascontiguousarray(b[:, 192:208]).view(xp.int8).astype(xp.float32)
    ds = d * sc  # (nb, 16): d * sc[is] first, as in C
    # out index n*128 + 32k + l: ql[64n + 32(k&1) + l] >> 4(k>>1), qh[32n + l] >> 2k
    ql = b[:, 0:128].reshape(nb, 2, 1, 2, 32)
    ql = ((ql >> _shifts([0, 4], (1, 1, 2, 1, 1), xp)) & xp.uint8(0xF)).reshape(nb, 2, 4, 32)
    qh = b[:, 128:192].reshape(nb, 2, 1, 32)
    qh = (qh >> _shifts([0, 2, 4, 6], (1, 1, 4, 1), xp)) & xp.uint8(3)
    q = (ql | (qh << xp.uint8(4))).astype(xp.int32) - xp.int32(32)
    y = ds[:, :, None] * q.reshape(nb, 16, 16).astype(xp.float32)
    return y.reshape(n_rows, row_elems)
