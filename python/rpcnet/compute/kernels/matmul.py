"""MUL_MAT: out[M, N, ne2, ne3] = src1[K, N] · src0[K, M]ᵀ; src0 repeats over dims 2-3."""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute import convert
from rpcnet.compute.kernels.operands import vec_dot_operand
from rpcnet.compute.kernels.registry import Step, kernel
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType


def _supported(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    if a is None or b is None or node.type != GgmlType.F32:
        return False
    k, m = a.ne[0], a.ne[1]
    return (
        b.ne[0] == k
        and node.ne[0] == m
        and node.ne[1] == b.ne[1]
        and node.ne[2] == b.ne[2]
        and node.ne[3] == b.ne[3]
        and a.ne[2] > 0
        and a.ne[3] > 0
        and b.ne[2] % a.ne[2] == 0
        and b.ne[3] % a.ne[3] == 0
        and convert.can_load(a.type)
        and convert.can_load(b.type)
    )


def broadcast_weights(a: Any, ne2: int, ne3: int) -> Any:
    """ggml maps output batch i2 to weight batch i2 / (ne2 / a.ne2): repeat, not tile."""
    r3, r2 = ne3 // a.shape[0], ne2 // a.shape[1]
    if r2 > 1:
        a = np.repeat(a, r2, axis=1)
    if r3 > 1:
        a = np.repeat(a, r3, axis=0)
    return a


@kernel(Op.MUL_MAT, "f32|f16|bf16|quantized x f32|f16 -> f32", _supported)
def mul_mat(node: Tensor) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    out = plain_view(node)

    def run() -> None:
        a = broadcast_weights(convert.load_weight_f32(a_t), node.ne[2], node.ne[3])
        b = vec_dot_operand(convert.load_f32(b_t), a_t.type)
        np.matmul(b, a.swapaxes(-1, -2), out=out)

    return run
