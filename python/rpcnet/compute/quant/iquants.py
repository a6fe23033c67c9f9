"""Non-linear 4-bit formats: IQ4_NL (32-element blocks) and IQ4_XS (256-element super-blocks).

Layouts (ggml-common.h):

    iq4_nl (18 B):  f16 d | u8 qs[16]                          x = d * kvalues[nibble]
    iq4_xs (136 B): f16 d | u16 scales_h | u8 scales_l[4] | u8 qs[128]
                    sub-block ib (32 elems): ls = low4(scales_l, ib) | 2 bits of scales_h << 4,
                    x = (d * (ls - 32)) * kvalues[nibble]

The IQ4_NL quantizer reproduces ``quantize_row_iq4_nl_ref`` (the CPU backend's from_float for
IQ4_NL, hence what SET_ROWS/CPY write): ``ntry = -1`` (no scale search), weights ``x*x``, one
least-squares refinement of the scale with the sums accumulated sequentially in float32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.quant._common import errstate, first_absmax, prefix_max, u16
from rpcnet.compute.quant.simple import f16_bits_to_f32, f32_to_f16_bits

KVALUES_IQ4NL = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

GROUP_MAX_EPS = np.float32(1e-15)

# Nibble stored for blocks whose codes the reference leaves undefined (an all-(near-)zero block at
# the start of a row keeps whatever was on the C stack); 8 -> +1, so it decodes to +0.0 with d = 0.
_UNDEFINED_NIBBLE = 8


def _kvalues(xp: Any) -> Any:
    return xp.asarray(KVALUES_IQ4NL, dtype=xp.float32)


def _nibbles32(qs: Any, xp: Any) -> Any:
    """(..., 16) packed -> (..., 32) nibble indices, low nibbles first."""
    return xp.concatenate([qs & xp.uint8(0xF), qs >> xp.uint8(4)], axis=-1)


def dequantize_iq4_nl(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = raw.reshape(-1, 18)
    d = f16_bits_to_f32(u16(b, 0, xp), xp)[:, None]
    v = _kvalues(xp)[_nibbles32(b[:, 2:18], xp).astype(xp.intp)]
    return (d * v).reshape(n_rows, row_elems)


def dequantize_iq4_xs(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = raw.reshape(-1, 136)
    nb = b.shape[0]
    d = f16_bits_to_f32(u16(b, 0, xp), xp)[:, None]
    sh = u16(b, 2, xp)[:, None]  # (nb, 1)
    sl = b[:, 4:8]
    low = xp.stack([sl & xp.uint8(0xF), sl >> xp.uint8(4)], axis=-1).reshape(nb, 8)
    high = (sh >> (xp.arange(8, dtype=xp.uint16) * xp.uint16(2))[None, :]) & xp.uint16(3)
    ls = low.astype(xp.int32) | (high.astype(xp.int32) << xp.int32(4))
    dl = d * (ls - xp.int32(32)).astype(xp.float32)  # (nb, 8)
    idx = _nibbles32(b[:, 8:136].reshape(nb, 8, 16), xp).astype(xp.intp)  # (nb, 8, 32)
    y = dl[:, :, None] * _kvalues(xp)[idx]
    return y.reshape(n_rows, row_elems)


# Decision points between neighbouring table entries (exact half-integers in float32).
_MIDPOINTS_IQ4NL = tuple(
    (a + b) / 2 for a, b in zip(KVALUES_IQ4NL[:-1], KVALUES_IQ4NL[1:], strict=True)
)


def best_index_iq4nl(v: Any, xp: Any = np) -> Any:
    """``best_index_int8(16, kvalues_iq4nl, v)``: nearest table entry, ties to the upper one.

    C compares ``v - val[k-1] < val[k] - v`` in float32.  Near a decision point both differences
    are exact (|v| >= 4.5 there, table entries are integers), so the comparison equals
    ``v < midpoint`` and the index is the number of midpoints <= v.  Values beyond the ends clamp;
    NaN gives 15, as the C binary search (every comparison false) does.
    """
    mids = xp.asarray(_MIDPOINTS_IQ4NL, dtype=xp.float32)
    idx = xp.searchsorted(mids, v, side="right")
    return xp.where(xp.isnan(v), 15, idx).astype(xp.int32)


def quantize_iq4_nl(x: Any, xp: Any = np) -> Any:
    n_rows = x.shape[0]
    xb = xp.ascontiguousarray(x, dtype=xp.float32).reshape(n_rows, -1, 32)
    nblk = xb.shape[1]
    table = _kvalues(xp)
    amax, vmax = first_absmax(xb, xp)  # (n_rows, nblk, 1)
    skip = (amax < GROUP_MAX_EPS)[..., 0]  # (n_rows, nblk)
    with errstate(xp):
        d0 = (vmax / xp.float32(-127)).astype(xp.float32)
        id0 = (xp.float32(1) / d0).astype(xp.float32)
        codes = best_index_iq4nl(id0 * xb, xp)  # (n_rows, nblk, 32)
        q = table[codes]
        w = xb * xb
        wq = w * q
        sumqx = xp.zeros(xb.shape[:2], dtype=xp.float32)
        sumq2 = xp.zeros(xb.shape[:2], dtype=xp.float32)
        for j in range(32):  # sequential float32 sums, as the C loop
            sumqx = sumqx + wq[..., j] * xb[..., j]
            sumq2 = sumq2 + wq[..., j] * q[..., j]
        d = xp.where(sumq2 > xp.float32(0), sumqx / sumq2, xp.float32(0)).astype(xp.float32)
    d = xp.where(skip, xp.float32(0), d)
    # Blocks below GROUP_MAX_EPS are skipped by the reference without writing their codes, so they
    # inherit the codes of the previous quantized block of the same row (the shared L buffer).
    pos = xp.arange(nblk, dtype=xp.int64)[None, :]
    src = prefix_max(xp.where(skip, xp.int64(-1), pos), xp)  # (n_rows, nblk)
    have = src >= 0
    src = xp.where(have, src, 0)
    gather = xp.broadcast_to(src[..., None].astype(xp.intp), codes.shape)
    codes = xp.take_along_axis(codes, gather, axis=1)
    codes = xp.where(have[..., None], codes, xp.int32(_UNDEFINED_NIBBLE))
    packed = (codes[..., :16] | (codes[..., 16:] << xp.int32(4))).astype(xp.uint8)
    h = f32_to_f16_bits(d, xp)
    dh = xp.stack(
        [(h & xp.uint16(0xFF)).astype(xp.uint8), (h >> xp.uint16(8)).astype(xp.uint8)], axis=-1
    )
    out = xp.concatenate([dh, packed], axis=-1)  # (n_rows, nblk, 18)
    return out.reshape(n_rows, -1)
