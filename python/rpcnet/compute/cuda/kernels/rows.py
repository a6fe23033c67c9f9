"""cuda builders that move rows: CPY, GET_ROWS, SET_ROWS."""

from __future__ import annotations

from rpcnet.compute.cuda.kernels import common
from rpcnet.compute.kernels.kernel_table import Step
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

# ---------------------------------------------------------------------------------- copies


def _cpy_ok(node: Tensor) -> bool:
    s = common._srcs(node, 1)
    return (
        s is not None
        and s[0].type in common._CPY_TYPES
        and node.type in common._CPY_TYPES
        and s[0].ne[0] * s[0].ne[1] * s[0].ne[2] * s[0].ne[3] == node.nelements
    )


def _cpy(node: Tensor) -> Step:
    (src,) = common._need(node, 1)
    be, launch = common._backend(node), common._launch_module()
    s, d = common._typed(src), common._typed(node)
    return lambda: launch.cpy(be, s, d)


for _op in (Op.CPY, Op.DUP, Op.CONT):
    common.cuda_kernel(_op, "f32/f16/bf16 -> f32/f16/bf16, any layout", _cpy_ok)(_cpy)


# ---------------------------------------------------------------------------------- rows


@common.on_contiguous_f32(2)
def _get_rows_ok(node: Tensor, src: Tensor, ids: Tensor) -> bool:
    return (
        common._weight_type(src) is not None
        and src.ne[2] == src.ne[3] == 1
        and src.nb[1] == common._row_bytes(src)
        and ids.type == common.I32
        and ids.ne[1] == ids.ne[2] == ids.ne[3] == 1
        and common._contiguous(ids)
        and node.ne == (src.ne[0], ids.ne[0], 1, 1)
    )


@common.cuda_kernel(Op.GET_ROWS, "all 16 weight types x i32 ids -> f32 (2-D)", _get_rows_ok)
def cuda_get_rows(node: Tensor) -> Step:
    src, ids = common._need(node, 2)
    be, launch, wt = common._backend(node), common._launch_module(), common._weight_type(src)
    w, vi, dst, k = common._raw(src), common._view(ids, (ids.ne[0],)), common._view(node), src.ne[0]
    return lambda: launch.get_rows(be, wt, w, vi, dst, k)


def _set_rows_ok(node: Tensor) -> bool:
    s = common._srcs(node, 2)
    if s is None or node.type not in common._SET_ROWS_DST:
        return False
    src, ids = s
    k = node.ne[0]
    return (
        src.type == common.F32
        and common._contiguous(src)
        and src.ne[0] == k
        and src.ne[2] == src.ne[3] == 1
        and ids.type in (common.I32, common.I64)
        and common._contiguous(ids)
        and ids.ne[0] == src.ne[1]
        and ids.ne[1] == ids.ne[2] == ids.ne[3] == 1
        and node.ne[2] == node.ne[3] == 1
        and node.nb[1] == common._row_bytes(node)
        and (node.type != GgmlType.Q8_0 or k % 32 == 0)
    )


@common.cuda_kernel(Op.SET_ROWS, "f32 x i32|i64 ids -> f32/f16/bf16/q8_0 (2-D)", _set_rows_ok)
def cuda_set_rows(node: Tensor) -> Step:
    src, ids = common._need(node, 2)
    be, launch, dst_type = (
        common._backend(node),
        common._launch_module(),
        common._SET_ROWS_DST[GgmlType(node.type)],
    )
    vs = common._view(src, (src.ne[1], src.ne[0]))
    vi, dst = common._view(ids, (ids.ne[0],)), common._raw(node)
    return lambda: launch.set_rows(be, vs, vi, dst, dst_type)
