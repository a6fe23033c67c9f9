"""cuda builders written as array code against the backend's array module (`be.cp`: CuPy on a
GPU; the strict stand-in in tests)."""

from __future__ import annotations

from rpcnet.compute.cuda.kernels import common
from rpcnet.compute.kernels.kernel_table import Step
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor

# ---------------------------------------------------------------------------------- xp kernels
# Small ops of the MoE router and of encoders, written against the backend's array module
# (`be.cp`: CuPy on a GPU; NumPy in the host tests, which compare them with the CPU kernels).
# Those that write through `out=` views only allocate nothing while they run; the others
# (NORM, SUM_ROWS, ARGSORT, the 3-D GET_ROWS) are registered uncapturable.


# NORM: the mean and variance are CuPy temporaries
@common.uncapturable(Op.NORM, "f32 (xp)", lambda n: common._f32_source(n) is not None)
def cuda_norm(node: Tensor) -> Step:
    (src,) = common._need(node, 1)
    be = common._backend(node)
    x, dst, eps = common._view(src), common._view(node), node.f32(0)

    def run() -> None:
        xp = be.cp
        with be.device, be.stream:
            d = x - x.mean(axis=-1, keepdims=True, dtype=xp.float32)
            var = (d * d).mean(axis=-1, keepdims=True, dtype=xp.float32)
            xp.multiply(d, 1.0 / xp.sqrt(var + xp.float32(eps)), out=dst)

    return run


def _sum_rows_ok(node: Tensor) -> bool:
    s = common._srcs(node, 1)
    return (
        s is not None
        and s[0].type == common.F32
        and node.type == common.F32
        and node.ne == (1, *s[0].ne[1:])
    )


@common.uncapturable(Op.SUM_ROWS, "f32 (xp)", _sum_rows_ok)  # a reduction
def cuda_sum_rows(node: Tensor) -> Step:
    (src,) = common._need(node, 1)
    be = common._backend(node)
    x, dst = common._view(src), common._view(node)

    def run() -> None:
        with be.device, be.stream:
            x.sum(axis=-1, keepdims=True, out=dst)

    return run


@common.cuda_kernel(Op.CLAMP, "f32 (xp)", lambda n: common._f32_source(n) is not None)
def cuda_clamp(node: Tensor) -> Step:
    (src,) = common._need(node, 1)
    be = common._backend(node)
    x, dst, lo, hi = common._view(src), common._view(node), node.f32(0), node.f32(1)

    def run() -> None:
        xp = be.cp
        with be.device, be.stream:
            xp.minimum(x, xp.float32(hi), out=dst)
            xp.maximum(dst, xp.float32(lo), out=dst)

    return run


def _argsort_ok(node: Tensor) -> bool:
    return common._f32_source(node, common.I32) is not None and node.i32(0) in (0, 1)


@common.uncapturable(Op.ARGSORT, "f32 -> i32 (xp; p0: 0 asc, 1 desc)", _argsort_ok)
def cuda_argsort(node: Tensor) -> Step:
    (src,) = common._need(node, 1)
    be = common._backend(node)
    x, dst, desc = common._view(src), common._view(node), node.i32(0) == 1

    def run() -> None:
        xp = be.cp
        with be.device, be.stream:
            # stable, largest first for desc (ties keep index order, like the CPU kernel)
            order = xp.argsort(-x if desc else x, axis=-1, kind="stable")
            dst[...] = order.astype(xp.int32)

    return run


def _get_rows_f32_ok(node: Tensor) -> bool:
    s = common._srcs(node, 2)
    if s is None or node.type != common.F32:
        return False
    src, ids = s
    return (
        src.type == common.F32
        and ids.type == common.I32
        and src.ne[2] == ids.ne[1]
        and src.ne[3] == ids.ne[2]
        and ids.ne[3] == 1
        and node.ne == (src.ne[0], ids.ne[0], ids.ne[1], ids.ne[2])
    )


@common.xp_fallback(
    Op.GET_ROWS, "f32 x i32 ids, 3-D batches (xp: the MoE weights)", _get_rows_f32_ok
)
def cuda_get_rows_batched(node: Tensor) -> Step:
    src, ids = common._need(node, 2)
    be = common._backend(node)
    x, idx, dst = common._view(src), common._view(ids), common._view(node)

    def run() -> None:
        xp = be.cp
        with be.device, be.stream:
            rows = idx[0].astype(xp.int64)[..., None]  # (ne12, ne11, n, 1)
            dst[...] = xp.take_along_axis(x, rows, axis=2)  # (ne12, ne11, n, ne0)

    return run


def _pad_ok(node: Tensor) -> bool:
    s = common._srcs(node, 1)
    if (
        s is None
        or s[0].type != node.type
        or node.type not in (common.F32, common.F16)
        or node.i32(8)
    ):
        return False
    a = s[0]
    pads = [node.i32(i) for i in range(8)]
    return all(
        pads[2 * d] >= 0
        and pads[2 * d + 1] >= 0
        and a.ne[d] > 0
        and node.ne[d] == a.ne[d] + pads[2 * d] + pads[2 * d + 1]
        for d in range(4)
    )


@common.cuda_kernel(Op.PAD, "f32|f16 zero padding (xp; p0..p7 lp/rp per dim)", _pad_ok)
def cuda_pad(node: Tensor) -> Step:
    (src,) = common._need(node, 1)
    be = common._backend(node)
    a, dst = common._view(src), common._view(node)
    inner = tuple(slice(node.i32(2 * d), node.i32(2 * d) + src.ne[d]) for d in (3, 2, 1, 0))

    def run() -> None:
        with be.device, be.stream:
            dst.fill(0)
            dst[inner] = a

    return run
