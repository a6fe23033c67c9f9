"""cuda builders of MUL_MAT (matvec, strided, batched, prefill through cuBLAS, the residual
add fused) and MUL_MAT_ID."""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.cuda.kernels import common
from rpcnet.compute.kernels import kernel_table as registry
from rpcnet.compute.kernels.kernel_table import NATIVE, Step, fusion
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import type_name

# ---------------------------------------------------------------------------------- matmul


@common.on_contiguous_f32(2)
def _mul_mat_ok(node: Tensor, w: Tensor, y: Tensor) -> bool:
    from rpcnet.compute.cuda import sources

    wt = common._weight_type(w)
    if wt is None or y.type != common.F32 or not (common._contiguous(w) and common._contiguous(y)):
        return False
    k = w.ne[0]
    return (
        w.ne[2] == w.ne[3] == y.ne[2] == y.ne[3] == 1
        and y.ne[0] == k
        and node.ne == (w.ne[1], y.ne[1], 1, 1)
        and (wt in sources.FLOAT_TYPES or k % 32 == 0)
        and w.offset % sources.WEIGHT_ALIGN[wt] == 0  # cudaMalloc bases are 256-aligned
        and common._row_bytes(w) % sources.WEIGHT_ALIGN[wt] == 0
    )


@common.cuda_kernel(
    Op.MUL_MAT,
    "all 16 weight types x f32 -> f32 (2-D; N<=32 MMVQ launches of up to 8 columns, else cuBLAS)",
    _mul_mat_ok,
    priority=NATIVE,
    capturable=lambda node: node.ne[1] <= common.MATVEC_CHUNKED_MAX,  # wider products call cuBLAS
)
def cuda_mul_mat(node: Tensor) -> Step:
    return _mul_mat_step(node, node, None)


def _mul_mat_step(node: Tensor, out: Tensor, add_t: Tensor | None) -> Step:
    """MUL_MAT `node` written to `out` (itself, or the ADD fused after it, with `add_t` the
    ADD's other operand)."""
    from rpcnet.compute.cuda import sources

    w_t, y_t = common._need(node, 2)
    be, launch, wt = common._backend(node), common._launch_module(), common._weight_type(w_t)
    assert wt is not None
    k, m, n = w_t.ne[0], w_t.ne[1], y_t.ne[1]
    w, y, dst = common._raw(w_t), common._view(y_t, (n, k)), common._view(out, (n, m))
    add = None if add_t is None else common._view(add_t, (n, m))
    if n <= common.MATVEC_CHUNKED_MAX:
        if wt in sources.FLOAT_TYPES:
            return lambda: launch.matvec(be, wt, w, y, dst, k, m, n, add=add)
        yq, quantized = q8_1_input(be, y_t, wt, k, n)
        return lambda: launch.matvec(be, wt, w, y, dst, k, m, n, yq, quantized=quantized, add=add)
    assert add is None, "only matvec products take a fused ADD"
    w_bytes, y_bytes = launch.prefill_scratch_bytes(wt, k, m, n)
    w16 = common._device_scratch(be, "f16", w_bytes) if w_bytes else None
    y16 = common._device_scratch(be, "act16", y_bytes) if y_bytes else None
    return lambda: launch.matmul_prefill(be, wt, w, y, dst, k, m, w16, y16)


def q8_1_input(be: Any, y_t: Tensor, wt: str, k: int, n: int) -> tuple[Any, bool]:
    """The q8_1 scratch for a product's input, and whether it already holds that input's blocks.
    Products of one input (Q, K and V; gate and up) quantize it once: the first leaves its blocks
    in the scratch, and the next ones use them if no step in between wrote that input or
    quantized another one. A producer that offered to quantize what it writes (an RMS_NORM) is
    asked to, and nothing is launched for it here."""
    launch = common._launch_module()
    state = registry.plan_state()
    key, block = common.activation_key(y_t), launch.activation_block(wt)
    note = state.shared.get(common._Q8_1_NOTE)
    if note is not None and note.key == key and not state.written_since(note.mark, y_t):
        request = note.request
        if request is not None and request.block in (None, block) and block in request.blocks:
            request.block = block
            return note.yq, True
        if note.request is None and note.block == block:
            return note.yq, True
    yq = common._device_scratch(be, "q8_1", launch.q8_1_bytes(k, n))
    state.shared[common._Q8_1_NOTE] = common.Q8Note(key, block, len(state.written), yq)
    return yq, False


def _mul_mat_add_ok(mm: Tensor, add: Tensor) -> bool:
    """A decode product whose only reader is an ADD of a same-shaped contiguous f32 operand
    (the residual after the attention output and FFN down projections)."""
    r = common._other_src(add, mm)
    return (
        r is not None
        and r is not mm
        and _mul_mat_ok(mm)
        and mm.ne[1] <= common.MATVEC_CHUNKED_MAX
        and add.type == common.F32
        and common._contiguous(add)
        and add.ne == mm.ne
        and r.type == common.F32
        and common._contiguous(r)
        and r.ne == mm.ne
    )


@fusion(Op.MUL_MAT, Op.ADD, _mul_mat_add_ok, device=common.CUDA)
def cuda_mul_mat_add(mm: Tensor, add: Tensor) -> Step:
    """A decode product and the residual ADD after it: the product's kernel adds the other
    operand as it writes (one kernel; the product itself is never written)."""
    r = common._other_src(add, mm)
    assert r is not None
    return _mul_mat_step(mm, add, r)


def _elsize(t: Tensor) -> int:
    return int(np.dtype(common._DTYPES[t.type]).itemsize)


@common.on_contiguous_f32(2)
def _strided_matvec_ok(node: Tensor, w: Tensor, y: Tensor) -> bool:
    """Few columns against float weights in any row and channel layout (a decode step's
    attention products on the cache's views): elements contiguous along K, heads on ne2."""
    return (
        w.type in (common.F32, common.F16, common.BF16)
        and y.type == common.F32
        and w.nb[0] == _elsize(w)
        and y.nb[0] == 4
        and y.nb[1] % 4 == 0
        and y.nb[2] % 4 == 0
        and y.ne[0] == w.ne[0]
        and node.ne == (w.ne[1], y.ne[1], y.ne[2], 1)
        and 1 <= y.ne[1] <= common.MATVEC_MAX_COLS
        and w.ne[3] == y.ne[3] == 1
        and 0 < w.ne[2]
        and y.ne[2] % w.ne[2] == 0
        and y.ne[2] <= 65535  # channels on grid.y
    )


@common.cuda_kernel(
    Op.MUL_MAT,
    "f32|f16|bf16 x f32 -> f32, N<=8, strided rows and heads, ne2 broadcast (attention decode)",
    _strided_matvec_ok,
    priority=NATIVE - 5,  # after the 2-D weight path, before the cuBLAS one
)
def cuda_mul_mat_strided(node: Tensor) -> Step:
    m, ncols = node.ne[0], node.ne[1]
    return _strided_step(node, node, (m, m * ncols))


def _strided_step(node: Tensor, out: Tensor, dst_strides: tuple[int, int]) -> Step:
    """The strided matvec of `node`, its (column, channel) results written to `out` with
    `dst_strides` floats apart."""
    w_t, y_t = common._need(node, 2)
    be, launch = common._backend(node), common._launch_module()
    k, m, ncols, channels = w_t.ne[0], w_t.ne[1], y_t.ne[1], y_t.ne[2]
    w, y, dst = common._raw(w_t), common._view(y_t), common._raw(out)
    strides = (w_t.nb[1], w_t.nb[2], y_t.nb[1] // 4, y_t.nb[2] // 4, *dst_strides)
    wt, ratio = type_name(w_t.type).upper(), channels // w_t.ne[2]
    return lambda: launch.matvec_strided(be, wt, w, y, dst, k, m, ncols, channels, strides, ratio)


def _permuted(cont: Tensor, mm: Tensor) -> Tensor | None:
    """The view of `mm` with its dims 1 and 2 swapped that `cont` copies, if that is what it
    copies (attention's V·KQ, heads brought next to each other for the output projection)."""
    p = cont.src[0] if cont.src else None
    if p is None or p.op not in (Op.PERMUTE, Op.VIEW) or not p.src or p.src[0] is not mm:
        return None
    swapped = p.ne == (mm.ne[0], mm.ne[2], mm.ne[1], 1) and p.nb[:3] == (
        mm.nb[0],
        mm.nb[2],
        mm.nb[1],
    )
    return p if swapped and p.offset == mm.offset else None


def _strided_cont_ok(mm: Tensor, cont: Tensor) -> bool:
    return (
        _strided_matvec_ok(mm)
        and cont.op == Op.CONT
        and cont.type == common.F32
        and common._contiguous(cont)
        and cont.nelements == mm.nelements
        and mm.ne[3] == 1
        and _permuted(cont, mm) is not None
    )


@fusion(Op.MUL_MAT, Op.CONT, _strided_cont_ok, device=common.CUDA)
def cuda_mul_mat_permuted(mm: Tensor, cont: Tensor) -> Step:
    """V·KQ of a decode step written straight in the order the CONT after its permutation
    wants (heads next to each other): one kernel, no copy."""
    m, channels = mm.ne[0], mm.ne[2]
    return _strided_step(mm, cont, (m * channels, m))  # column (token) stride, channel stride


@common.on_contiguous_f32(2)
def _batched_ok(node: Tensor, a: Tensor, b: Tensor) -> bool:
    return (
        a.type in (common.F32, common.F16)
        and b.type in (common.F32, common.F16)
        and b.ne[0] == a.ne[0]
        and node.ne == (a.ne[1], b.ne[1], b.ne[2], b.ne[3])
        and a.ne[2] > 0
        and a.ne[3] > 0
        and b.ne[2] % a.ne[2] == 0
        and b.ne[3] % a.ne[3] == 0
    )


@common.uncapturable(
    Op.MUL_MAT,
    "f32|f16 x f32|f16 -> f32, any strides, ne2/ne3 broadcast (CuPy matmul: attention)",
    _batched_ok,
)
def cuda_mul_mat_batched(node: Tensor) -> Step:
    """The attention products (K*Q, V*KQ: strided cache views, heads broadcast for GQA) as one
    cuBLAS batched matmul; src0 matrix i02 serves src1 matrices i02*r2 .. i02*r2+r2-1."""
    a_t, b_t = common._need(node, 2)
    be = common._backend(node)
    a, b, dst = common._view(a_t), common._view(b_t), common._view(node)
    r2, r3 = b_t.ne[2] // a_t.ne[2], b_t.ne[3] // a_t.ne[3]

    half = a_t.type == common.F16  # the CPU's f16 dot product rounds the other side to f16 first

    def run() -> None:
        cp = be.cp
        with be.device, be.stream:
            w = a.astype(cp.float32)
            if r2 > 1:
                w = cp.repeat(w, r2, axis=1)
            if r3 > 1:
                w = cp.repeat(w, r3, axis=0)
            x = b.astype(cp.float16).astype(cp.float32) if half else b.astype(cp.float32)
            dst[...] = cp.matmul(x, w.swapaxes(-1, -2))

    return run


@common.on_contiguous_f32(3)
def _mul_mat_id_ok(node: Tensor, w: Tensor, y: Tensor, ids: Tensor) -> bool:
    from rpcnet.compute.cuda import sources

    wt = common._weight_type(w)
    k = w.ne[0]
    return (
        wt is not None
        and y.type == common.F32
        and ids.type == common.I32
        and common._contiguous(w)
        and common._contiguous(y)
        and ids.nb[0] == 4
        and ids.nb[1] % 4 == 0  # rows may be apart: top-k ids are a view of argsort's rows
        and w.ne[3] == y.ne[3] == ids.ne[2] == ids.ne[3] == 1
        and y.ne[0] == k
        and ids.ne[1] == y.ne[2]
        and node.ne == (w.ne[1], ids.ne[0], y.ne[2], 1)
        and (wt in sources.FLOAT_TYPES or k % 32 == 0)
        and w.offset % sources.WEIGHT_ALIGN[wt] == 0
        and common._row_bytes(w) % sources.WEIGHT_ALIGN[wt] == 0
    )


@common.cuda_kernel(Op.MUL_MAT_ID, "all 16 weight types x f32, i32 ids -> f32", _mul_mat_id_ok)
def cuda_mul_mat_id(node: Tensor) -> Step:
    from rpcnet.compute.cuda import sources

    w_t, y_t, ids_t = common._need(node, 3)
    be, launch, wt = common._backend(node), common._launch_module(), common._weight_type(w_t)
    assert wt is not None
    k, m = w_t.ne[0], w_t.ne[1]
    n_tokens, ne11, n_slots = y_t.ne[2], y_t.ne[1], ids_t.ne[0]
    w, y = common._raw(w_t), common._view(y_t, (n_tokens, ne11, k))
    assert ids_t.buffer is not None
    ids = be.view(
        common._storage(ids_t), ids_t.offset, (n_tokens, n_slots), (ids_t.nb[1], 4), "int32"
    )
    dst, ids_tok = common._view(node, (n_tokens, n_slots, m)), ids_t.nb[1] // 4
    yq = None
    if wt not in sources.FLOAT_TYPES:
        yq = common._device_scratch(be, "q8_1", launch.q8_1_bytes(k, n_tokens * ne11))
        registry.plan_state().shared[common._Q8_1_NOTE] = (
            None  # the q8_1 scratch now holds this input
        )
    return lambda: launch.matvec_id(be, wt, w, y, ids, dst, k, m, yq, ids_tok)
