"""Helpers shared by kernel modules: reading and writing tensors as float32, shape rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rpcnet.compute import convert
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import PLAIN_DTYPES, plain_view
from rpcnet.ggml_types import GgmlType

F32 = np.float32
FLOAT_TYPES = frozenset({GgmlType.F32, GgmlType.F16, GgmlType.BF16})

Reader = Callable[[], Any]
Writer = Callable[[Any], None]


def reader(t: Tensor) -> Reader:
    """A zero-arg callable giving the tensor as float32 (ne3, ne2, ne1, ne0); views resolved now."""
    if t.type == GgmlType.F32:
        view = plain_view(t)
        return lambda: view
    if t.type in PLAIN_DTYPES and t.type != GgmlType.BF16:
        view = plain_view(t)
        return lambda: view.astype(F32)
    return lambda: convert.load_f32(t)


def writer(t: Tensor) -> Writer:
    """A callable storing float32 values (broadcastable to the tensor's shape) into the tensor."""
    if t.type in PLAIN_DTYPES and t.type != GgmlType.BF16:
        view = plain_view(t)

        def write_plain(values: Any) -> None:
            view[...] = values

        return write_plain
    return lambda values: convert.store(t, values)


def source_io(node: Tensor) -> tuple[Tensor, Reader, Writer]:
    """A one-source op's source (its support rule checked it is there), a reader of it and a
    writer of `node`."""
    a = node.src[0] if node.src else None
    assert a is not None
    return a, reader(a), writer(node)


def float_io(node: Tensor, *srcs: Tensor | None) -> bool:
    """Every given source and the node are f32/f16/bf16 tensors."""
    return node.type in FLOAT_TYPES and all(s is not None and s.type in FLOAT_TYPES for s in srcs)


def quiet() -> Any:
    """Float warnings off: overflow to inf / NaN propagation is the expected ggml behaviour."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore")


def repeats_into(small: Tensor, big: Tensor) -> bool:
    """ggml's broadcast rule: every dim of `small` divides the matching dim of `big`."""
    return all(s > 0 and b % s == 0 for s, b in zip(small.ne, big.ne, strict=True))


def tile_to(values: Any, target: tuple[int, ...]) -> Any:
    """Repeat `values` (dims dividing target's) up to `target`, as ggml's modulo indexing does."""
    if all(v in (1, t) for v, t in zip(values.shape, target, strict=True)):
        return values  # NumPy broadcasting already means the same thing
    reps = tuple(
        t // v if v not in (1, t) else 1 for v, t in zip(values.shape, target, strict=True)
    )
    return np.tile(values, reps)


def same_shape(a: Tensor, b: Tensor) -> bool:
    return tuple(a.ne) == tuple(b.ne)
