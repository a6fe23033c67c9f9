"""Shape helpers shared by kernels."""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.tensor import Tensor


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
