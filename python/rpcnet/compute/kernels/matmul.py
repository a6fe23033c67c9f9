"""MUL_MAT: out[M, N, ne2, ne3] = src1[K, N] · src0[K, M]ᵀ; src0 repeats over dims 2-3.

Three CPU kernels, tried in this order: the Hadamard hint (ggml's fast Walsh-Hadamard transform
instead of a product), the native kernel (weights of every supported type read in block form)
and the NumPy kernel here (weights converted to float32, large ones a block of
rows at a time).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from rpcnet import _native
from rpcnet.compute import convert
from rpcnet.compute.kernels.kernel_table import (
    HINT,
    NATIVE,
    BuildContext,
    OpFamily,
    Step,
)
from rpcnet.compute.kernels.native_args import tensor_arg
from rpcnet.compute.kernels.operands import vec_dot_operand
from rpcnet.compute.ops import Op
from rpcnet.compute.scratch import aliasable, logical_f32
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view, storage
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


# --- native kernel ---------------------------------------------------------------------------
#
# `_native.matmul_quant` converts the float32 activations to the weight type's vec_dot type the
# way ggml's x86 CPU backend does (q8_0 / q8_1 / q8_K / f16 / bf16) and computes each row pair in
# the order of ggml's AVX2 vec_dot, so decode reads each weight byte once (no float copy) and the
# results match the reference server's (also where ggml's MUL_MAT takes llamafile's sgemm for
# f32/f16/bf16 weights: `llamafile=True` reproduces its summation order). Batch dims follow
# ggml's broadcast rule (i02 = i12 / (ne12 / ne02)) by looping, never by materializing repeats.


# Rows per src1 batch from which every multi-row kernel ggml may pick (llamafile's tinyBLAS from
# 2, the tiled K-quant kernel from 8) is on: batches at least this tall can share one call.
MULTI_ROW_THRESHOLD = 8


def weight_layout(a: Tensor) -> tuple[int, int] | None:
    """(row bytes, K multiple) when `a`'s rows are whole blocks the kernel reads, else None."""
    if not _native.matmul_quant_supports(a.type):
        return None
    layout = _native.matmul_quant_block(a.type)
    if layout is None:
        return None
    block, block_bytes, k_multiple = layout
    k, m = a.ne[0], a.ne[1]
    if k <= 0 or k % k_multiple or a.nb[0] != block_bytes:
        return None
    row = k // block * block_bytes
    if m > 1 and a.nb[1] < row:
        return None
    return row, k_multiple


def weight_rows(a: Tensor, offset: int, row: int) -> np.ndarray:
    """The `a.ne[1]` weight rows starting at byte `offset` as one flat byte span."""
    m = a.ne[1]
    span = (m - 1) * a.nb[1] + row if m else 0
    return np.ndarray((span,), dtype=np.uint8, buffer=storage(a), offset=offset)


def f32_contiguous(t: Tensor) -> bool:
    """ggml_is_contiguous for an f32 tensor (dims of size 1 may have any stride)."""
    if t.ne[0] != 1 and t.nb[0] != 4:
        return False
    expected = 4 * t.ne[0]
    for ne, nb in zip(t.ne[1:], t.nb[1:], strict=True):
        if ne != 1:
            if nb != expected:
                return False
            expected *= ne
    return True


def _native_supported(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    if a is None or b is None or node.type != GgmlType.F32 or b.type != GgmlType.F32:
        return False
    if weight_layout(a) is None:
        return False
    return (
        b.ne[0] == a.ne[0]
        and a.ne[2] > 0
        and a.ne[3] > 0
        and b.ne[2] % a.ne[2] == 0
        and b.ne[3] % a.ne[3] == 0
        and tuple(node.ne) == (a.ne[1], b.ne[1], b.ne[2], b.ne[3])
    )


def _batches(a: Tensor, b: Tensor) -> Iterator[tuple[int, int, int]]:
    """(i13, i12, weight byte offset) per activation batch, ggml's broadcast of src0."""
    r2, r3 = b.ne[2] // a.ne[2], b.ne[3] // a.ne[3]
    for i13 in range(b.ne[3]):
        for i12 in range(b.ne[2]):
            yield i13, i12, a.offset + (i12 // r2) * a.nb[2] + (i13 // r3) * a.nb[3]


def _native_scratch(node: Tensor, limit: int | None) -> int:
    """The activations made contiguous and the kernel's converted copy of them, and an output
    staging array when the destination is strided."""
    return 2 * logical_f32(node.src[1]) + 2 * logical_f32(node)


@FAMILY.kernel(
    Op.MUL_MAT,
    "any supported weight type x f32 -> f32 (native)",
    _native_supported,
    NATIVE,
    _native_scratch,
)
def mul_mat_native(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    layout = weight_layout(a_t)
    assert layout is not None
    row = layout[0]
    k, m = a_t.ne[0], a_t.ne[1]
    type_id, stride, threads = a_t.type, a_t.nb[1], context.threads
    x = plain_view(b_t)  # (ne3, ne2, ne1, K)
    out = plain_view(node)  # (ne3, ne2, ne1, M)
    # one call for all batches when that changes nothing: ggml picks its multi-row kernels
    # (tinyBLAS from 2 rows, the K-quant tiles from 8) per src1 batch, on ne11 rows
    single = (
        a_t.ne[2] == 1
        and a_t.ne[3] == 1
        and (b_t.ne[1] >= MULTI_ROW_THRESHOLD or b_t.ne[2] * b_t.ne[3] == 1)
    )
    # ggml sends f32 weights to llamafile's sgemm only when src1 is contiguous (f16/bf16 go
    # after conversion, always); the kernel applies the rest of the rule (N >= 2, M % 4 == 0)
    llamafile = a_t.type != GgmlType.F32 or f32_contiguous(b_t)
    if b_t.nb[0] == 4 and node.nb[0] == 4:
        # the whole node in one native step: no Python per call, and batched with its
        # neighbours into one detached run by the plan runner
        blocks = k // (_native.matmul_quant_block(type_id) or (1, 0, 0))[0]
        w_arg = tensor_arg(a_t, ne0=blocks)
        return _native.mul_mat_step(
            type_id, w_arg, tensor_arg(b_t), tensor_arg(node), threads, llamafile
        )
    batches = list(_batches(a_t, b_t))
    weights = {off: weight_rows(a_t, off, row) for _, _, off in batches}

    def mul(w: np.ndarray, xs: np.ndarray, dst: np.ndarray) -> None:
        n = xs.shape[0]
        if dst.flags.c_contiguous and dst.shape == (n, m):
            _native.matmul_quant(type_id, w, stride, xs, dst, threads, llamafile)
        else:
            res = np.empty((n, m), dtype=np.float32)
            _native.matmul_quant(type_id, w, stride, xs, res, threads, llamafile)
            dst[...] = res.reshape(dst.shape)

    def run() -> None:
        if single:
            # every activation row meets the same weights: one call, activations converted once
            xs = np.ascontiguousarray(x).reshape(-1, k)
            dst = out.reshape(-1, m) if out.flags.c_contiguous else out
            mul(weights[batches[0][2]], xs, dst)
            return
        # strided rows (rare): one call per batch
        for i13, i12, off in batches:
            mul(weights[off], np.ascontiguousarray(x[i13, i12]), out[i13, i12])

    return run
