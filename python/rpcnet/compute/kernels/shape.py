"""Data movement and small structural ops: CONCAT, REPEAT, PAD, ARANGE, TIMESTEP_EMBEDDING, TRI,
ACC, ADD1, ADD_ID, DIAG_MASK_INF, DIAG_MASK_ZERO, SSM_CONV.

Pure data movement (CONCAT, REPEAT, PAD) copies raw elements of any plain type (CONCAT also whole
quantized blocks); the arithmetic ops compute in float32 like the ggml CPU kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute import convert
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.kernels.common import (
    F32,
    FLOAT_TYPES,
    float_io,
    quiet,
    reader,
    repeats_into,
    same_shape,
    writer,
)
from rpcnet.compute.kernels.floatmath import cos, exp, fma, sin
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import PLAIN_DTYPES, plain_view, row_bytes_view
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily("shape", cuda=("rpcnet.compute.cuda.kernels.array_code",))


def _srcs(node: Tensor, n: int) -> list[Tensor | None]:
    return [node.src[i] if len(node.src) > i else None for i in range(n)]


def _shape(t: Tensor) -> tuple[int, int, int, int]:
    return (t.ne[3], t.ne[2], t.ne[1], t.ne[0])


def _block(type_id: int) -> tuple[int, int]:
    """(block size, bytes per block)."""
    _, block, size, _ = _native.type_info(type_id)
    return block, size


# --------------------------------------------------------------------------------------------
# CONCAT / REPEAT / PAD: raw copies


def _concat_ok(node: Tensor) -> bool:
    a, b = _srcs(node, 2)
    if a is None or b is None or not (a.type == b.type == node.type):
        return False
    dim = node.i32(0)
    if not 0 <= dim < 4 or node.ne[dim] != a.ne[dim] + b.ne[dim]:
        return False
    if any(node.ne[d] != a.ne[d] or node.ne[d] != b.ne[d] for d in range(4) if d != dim):
        return False
    if node.type in PLAIN_DTYPES:
        return True
    # quantized: whole blocks, contiguous within rows
    block, size = _block(node.type)
    return all(t.ne[0] % block == 0 and t.nb[0] == size for t in (a, b, node))


@FAMILY.kernel(Op.CONCAT, "any plain type; quantized in whole blocks", _concat_ok)
def concat(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    view = plain_view if node.type in PLAIN_DTYPES else row_bytes_view
    a, b, out = view(a_t), view(b_t), view(node)
    axis = 3 - node.i32(0)

    def run() -> None:
        out[...] = np.concatenate((a, b), axis=axis)

    return run


def _repeat_ok(node: Tensor) -> bool:
    (a,) = _srcs(node, 1)
    return (
        a is not None and a.type == node.type and a.type in PLAIN_DTYPES and repeats_into(a, node)
    )


@FAMILY.kernel(Op.REPEAT, "any plain type (tile)", _repeat_ok)
def repeat(node: Tensor, context: BuildContext) -> Step:
    a_t = node.src[0]
    assert a_t is not None
    a, out = plain_view(a_t), plain_view(node)
    reps = tuple(o // s for o, s in zip(out.shape, a.shape, strict=True))

    def run() -> None:
        out[...] = np.tile(a, reps)

    return run


def _pad_ok(node: Tensor) -> bool:
    (a,) = _srcs(node, 1)
    if a is None or a.type != node.type or a.type not in PLAIN_DTYPES:
        return False
    pads = [node.i32(i) for i in range(8)]
    return all(
        node.ne[d] == a.ne[d] + pads[2 * d] + pads[2 * d + 1] and a.ne[d] > 0 for d in range(4)
    )


@FAMILY.kernel(Op.PAD, "any plain type (p0..p7 lp/rp per dim, p8 circular)", _pad_ok)
def pad(node: Tensor, context: BuildContext) -> Step:
    a_t = node.src[0]
    assert a_t is not None
    a, out = plain_view(a_t), plain_view(node)
    circular = node.i32(8) != 0
    index, valid = [], []
    for d in (3, 2, 1, 0):  # numpy axis order
        src_i = np.arange(node.ne[d]) - node.i32(2 * d)
        if circular:
            src_i = np.mod(src_i, a_t.ne[d])
        ok = (src_i >= 0) & (src_i < a_t.ne[d])
        index.append(np.clip(src_i, 0, a_t.ne[d] - 1))
        valid.append(ok)
    grid = np.ix_(*index)
    v3, v2, v1, v0 = valid
    inside = v3[:, None, None, None] & v2[None, :, None, None] & v1[None, None, :, None] & v0
    zero = np.zeros((), a.dtype)

    def run() -> None:
        out[...] = np.where(inside, a[grid], zero)

    return run


# --------------------------------------------------------------------------------------------
# generators


def _arange_ok(node: Tensor) -> bool:
    return node.type in FLOAT_TYPES


@FAMILY.kernel(Op.ARANGE, "-> f32|f16|bf16 (p0 start, p1 stop, p2 step)", _arange_ok)
def arange(node: Tensor, context: BuildContext) -> Step:
    start, step = F32(node.f32(0)), F32(node.f32(2))
    values = fma(step, np.arange(node.nelements).astype(F32), start).reshape(_shape(node))
    store = writer(node)

    def run() -> None:
        store(values)

    return run


def _timestep_ok(node: Tensor) -> bool:
    (a,) = _srcs(node, 1)
    dim = node.i32(0)
    return (
        a is not None
        and float_io(node, a)
        and dim >= 0
        and node.i32(1) > 0
        and node.ne[0] >= 2 * (dim // 2)
        and node.ne[1] == a.ne[0]
        and node.ne[2] == node.ne[3] == 1
    )


@FAMILY.kernel(
    Op.TIMESTEP_EMBEDDING, "f32 timesteps -> f32 [dim, n] (p0 dim, p1 max_period)", _timestep_ok
)
def timestep_embedding(node: Tensor, context: BuildContext) -> Step:
    a_t = node.src[0]
    assert a_t is not None
    load, store = reader(a_t), writer(node)
    half = node.i32(0) // 2
    width = node.ne[0]
    neg_log = -np.log(np.float64(node.i32(1))).astype(F32)  # -logf(max_period)
    j = np.arange(half).astype(F32)
    with quiet():
        freqs = exp(neg_log * j / F32(max(half, 1)))

    def run() -> None:
        t = load().reshape(-1)  # ne0 timesteps
        args = t[:, None] * freqs[None, :]
        emb = np.zeros((t.shape[0], width), F32)
        emb[:, :half] = cos(args)
        emb[:, half : 2 * half] = sin(args)
        store(emb.reshape(_shape(node)))

    return run


# --------------------------------------------------------------------------------------------
# masks


_TRI = {
    0: lambda i0, i1: i0 >= i1,  # GGML_TRI_TYPE_UPPER_DIAG
    1: lambda i0, i1: i0 > i1,  # UPPER
    2: lambda i0, i1: i0 <= i1,  # LOWER_DIAG
    3: lambda i0, i1: i0 < i1,  # LOWER
}


def _tri_ok(node: Tensor) -> bool:
    (a,) = _srcs(node, 1)
    return a is not None and float_io(node, a) and same_shape(a, node) and node.i32(0) in _TRI


def _masked(node: Tensor, keep: Any, fill: Any) -> Step:
    """out = src where `keep` (shape (ne1, ne0), broadcast over dims 2-3) else `fill`."""
    a_t = node.src[0]
    assert a_t is not None
    load, store = reader(a_t), writer(node)

    def run() -> None:
        store(np.where(keep, load(), fill))

    return run


def _grid(node: Tensor) -> tuple[Any, Any]:
    i1, i0 = np.meshgrid(np.arange(node.ne[1]), np.arange(node.ne[0]), indexing="ij")
    return i0, i1


@FAMILY.kernel(Op.TRI, "f32|f16|bf16 (p0 tri type)", _tri_ok)
def tri(node: Tensor, context: BuildContext) -> Step:
    i0, i1 = _grid(node)
    return _masked(node, _TRI[node.i32(0)](i0, i1), F32(0.0))


def _diag_mask_ok(node: Tensor) -> bool:
    (a,) = _srcs(node, 1)
    return a is not None and float_io(node, a) and same_shape(a, node) and node.i32(0) >= 0


def _diag_mask(node: Tensor, value: Any) -> Step:
    i0, i1 = _grid(node)
    return _masked(node, ~(i0 > node.i32(0) + i1), value)


@FAMILY.kernel(Op.DIAG_MASK_INF, "f32|f16|bf16 (p0 n_past)", _diag_mask_ok)
def diag_mask_inf(node: Tensor, context: BuildContext) -> Step:
    return _diag_mask(node, F32(-np.inf))


@FAMILY.kernel(Op.DIAG_MASK_ZERO, "f32|f16|bf16 (p0 n_past)", _diag_mask_ok)
def diag_mask_zero(node: Tensor, context: BuildContext) -> Step:
    return _diag_mask(node, F32(0.0))


# --------------------------------------------------------------------------------------------
# arithmetic with special addressing


def _acc_ok(node: Tensor) -> bool:
    a, b = _srcs(node, 2)
    if a is None or b is None or not float_io(node, a, b) or not same_shape(a, node):
        return False
    es = _block(a.type)[1]
    nb1, nb2, nb3, offset = (node.i32(i) for i in range(4))
    if min(nb1, nb2, nb3, offset) < 0 or any(v % es for v in (nb1, nb2, nb3, offset)):
        return False
    last = offset + sum((n - 1) * s for n, s in zip(b.ne, (es, nb1, nb2, nb3), strict=True))
    return last < a.nelements * es


@FAMILY.kernel(Op.ACC, "f32|f16|bf16 (p0..p3 nb1, nb2, nb3, offset in bytes of src0)", _acc_ok)
def acc(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    load_a, load_b, store = reader(a_t), reader(b_t), writer(node)
    es = _block(a_t.type)[1]
    nb1, nb2, nb3, offset = (node.i32(i) // es for i in range(4))
    i3, i2, i1, i0 = np.meshgrid(*(np.arange(n) for n in _shape(b_t)), indexing="ij")
    index = offset + i0 + i1 * nb1 + i2 * nb2 + i3 * nb3  # element offsets inside src0
    shape = _shape(node)

    def run() -> None:
        flat = np.array(load_a(), dtype=F32).reshape(-1)  # a copy: src0 stays intact
        flat[index] = flat[index] + load_b()
        store(flat.reshape(shape))

    return run


def _add1_ok(node: Tensor) -> bool:
    a, b = _srcs(node, 2)
    if a is None or b is None or b.nelements != 1 or not same_shape(a, node):
        return False
    if not (convert.can_load(a.type) and convert.can_load(b.type) and convert.can_store(node.type)):
        return False
    return node.ne[0] % _block(node.type)[0] == 0


@FAMILY.kernel(Op.ADD1, "f32|f16|bf16|quantized + scalar", _add1_ok)
def add1(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    load_a, load_b, store = reader(a_t), reader(b_t), writer(node)

    def run() -> None:
        store(load_a() + load_b().reshape(()))

    return run


def _add_id_ok(node: Tensor) -> bool:
    a, b, ids = _srcs(node, 3)
    return (
        a is not None
        and b is not None
        and ids is not None
        and float_io(node, a, b)
        and ids.type == GgmlType.I32
        and same_shape(a, node)
        and b.ne[0] == a.ne[0]
        and ids.ne[0] == a.ne[1]
        and ids.ne[1] == a.ne[2]
    )


@FAMILY.kernel(Op.ADD_ID, "f32|f16|bf16 + src1 rows chosen by i32 ids", _add_id_ok)
def add_id(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t, ids_t = node.src[0], node.src[1], node.src[2]
    assert a_t is not None and b_t is not None and ids_t is not None
    load_a, load_b, store = reader(a_t), reader(b_t), writer(node)
    ids = plain_view(ids_t)
    n_rows = b_t.ne[1]

    def run() -> None:
        idx = ids[0, 0]  # (a.ne2, a.ne1)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n_rows):
            raise ComputeError(f"ADD_ID: row id out of range [0, {n_rows})")
        rows = load_b()[0, 0][idx]  # (a.ne2, a.ne1, ne0)
        store(load_a() + rows[None])

    return run


def _ssm_conv_ok(node: Tensor) -> bool:
    sx, c = _srcs(node, 2)
    if sx is None or c is None or not float_io(node, sx, c):
        return False
    d_conv, d_inner = c.ne[0], c.ne[1]
    return (
        node.ne[0] == d_inner
        and sx.ne[1] == d_inner
        and sx.ne[0] >= d_conv - 1 + node.ne[1]
        and node.ne[2] == sx.ne[2]
        and node.ne[3] == sx.ne[3] == c.ne[2] == c.ne[3] == 1
        and d_conv > 0
    )


@FAMILY.kernel(
    Op.SSM_CONV, "f32 sx [d_conv-1+n_t, d_inner, n_s] * c [d_conv, d_inner]", _ssm_conv_ok
)
def ssm_conv(node: Tensor, context: BuildContext) -> Step:
    sx_t, c_t = node.src[0], node.src[1]
    assert sx_t is not None and c_t is not None
    load_s, load_c, store = reader(sx_t), reader(c_t), writer(node)
    d_conv, n_t = c_t.ne[0], node.ne[1]

    def run() -> None:
        s = load_s()[0]  # (n_s, d_inner, d_conv - 1 + n_t)
        w = load_c()[0, 0]  # (d_inner, d_conv)
        total = np.zeros(s.shape[:2] + (n_t,), F32)
        for k in range(d_conv):  # float32 running sum in ggml's order
            total += s[:, :, k : k + n_t] * w[None, :, k : k + 1]
        store(total.transpose(0, 2, 1)[None])

    return run
