"""MUL_MAT flagged "src0 is a Hadamard matrix": ggml's fast Walsh-Hadamard transform instead.

llama.cpp rotates Q and K (and V) by a normalized Hadamard matrix before a quantized KV cache,
as a MUL_MAT whose op_params[1] holds GGML_HINT_SRC0_IS_HADAMARD (1). ggml's CPU backend then
ignores src0 and transforms each src1 row itself (`ggml_compute_forward_fwht`): scale by
`1/sqrtf(n)` first, then the butterflies `(u + v, u - v)` for half-widths 1, 2, 4, ... in
float32. Another summation order than a matmul, so it is replayed here to keep the bits (a
one-ulp change in a rotated K flips q8_0 codes of the KV cache).
"""

from __future__ import annotations

import numpy as np

from rpcnet.compute import scratch
from rpcnet.compute.kernels.kernel_table import HINT, Step, kernel
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

HINT_SRC0_IS_HADAMARD = 1


def _supported(node: Tensor) -> bool:
    b = node.src[1]
    if b is None or node.src[0] is None or len(node.op_params) < 8:
        return False
    n = b.ne[0]
    return (
        node.i32(1) == HINT_SRC0_IS_HADAMARD
        and b.type == GgmlType.F32
        and node.type == GgmlType.F32
        and n > 0
        and n & (n - 1) == 0
        and tuple(node.ne) == tuple(b.ne)
    )


def fwht_rows(x: np.ndarray, out: np.ndarray) -> None:
    """`out` = ggml's FWHT of each last-axis row of `x` (float32, same shape)."""
    n = x.shape[-1]
    y = np.multiply(x, np.float32(1.0) / np.sqrt(np.float32(n)), dtype=np.float32)
    rows = y.reshape(-1, n)
    half = 1
    while half < n:
        pairs = rows.reshape(rows.shape[0], n // (2 * half), 2, half)
        u, v = pairs[:, :, 0, :], pairs[:, :, 1, :]
        rows = np.stack((u + v, u - v), axis=2).reshape(rows.shape[0], n)
        half *= 2
    out[...] = rows.reshape(x.shape)


@kernel(Op.MUL_MAT, "Hadamard-hinted f32 rows (ggml's FWHT)", _supported, priority=HINT)
def mul_mat_hadamard(node: Tensor) -> Step:
    b_t = node.src[1]
    assert b_t is not None
    x, out = plain_view(b_t), plain_view(node)

    def run() -> None:
        fwht_rows(np.asarray(x), out)

    return run


# the scaled copy, one stacked copy per pass, the result before it is stored
scratch.register(
    mul_mat_hadamard.__name__,
    lambda node: 3 * scratch.logical_f32(node),
)
