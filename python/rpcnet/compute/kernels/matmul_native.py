"""MUL_MAT fast path for decode: q8_0 weights read as blocks by the native kernel.

For a few activation rows (N <= 8) a matmul is bound by reading the weights. The generic kernel
multiplies a float32 copy (4 bytes per weight); `_native.matmul_q8_0` reads the 34-byte q8_0
blocks directly (1.06 bytes per weight) and computes like ggml's CPU vec_dot_q8_0_q8_0: the
activations are quantized to q8_0, each block pair gives an exact integer dot product.
"""

from __future__ import annotations

import numpy as np

from rpcnet import _native
from rpcnet.compute import scratch
from rpcnet.compute.kernels.registry import NATIVE, Step, kernel
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view, row_bytes_view, storage
from rpcnet.ggml_types import TYPE_TRAITS, GgmlType

Q8_0_BLOCK = TYPE_TRAITS[GgmlType.Q8_0].block_size
Q8_0_BYTES = TYPE_TRAITS[GgmlType.Q8_0].type_size
MAX_ROWS = 8  # activation rows the native kernel takes in one pass


def _supported(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    if a is None or b is None or node.type != GgmlType.F32 or b.type != GgmlType.F32:
        return False
    k, m = a.ne[0], a.ne[1]
    return (
        a.type == GgmlType.Q8_0
        and a.nb[0] == Q8_0_BYTES
        and a.ne[2] == 1
        and a.ne[3] == 1
        and k > 0
        and k % Q8_0_BLOCK == 0
        and a.nb[1] >= k // Q8_0_BLOCK * Q8_0_BYTES
        and b.ne[0] == k
        and 1 <= b.ne[1] * b.ne[2] * b.ne[3] <= MAX_ROWS
        and node.ne[0] == m
        and tuple(node.ne[1:]) == tuple(b.ne[1:])
    )


@kernel(Op.MUL_MAT, "q8_0 x f32 -> f32 (native, N<=8)", _supported, priority=NATIVE)
def mul_mat_q8_0_native(node: Tensor) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    k, m = a_t.ne[0], a_t.ne[1]
    n = b_t.ne[1] * b_t.ne[2] * b_t.ne[3]
    stride = a_t.nb[1]
    row_bytes_view(a_t)  # checks the rows against the buffer
    # the weight rows as one flat byte span (rows may be `stride` > row bytes apart)
    span = (m - 1) * stride + k // Q8_0_BLOCK * Q8_0_BYTES if m else 0
    w = np.ndarray((span,), dtype=np.uint8, buffer=storage(a_t), offset=a_t.offset)
    x = plain_view(b_t)
    out = plain_view(node)
    out_flat = out.reshape(n, m) if out.flags.c_contiguous else None
    assert node.buffer is not None  # plain_view(node) has checked it
    threads = max(1, int(getattr(node.buffer.device, "threads", 1) or 1))

    def run() -> None:
        xs = np.ascontiguousarray(x).reshape(n, k)
        if out_flat is not None:
            _native.matmul_q8_0(w, stride, xs, out_flat, threads)
        else:
            res = np.empty((n, m), dtype=np.float32)
            _native.matmul_q8_0(w, stride, xs, res, threads)
            out[...] = res.reshape(out.shape)

    return run


# Reads the q8_0 rows in place: only the activation rows (<= 8) and the output are temporaries.
scratch.register(
    mul_mat_q8_0_native.__name__,
    lambda node: 2 * scratch.logical_f32(node.src[1]) + 2 * scratch.logical_f32(node),
)
