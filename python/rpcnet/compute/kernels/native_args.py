"""Arguments of the native step builders (`_native.*_step`): tensors as raw buffer spans."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rpcnet.compute.kernels.kernel_table import NATIVE, ContextBuilder, OpFamily, Predicate
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import storage
from rpcnet.ggml_types import GgmlType

TensorArg = tuple[Any, int, tuple[int, ...], tuple[int, ...]]
ELEM = {GgmlType.F32: 4, GgmlType.F16: 2}  # bytes per element of the float row kernels' types

# RPCNET_NATIVE_OPS=0 leaves the non-matmul ops to the NumPy kernels (for comparisons).
ENABLED = os.environ.get("RPCNET_NATIVE_OPS", "1") != "0"
# The native row kernels work in place on the buffers; what they allocate is a few rows of
# accumulators per thread, far below this.
ROW_SCRATCH = 1 << 20


def native_row(
    family: OpFamily, ops: int | tuple[int, ...], types: str, supports: Predicate
) -> Callable[[ContextBuilder], ContextBuilder]:
    """Declare a native row kernel of `family`, unless the native ops are switched off."""
    return family.kernel(
        ops, types, supports, NATIVE, lambda node, limit: ROW_SCRATCH, enabled=ENABLED
    )


def tensor_arg(t: Tensor, offset: int = 0, ne0: int | None = None) -> TensorArg:
    """(buffer bytes, offset of element 0, ne, nb); `offset`/`ne0` select a column range."""
    ne = tuple(t.ne) if ne0 is None else (ne0, *t.ne[1:])
    return (storage(t), t.offset + offset, ne, tuple(t.nb))


def rows_contiguous(t: Tensor, elem: int) -> bool:
    """Elements of a row are adjacent (ggml's nb[0] == type size)."""
    return t.nb[0] == elem


def float_rows(t: Tensor) -> bool:
    """An f32 or f16 tensor whose rows are contiguous."""
    return t.type in ELEM and rows_contiguous(t, ELEM[t.type])


def disjoint(a: Tensor, b: Tensor) -> bool:
    """The two tensors' byte ranges do not overlap (whatever their buffers)."""
    return a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset


def f32_rows(t: Tensor | None, dtype: int = GgmlType.F32) -> bool:
    """A tensor of `dtype` (4-byte elements) whose rows are contiguous."""
    return t is not None and t.type == dtype and rows_contiguous(t, 4)


def apart(node: Tensor, src: Tensor) -> bool:
    """`src` shares no bytes with the output `node`."""
    return src.buffer is not node.buffer or disjoint(node, src)
