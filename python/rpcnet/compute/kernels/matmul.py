"""MUL_MAT: out[M, N, ne2, ne3] = src1[K, N] · src0[K, M]ᵀ; src0 repeats over dims 2-3.

Three CPU kernels, tried in this order: the Hadamard hint (ggml's fast Walsh-Hadamard transform
instead of a product), the native kernel (weights of every supported type read in block form,
matmul_native.py) and the NumPy kernel here (weights converted to float32, large ones a block of
rows at a time).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from rpcnet.compute import convert
from rpcnet.compute.kernels.kernel_table import (
    HINT,
    NATIVE,
    BuildContext,
    OpFamily,
    Step,
)
from rpcnet.compute.kernels.matmul_native import mul_mat_native, native_scratch, native_supported
from rpcnet.compute.kernels.operands import vec_dot_operand
from rpcnet.compute.ops import Op
from rpcnet.compute.scratch import aliasable, logical_f32
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily("matmul", cuda=("rpcnet.compute.cuda.kernels.matmul",))

WEIGHT_CHUNK = 256 << 20  # float32 bytes of weights converted at once (and the most cached)
HINT_SRC0_IS_HADAMARD = 1  # op_params[1]: src0 is a normalized Hadamard matrix


def weight_chunk_bytes(max_scratch: int | None) -> int:
    """Weights larger than this (as f32) are converted a block of rows at a time: at most a
    quarter of the device's --max-scratch, and never more than WEIGHT_CHUNK."""
    return WEIGHT_CHUNK if max_scratch is None else min(WEIGHT_CHUNK, max_scratch // 4)


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


def split_batches(x: Any, r3: int, r2: int) -> Any:
    """View (ne3, ne2, ...) as (ne3 / r3, r3, ne2 / r2, r2, ...) without copying."""
    s3, s2 = x.strides[:2]
    shape = (x.shape[0] // r3, r3, x.shape[1] // r2, r2, *x.shape[2:])
    strides = (s3 * r3, s3, s2 * r2, s2, *x.strides[2:])
    return as_strided(x, shape, strides, writeable=x.flags.writeable)


def batched_matmul(b: Any, a: Any, out: Any) -> None:
    """out[i3, i2] = b[i3, i2] · a[i3 / r3, i2 / r2]ᵀ (ggml's weight broadcast: repeat, not tile).

    The weights are never repeated in memory: the r3·r2 activation batches that share one weight
    matrix are stacked into the rows of a single product with it, so a broadcast batch costs a
    copy of the activations and of the output (both charged in compute/scratch.py), not of the
    weights, and runs as one large GEMM per weight matrix.
    """
    r3, r2 = out.shape[0] // a.shape[0], out.shape[1] // a.shape[1]
    if r3 == 1 and r2 == 1:
        np.matmul(b, a.swapaxes(-1, -2), out=out)
        return
    a3, a2, m, k = a.shape
    n = b.shape[-2]
    shared = split_batches(b, r3, r2).transpose(0, 2, 1, 3, 4, 5)  # (a3, a2, r3, r2, N, K)
    rows = shared.reshape(a3, a2, r3 * r2 * n, k)
    res = np.matmul(rows, a.swapaxes(-1, -2)).reshape(a3, a2, r3, r2, n, m)
    split_batches(out, r3, r2)[...] = res.transpose(0, 2, 1, 3, 4, 5)


def weight_chunks(a_t: Tensor, chunk: int, always: bool = False) -> list[tuple[int, int, Tensor]]:
    """Row ranges (m0, m1, descriptor) small enough to convert one at a time: weights of a
    non-f32 type larger than `chunk` bytes as f32 are never converted whole (scratch.py);
    `always`: in blocks even when small (a caller that must not use the derived cache)."""
    k, m = a_t.ne[0], a_t.ne[1]
    if a_t.type == GgmlType.F32 or (a_t.nelements * 4 <= chunk and not always):
        return []
    rows = max(1, chunk // (4 * k * a_t.ne[2] * a_t.ne[3]))
    return [
        (
            m0,
            min(m, m0 + rows),
            dataclasses.replace(
                a_t,
                ne=(k, min(m, m0 + rows) - m0, a_t.ne[2], a_t.ne[3]),
                offset=a_t.offset + m0 * a_t.nb[1],
                src=(),
            ),
        )
        for m0 in range(0, m, rows)
    ]


@FAMILY.kernel(Op.MUL_MAT, "f32|f16|bf16|quantized x f32|f16 -> f32", _supported)
def mul_mat(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    out = plain_view(node)
    chunks = weight_chunks(a_t, weight_chunk_bytes(context.max_scratch))

    def run() -> None:
        b = vec_dot_operand(convert.load_f32(b_t), a_t.type)
        if not chunks:
            batched_matmul(b, convert.load_weight_f32(a_t), out)
            return
        for m0, m1, part in chunks:  # large weights: converted a block of rows at a time
            batched_matmul(b, convert.load_f32(part), out[..., m0:m1])

    return run


# MUL_MAT flagged "src0 is a Hadamard matrix": llama.cpp rotates Q and K (and V) by a normalized
# Hadamard matrix before a quantized KV cache, as a MUL_MAT whose op_params[1] holds
# GGML_HINT_SRC0_IS_HADAMARD. ggml's CPU backend then ignores src0 and transforms each src1 row
# itself (`ggml_compute_forward_fwht`): scale by `1/sqrtf(n)` first, then the butterflies
# `(u + v, u - v)` for half-widths 1, 2, 4, ... in float32. Another summation order than a
# matmul, so it is replayed here to keep the bits (a one-ulp change in a rotated K flips q8_0
# codes of the KV cache).


def _hadamard_supported(node: Tensor) -> bool:
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


@FAMILY.kernel(
    Op.MUL_MAT,
    "Hadamard-hinted f32 rows (ggml's FWHT)",
    _hadamard_supported,
    HINT,
    # the scaled copy, one stacked copy per pass, the result before it is stored
    lambda node, limit: 3 * logical_f32(node),
)
def mul_mat_hadamard(node: Tensor, context: BuildContext) -> Step:
    b_t = node.src[1]
    assert b_t is not None
    x, out = plain_view(b_t), plain_view(node)

    def run() -> None:
        fwht_rows(np.asarray(x), out)

    return run


@FAMILY.scratch_rule(Op.MUL_MAT)
def _scratch(node: Tensor, limit: int | None) -> int:
    """The NumPy kernel's temporaries: weights of another type than f32 dequantized, at most one
    chunk of rows at a time (`weight_chunks`); the activations converted or rounded
    (`vec_dot_operand`) and stacked per weight matrix when the weights broadcast
    (`batched_matmul`): two copies at most; the product."""
    a, b = node.src[0], node.src[1]
    if a is None or a.type == GgmlType.F32:
        weights = aliasable(a, node)
    else:
        weights = min(logical_f32(a), weight_chunk_bytes(limit)) * 5 // 4
    return weights + 2 * logical_f32(b) + logical_f32(node)


FAMILY.kernel(
    Op.MUL_MAT,
    "any supported weight type x f32 -> f32 (native)",
    native_supported,
    NATIVE,
    native_scratch,
)(mul_mat_native)
