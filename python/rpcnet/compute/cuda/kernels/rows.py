"""cuda builders that move rows: CPY, GET_ROWS, SET_ROWS."""

from __future__ import annotations

from rpcnet.compute.cuda.kernels.common import (
    _CPY_TYPES,
    _SET_ROWS_DST,
    CUDA,
    F32,
    I32,
    I64,
    _backend,
    _contiguous,
    _launch_module,
    _need,
    _raw,
    _row_bytes,
    _srcs,
    _typed,
    _view,
    _weight_type,
)
from rpcnet.compute.kernels.kernel_table import Step, kernel
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType

# ---------------------------------------------------------------------------------- copies


def _cpy_ok(node: Tensor) -> bool:
    s = _srcs(node, 1)
    return (
        s is not None
        and s[0].type in _CPY_TYPES
        and node.type in _CPY_TYPES
        and s[0].ne[0] * s[0].ne[1] * s[0].ne[2] * s[0].ne[3] == node.nelements
    )


def _cpy(node: Tensor) -> Step:
    (src,) = _need(node, 1)
    be, launch = _backend(node), _launch_module()
    s, d = _typed(src), _typed(node)
    return lambda: launch.cpy(be, s, d)


for _op in (Op.CPY, Op.DUP, Op.CONT):
    kernel(_op, "f32/f16/bf16 -> f32/f16/bf16, any layout", _cpy_ok, device=CUDA)(_cpy)


# ---------------------------------------------------------------------------------- rows


def _get_rows_ok(node: Tensor) -> bool:
    s = _srcs(node, 2)
    if s is None or node.type != F32 or not _contiguous(node):
        return False
    src, ids = s
    return (
        _weight_type(src) is not None
        and src.ne[2] == src.ne[3] == 1
        and src.nb[1] == _row_bytes(src)
        and ids.type == I32
        and ids.ne[1] == ids.ne[2] == ids.ne[3] == 1
        and _contiguous(ids)
        and node.ne == (src.ne[0], ids.ne[0], 1, 1)
    )


@kernel(Op.GET_ROWS, "all 16 weight types x i32 ids -> f32 (2-D)", _get_rows_ok, device=CUDA)
def cuda_get_rows(node: Tensor) -> Step:
    src, ids = _need(node, 2)
    be, launch, wt = _backend(node), _launch_module(), _weight_type(src)
    w, vi, dst, k = _raw(src), _view(ids, (ids.ne[0],)), _view(node), src.ne[0]
    return lambda: launch.get_rows(be, wt, w, vi, dst, k)


def _set_rows_ok(node: Tensor) -> bool:
    s = _srcs(node, 2)
    if s is None or node.type not in _SET_ROWS_DST:
        return False
    src, ids = s
    k = node.ne[0]
    return (
        src.type == F32
        and _contiguous(src)
        and src.ne[0] == k
        and src.ne[2] == src.ne[3] == 1
        and ids.type in (I32, I64)
        and _contiguous(ids)
        and ids.ne[0] == src.ne[1]
        and ids.ne[1] == ids.ne[2] == ids.ne[3] == 1
        and node.ne[2] == node.ne[3] == 1
        and node.nb[1] == _row_bytes(node)
        and (node.type != GgmlType.Q8_0 or k % 32 == 0)
    )


@kernel(Op.SET_ROWS, "f32 x i32|i64 ids -> f32/f16/bf16/q8_0 (2-D)", _set_rows_ok, device=CUDA)
def cuda_set_rows(node: Tensor) -> Step:
    src, ids = _need(node, 2)
    be, launch, dst_type = _backend(node), _launch_module(), _SET_ROWS_DST[GgmlType(node.type)]
    vs = _view(src, (src.ne[1], src.ne[0]))
    vi, dst = _view(ids, (ids.ne[0],)), _raw(node)
    return lambda: launch.set_rows(be, vs, vi, dst, dst_type)
