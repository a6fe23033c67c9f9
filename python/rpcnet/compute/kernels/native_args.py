"""Arguments of the native step builders (`_native.*_step`): tensors as raw buffer spans."""

from __future__ import annotations

from typing import Any

from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import storage

TensorArg = tuple[Any, int, tuple[int, ...], tuple[int, ...]]


def tensor_arg(t: Tensor, offset: int = 0, ne0: int | None = None) -> TensorArg:
    """(buffer bytes, offset of element 0, ne, nb); `offset`/`ne0` select a column range."""
    ne = tuple(t.ne) if ne0 is None else (ne0, *t.ne[1:])
    return (storage(t), t.offset + offset, ne, tuple(t.nb))


def device_threads(node: Tensor) -> int:
    return max(1, int(getattr(node.buffer.device, "threads", 1) or 1))


def rows_contiguous(t: Tensor, elem: int) -> bool:
    """Elements of a row are adjacent (ggml's nb[0] == type size)."""
    return t.nb[0] == elem
