"""Array views of ggml tensors over raw device buffers.

ggml's dim 0 is the fastest; NumPy arrays here use the reversed order (ne3, ne2, ne1, ne0) so the
last axis is contiguous rows, and strides come straight from the client's `nb`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

# Types NumPy can view directly. bf16 is viewed as its raw uint16 bits.
PLAIN_DTYPES: dict[int, np.dtype] = {
    GgmlType.F32: np.dtype(np.float32),
    GgmlType.F16: np.dtype(np.float16),
    GgmlType.I8: np.dtype(np.int8),
    GgmlType.I16: np.dtype(np.int16),
    GgmlType.I32: np.dtype(np.int32),
    GgmlType.I64: np.dtype(np.int64),
    GgmlType.F64: np.dtype(np.float64),
    GgmlType.BF16: np.dtype(np.uint16),
}


def shape_of(t: Tensor) -> tuple[int, int, int, int]:
    """The tensor's NumPy shape: ggml's dims reversed, (ne3, ne2, ne1, ne0)."""
    return (t.ne[3], t.ne[2], t.ne[1], t.ne[0])


def storage(t: Tensor) -> Any:
    """The array a kernel addresses `t` in at `t.offset`: its buffer's, or the window of the
    shared content it lies in (compute/shared_content.py), resolved when the plan is built."""
    buf = t.buffer
    if buf is None:
        raise ComputeError(f"tensor {t.describe()} has no storage on this server")
    if not buf.shares:
        return buf.array
    return buf.resolve(t.offset, t.nbytes)


def plain_view(t: Tensor) -> Any:
    """Strided view of a tensor of a non-quantized type, shape (ne3, ne2, ne1, ne0)."""
    dtype = PLAIN_DTYPES.get(t.type)
    if dtype is None:
        raise ComputeError(f"tensor {t.describe()} is not a plain type")
    buf = storage(t)
    strides = (t.nb[3], t.nb[2], t.nb[1], t.nb[0])
    try:
        return np.ndarray(shape_of(t), dtype=dtype, buffer=buf, offset=t.offset, strides=strides)
    except (TypeError, ValueError) as exc:
        raise ComputeError(f"tensor {t.describe()} does not fit its buffer: {exc}") from exc


def row_bytes_view(t: Tensor) -> Any:
    """Quantized tensor as (ne3, ne2, ne1, row_bytes) uint8; rows must be contiguous blocks."""
    _, block, type_size, _ = _native.type_info(t.type)
    if t.ne[0] % block:
        raise ComputeError(f"tensor {t.describe()}: ne0 not a multiple of the block size {block}")
    row = t.ne[0] // block * type_size
    if t.nb[0] != type_size:
        raise ComputeError(f"tensor {t.describe()}: quantized blocks are not contiguous")
    buf = storage(t)
    shape = (t.ne[3], t.ne[2], t.ne[1], row)
    strides = (t.nb[3], t.nb[2], t.nb[1], 1)
    try:
        return np.ndarray(shape, dtype=np.uint8, buffer=buf, offset=t.offset, strides=strides)
    except (TypeError, ValueError) as exc:
        raise ComputeError(f"tensor {t.describe()} does not fit its buffer: {exc}") from exc


def bf16_to_f32(bits: Any) -> Any:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: Any) -> Any:
    """Round-to-nearest-even like ggml_compute_fp32_to_bf16; NaN is kept quiet."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 64).astype(np.uint16), rounded)
