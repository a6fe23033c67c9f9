"""MXFP4 (OCP microscaling FP4): 32 e2m1 values sharing one e8m0 exponent.

Layout (17 B): u8 e | u8 qs[16].  Element j < 16 is the low nibble of qs[j], j + 16 the high one.
ggml stores the e2m1 values doubled (``kvalues_mxfp4``) and halves the scale instead:
``x = kvalues[nibble] * e8m0_half(e)`` with ``e8m0_half(e) = 2^(e - 128)`` (exact bit patterns,
including the two subnormal cases e = 0, 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.quant._common import c_float_to_int32, errstate

KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def e8m0_to_f32_half(e: Any, xp: Any = np) -> Any:
    """uint8 exponents -> float32 ``2^(e-128)`` (ggml_e8m0_to_fp32_half)."""
    e32 = e.astype(xp.uint32)
    small = xp.uint32(0x00200000) << xp.minimum(e32, xp.uint32(1))
    normal = (xp.maximum(e32, xp.uint32(1)) - xp.uint32(1)) << xp.uint32(23)
    bits = xp.ascontiguousarray(xp.where(e32 < xp.uint32(2), small, normal))
    return bits.view(xp.float32)


def dequantize_mxfp4(raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    b = raw.reshape(-1, 17)
    d = e8m0_to_f32_half(b[:, 0], xp)[:, None]
    qs = b[:, 1:17]
    idx = xp.concatenate([qs & xp.uint8(0xF), qs >> xp.uint8(4)], axis=1).astype(xp.intp)
    v = xp.asarray(KVALUES_MXFP4, dtype=xp.float32)[idx]
    return (v * d).reshape(n_rows, row_elems)


def _best_index_search(xb: Any, d: Any, xp: Any) -> Any:
    """Literal best_index_mxfp4: first index of the smallest ``|kvalues[i]*d - x|``."""
    table = xp.asarray(KVALUES_MXFP4, dtype=xp.float32)[None, None, :]
    err = xp.abs(table * d - xb[:, :, None])
    err = xp.where(xp.isnan(err), xp.float32(np.inf), err)  # NaN errors never win
    return xp.argmin(err, axis=2).astype(xp.int32)


def quantize_mxfp4(x: Any, xp: Any = np) -> Any:
    """``quantize_row_mxfp4_ref``."""
    n_rows = x.shape[0]
    xb = xp.ascontiguousarray(x, dtype=xp.float32).reshape(-1, 32)
    a = xp.abs(xb)
    amax = xp.max(xp.where(xp.isnan(a), xp.float32(0), a), axis=1)  # NaN never wins `amax < |v|`
    with errstate(xp):
        # log2f is (for these arguments) correctly rounded in glibc: round the double result.
        lg = xp.log2(amax.astype(xp.float64)).astype(xp.float32)
        ev = xp.floor(lg) - xp.float32(2) + xp.float32(127)
    e = xp.where(amax > xp.float32(0), c_float_to_int32(ev, xp) & xp.int32(0xFF), xp.int32(0))
    e = e.astype(xp.uint8)
    d = e8m0_to_f32_half(e, xp)[:, None, None]
    # best_index_mxfp4 picks the first entry with the smallest |k*d - x|.  The table holds
    # 0..12 and their negatives (indices 8..15), so that is the nearest magnitude, ties to the
    # smaller one (lower index), with zero always index 0 and negatives shifted by 8.  Near each
    # decision point the C differences are exact (Sterbenz), so comparing |x| with the midpoints
    # times d gives the same answer.  NaN and +-inf (every error NaN/inf) give index 0.
    mids = xp.asarray([0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0], dtype=xp.float32)[None, None, :] * d
    mag = xp.abs(xb)
    code = (mids < mag[:, :, None]).sum(axis=2, dtype=xp.int32)
    best = xp.where((xb < xp.float32(0)) & (code > 0), code + xp.int32(8), code)
    best = xp.where(xp.isfinite(xb), best, xp.int32(0))
    # An infinite amax makes e undefined in C (x86: 0), so finite x lie far outside the table's
    # range and the rounded errors tie; only the literal search reproduces that.  Rare: redo
    # just those blocks the slow way.
    bad = ~xp.isfinite(amax)
    if bool(bad.any()):
        best[bad] = _best_index_search(xb[bad], d[bad], xp)
    packed = (best[:, :16] | (best[:, 16:] << xp.int32(4))).astype(xp.uint8)
    out = xp.concatenate([e[:, None], packed], axis=1)
    return out.reshape(n_rows, -1)
