"""Codec dispatch: ``dequantize`` / ``quantize`` by ggml type id (the ids come from ggml_types)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rpcnet.compute.quant import iquants, kquants, legacy, mxfp4, simple
from rpcnet.compute.quant._common import as_bytes, errstate
from rpcnet.compute.quant.hostisa import host_has_avx
from rpcnet.ggml_types import GgmlType as T
from rpcnet.ggml_types import traits_of, type_name

DequantFn = Callable[..., Any]  # (raw_flat_u8, n_rows, row_elems, xp) -> (n_rows, row_elems) f32
QuantFn = Callable[..., Any]  # (x (n_rows, row_elems) f32, xp) -> (n_rows, row_bytes) u8

_DEQUANT: dict[int, DequantFn] = {
    T.F32: simple.dequantize_f32,
    T.F16: simple.dequantize_f16,
    T.BF16: simple.dequantize_bf16,
    T.Q4_0: legacy.dequantize_q4_0,
    T.Q4_1: legacy.dequantize_q4_1,
    T.Q5_0: legacy.dequantize_q5_0,
    T.Q5_1: legacy.dequantize_q5_1,
    T.Q8_0: legacy.dequantize_q8_0,
    T.Q2_K: kquants.dequantize_q2_k,
    T.Q3_K: kquants.dequantize_q3_k,
    T.Q4_K: kquants.dequantize_q4_k,
    T.Q5_K: kquants.dequantize_q5_k,
    T.Q6_K: kquants.dequantize_q6_k,
    T.IQ4_NL: iquants.dequantize_iq4_nl,
    T.IQ4_XS: iquants.dequantize_iq4_xs,
    T.MXFP4: mxfp4.dequantize_mxfp4,
}

_QUANT: dict[int, QuantFn] = {
    T.F32: simple.quantize_f32,
    T.F16: simple.quantize_f16,
    T.BF16: simple.quantize_bf16,
    T.Q4_0: legacy.quantize_q4_0,
    T.Q4_1: legacy.quantize_q4_1,
    T.Q5_0: legacy.quantize_q5_0,
    T.Q5_1: legacy.quantize_q5_1,
    T.Q8_0: legacy.quantize_q8_0,
    T.IQ4_NL: iquants.quantize_iq4_nl,
    T.MXFP4: mxfp4.quantize_mxfp4,
}

#: ggml-cpu's from_float where it is not the _ref codec: the SIMD variants of this host
_CPU_QUANT: dict[int, QuantFn] = {T.Q8_0: legacy.quantize_q8_0_x86} if host_has_avx() else {}

_DEQUANTIZABLE = frozenset(_DEQUANT)
_QUANTIZABLE = frozenset(_QUANT)


def dequantizable_types() -> frozenset[int]:
    """Type ids ``dequantize`` accepts."""
    return _DEQUANTIZABLE


def quantizable_types() -> frozenset[int]:
    """Type ids ``quantize`` accepts."""
    return _QUANTIZABLE


def block_size(type_id: int) -> int:
    """Elements per block (1 for scalar types). ValueError for removed/unknown ids."""
    return traits_of(type_id).block_size


def type_size(type_id: int) -> int:
    """Bytes per block. ValueError for removed/unknown ids."""
    return traits_of(type_id).type_size


def row_bytes(type_id: int, row_elems: int) -> int:
    """Bytes of one row of ``row_elems`` elements. ValueError if not a whole number of blocks."""
    _, bs, ts, _ = traits_of(type_id)
    if row_elems < 0 or row_elems % bs:
        raise ValueError(
            f"{type_name(type_id)}: row of {row_elems} elements is not a multiple of "
            f"the block size {bs}"
        )
    return row_elems // bs * ts


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
    return _encode(_QUANT, type_id, x, xp)


def quantize_cpu(type_id: int, x: Any, xp: Any = np) -> Any:
    """Like ``quantize``, but as ggml's CPU backend converts at run time on this host
    (``type_traits_cpu[type].from_float``: CPY, SET_ROWS, matmul activations). On x86 with AVX
    Q8_0 follows arch/x86 ``quantize_row_q8_0``; every other type is the _ref codec there."""
    return _encode({**_QUANT, **_CPU_QUANT}, type_id, x, xp)


def _encode(table: dict[int, QuantFn], type_id: int, x: Any, xp: Any) -> Any:
    fn = table.get(type_id)
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
