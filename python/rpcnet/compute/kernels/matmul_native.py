"""MUL_MAT's native kernel (declared in matmul.py): weights of every supported type read in
block form.

`_native.matmul_quant` converts the float32 activations to the weight type's vec_dot type the
way ggml's x86 CPU backend does (q8_0 / q8_1 / q8_K / f16 / bf16) and computes each row pair in
the order of ggml's AVX2 vec_dot, so decode reads each weight byte once (no float copy) and the
results match the reference server's (also where ggml's MUL_MAT takes llamafile's sgemm for
f32/f16/bf16 weights: `llamafile=True` reproduces its summation order). Batch dims follow
ggml's broadcast rule (i02 = i12 / (ne12 / ne02)) by looping, never by materializing repeats.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from rpcnet import _native
from rpcnet.compute.kernels.kernel_table import BuildContext, Step
from rpcnet.compute.kernels.native_args import tensor_arg
from rpcnet.compute.scratch import logical_f32
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view, storage
from rpcnet.ggml_types import GgmlType

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


def native_supported(node: Tensor) -> bool:
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


def native_scratch(node: Tensor, limit: int | None) -> int:
    """The activations made contiguous and the kernel's converted copy of them, and an output
    staging array when the destination is strided."""
    return 2 * logical_f32(node.src[1]) + 2 * logical_f32(node)
