"""ggml type table and codec dispatch: ``dequantize`` / ``quantize`` by ggml type id."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rpcnet.compute.quant import iquants, kquants, legacy, mxfp4, simple
from rpcnet.compute.quant._common import as_bytes, errstate

# ggml type ids (spec Appendix A)
F32 = 0
F16 = 1
Q4_0 = 2
Q4_1 = 3
Q5_0 = 6
Q5_1 = 7
Q8_0 = 8
Q8_1 = 9
Q2_K = 10
Q3_K = 11
Q4_K = 12
Q5_K = 13
Q6_K = 14
Q8_K = 15
IQ2_XXS = 16
IQ2_XS = 17
IQ3_XXS = 18
IQ1_S = 19
IQ4_NL = 20
IQ3_S = 21
IQ2_S = 22
IQ4_XS = 23
I8 = 24
I16 = 25
I32 = 26
I64 = 27
F64 = 28
IQ1_M = 29
BF16 = 30
TQ1_0 = 34
TQ2_0 = 35
MXFP4 = 39
NVFP4 = 40
Q1_0 = 41
Q2_0 = 42

GGML_TYPE_COUNT = 43

# id -> (name, block size in elements, bytes per block); removed ids are absent.
TYPE_TRAITS: dict[int, tuple[str, int, int]] = {
    F32: ("f32", 1, 4),
    F16: ("f16", 1, 2),
    Q4_0: ("q4_0", 32, 18),
    Q4_1: ("q4_1", 32, 20),
    Q5_0: ("q5_0", 32, 22),
    Q5_1: ("q5_1", 32, 24),
    Q8_0: ("q8_0", 32, 34),
    Q8_1: ("q8_1", 32, 36),
    Q2_K: ("q2_K", 256, 84),
    Q3_K: ("q3_K", 256, 110),
    Q4_K: ("q4_K", 256, 144),
    Q5_K: ("q5_K", 256, 176),
    Q6_K: ("q6_K", 256, 210),
    Q8_K: ("q8_K", 256, 292),
    IQ2_XXS: ("iq2_xxs", 256, 66),
    IQ2_XS: ("iq2_xs", 256, 74),
    IQ3_XXS: ("iq3_xxs", 256, 98),
    IQ1_S: ("iq1_s", 256, 50),
    IQ4_NL: ("iq4_nl", 32, 18),
    IQ3_S: ("iq3_s", 256, 110),
    IQ2_S: ("iq2_s", 256, 82),
    IQ4_XS: ("iq4_xs", 256, 136),
    I8: ("i8", 1, 1),
    I16: ("i16", 1, 2),
    I32: ("i32", 1, 4),
    I64: ("i64", 1, 8),
    F64: ("f64", 1, 8),
    IQ1_M: ("iq1_m", 256, 56),
    BF16: ("bf16", 1, 2),
    TQ1_0: ("tq1_0", 256, 54),
    TQ2_0: ("tq2_0", 256, 66),
    MXFP4: ("mxfp4", 32, 17),
    NVFP4: ("nvfp4", 64, 36),
    Q1_0: ("q1_0", 128, 18),
    Q2_0: ("q2_0", 64, 18),
}

DequantFn = Callable[..., Any]  # (raw_flat_u8, n_rows, row_elems, xp) -> (n_rows, row_elems) f32
QuantFn = Callable[..., Any]  # (x (n_rows, row_elems) f32, xp) -> (n_rows, row_bytes) u8

_DEQUANT: dict[int, DequantFn] = {
    F32: simple.dequantize_f32,
    F16: simple.dequantize_f16,
    BF16: simple.dequantize_bf16,
    Q4_0: legacy.dequantize_q4_0,
    Q4_1: legacy.dequantize_q4_1,
    Q5_0: legacy.dequantize_q5_0,
    Q5_1: legacy.dequantize_q5_1,
    Q8_0: legacy.dequantize_q8_0,
    Q2_K: kquants.dequantize_q2_k,
    Q3_K: kquants.dequantize_q3_k,
    Q4_K: kquants.dequantize_q4_k,
    Q5_K: kquants.dequantize_q5_k,
    Q6_K: kquants.dequantize_q6_k,
    IQ4_NL: iquants.dequantize_iq4_nl,
    IQ4_XS: iquants.dequantize_iq4_xs,
    MXFP4: mxfp4.dequantize_mxfp4,
}

_QUANT: dict[int, QuantFn] = {
    F32: simple.quantize_f32,
    F16: simple.quantize_f16,
    BF16: simple.quantize_bf16,
    Q4_0: legacy.quantize_q4_0,
    Q4_1: legacy.quantize_q4_1,
    Q5_0: legacy.quantize_q5_0,
    Q5_1: legacy.quantize_q5_1,
    Q8_0: legacy.quantize_q8_0,
    IQ4_NL: iquants.quantize_iq4_nl,
    MXFP4: mxfp4.quantize_mxfp4,
}

_DEQUANTIZABLE = frozenset(_DEQUANT)
_QUANTIZABLE = frozenset(_QUANT)


def dequantizable_types() -> frozenset[int]:
    """Type ids ``dequantize`` accepts."""
    return _DEQUANTIZABLE


def quantizable_types() -> frozenset[int]:
    """Type ids ``quantize`` accepts."""
    return _QUANTIZABLE


def type_name(type_id: int) -> str:
    t = TYPE_TRAITS.get(type_id)
    return t[0] if t else f"type#{type_id}"


def block_size(type_id: int) -> int:
    """Elements per block (1 for scalar types). ValueError for removed/unknown ids."""
    return _traits(type_id)[1]


def type_size(type_id: int) -> int:
    """Bytes per block. ValueError for removed/unknown ids."""
    return _traits(type_id)[2]


def row_bytes(type_id: int, row_elems: int) -> int:
    """Bytes of one row of ``row_elems`` elements. ValueError if not a whole number of blocks."""
    _, bs, ts = _traits(type_id)
    if row_elems < 0 or row_elems % bs:
        raise ValueError(
            f"{type_name(type_id)}: row of {row_elems} elements is not a multiple of "
            f"the block size {bs}"
        )
    return row_elems // bs * ts


def _traits(type_id: int) -> tuple[str, int, int]:
    t = TYPE_TRAITS.get(type_id)
    if t is None:
        raise ValueError(f"unknown or removed ggml type id {type_id}")
    return t


def dequantize(type_id: int, raw: Any, n_rows: int, row_elems: int, xp: Any = np) -> Any:
    """Decode ``n_rows`` consecutive rows of ``row_elems`` elements to float32 (n_rows, row_elems).

    ``raw`` is a uint8 array (any shape, e.g. (n_rows, row_bytes)) or bytes-like object holding
    exactly ``n_rows * row_bytes(type_id, row_elems)`` bytes.  The result is a new array.
    """
    fn = _DEQUANT.get(type_id)
    if fn is None:
        raise ValueError(f"cannot dequantize {type_name(type_id)}")
    rb = row_bytes(type_id, row_elems)
    flat = as_bytes(raw, xp)
    if flat.size != n_rows * rb:
        raise ValueError(
            f"{type_name(type_id)}: expected {n_rows} x {rb} bytes for {n_rows} rows of "
            f"{row_elems}, got {flat.size}"
        )
    if n_rows == 0 or row_elems == 0:
        return xp.zeros((n_rows, row_elems), dtype=xp.float32)
    with errstate(xp):  # inf * 0 etc. in arbitrary blocks is expected, not an error
        return fn(flat, n_rows, row_elems, xp)


def quantize(type_id: int, x: Any, xp: Any = np) -> Any:
    """Encode float32 rows ``x`` of shape (n_rows, row_elems) -> uint8 (n_rows, row_bytes).

    Bit-exact with ggml's ``quantize_row_*_ref`` / ``ggml_fp32_to_fp16_row`` /
    ``ggml_fp32_to_bf16_row_ref`` applied row by row.  A 1-D ``x`` is treated as one row.
    """
    fn = _QUANT.get(type_id)
    if fn is None:
        raise ValueError(f"cannot quantize to {type_name(type_id)}")
    x = xp.asarray(x)
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        raise ValueError(f"quantize expects (n_rows, row_elems), got shape {tuple(x.shape)}")
    n_rows, row_elems = x.shape
    rb = row_bytes(type_id, row_elems)
    if n_rows == 0 or row_elems == 0:
        return xp.zeros((n_rows, rb), dtype=xp.uint8)
    x = xp.ascontiguousarray(x, dtype=xp.float32)
    with errstate(xp):
        return fn(x, xp)
