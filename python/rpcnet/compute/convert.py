"""Reading any ggml tensor as float32 and writing float32 results into any destination type."""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.errors import UnsupportedOp
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import (
    PLAIN_DTYPES,
    bf16_to_f32,
    f32_to_bf16,
    plain_view,
    row_bytes_view,
    shape_of,
)
from rpcnet.ggml_types import GgmlType, type_name


def _quant():
    # Imported on first use: the codec tables are only needed for quantized tensors.
    from rpcnet.compute import quant

    return quant


def load_f32(t: Tensor) -> Any:
    """The tensor's values as float32, shape (ne3, ne2, ne1, ne0). A view when already f32."""
    if t.type == GgmlType.F32:
        return plain_view(t)
    if t.type == GgmlType.BF16:
        return bf16_to_f32(plain_view(t))
    if t.type in PLAIN_DTYPES:
        return plain_view(t).astype(np.float32)
    if t.type in _quant().dequantizable_types():
        raw = row_bytes_view(t)
        rows = np.ascontiguousarray(raw).reshape(-1, raw.shape[-1])
        values = _quant().dequantize(t.type, rows, rows.shape[0], t.ne[0])
        return values.reshape(shape_of(t))
    raise UnsupportedOp(f"cannot read {type_name(t.type)} tensors")


def load_weight_f32(t: Tensor) -> Any:
    """Like load_f32, but keeps the float32 copy of quantized/f16/bf16 weights between runs."""
    if t.type == GgmlType.F32 or not t.stable or t.buffer is None:
        return load_f32(t)
    return t.buffer.device.derived.get(t, "f32", lambda: load_f32(t))


def store(t: Tensor, values: Any) -> None:
    """Write float32 (or integer) values, broadcastable to the tensor's shape, into its storage."""
    if t.type == GgmlType.BF16:
        bits = f32_to_bf16(np.broadcast_to(values, shape_of(t)))
        plain_view(t)[...] = bits
        return
    if t.type in PLAIN_DTYPES:
        plain_view(t)[...] = values
        return
    if t.type in _quant().quantizable_types():
        full = np.ascontiguousarray(np.broadcast_to(values, shape_of(t)), dtype=np.float32)
        packed = _quant().quantize_cpu(t.type, full.reshape(-1, t.ne[0]))
        row_bytes_view(t)[...] = packed.reshape(row_bytes_view(t).shape)
        return
    raise UnsupportedOp(f"cannot write {type_name(t.type)} tensors")


def can_load(type_id: int) -> bool:
    return type_id in PLAIN_DTYPES or type_id in _quant().dequantizable_types()


def can_store(type_id: int) -> bool:
    return type_id in PLAIN_DTYPES or type_id in _quant().quantizable_types()
