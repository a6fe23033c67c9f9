"""MUL_MAT_ID fast path: each selected expert's weights read in block form by the native kernel.

Same contract as `moe.mul_mat_id` (rows grouped by expert, each expert read once per run), with
`_native.matmul_quant` instead of a float32 copy of the expert: ggml's activation conversion and
vec_dot order, as for MUL_MAT.
"""

from __future__ import annotations

import numpy as np

from rpcnet import _native
from rpcnet.compute import scratch
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.kernels.kernel_table import NATIVE, Step, kernel
from rpcnet.compute.kernels.matmul_native import weight_layout, weight_rows
from rpcnet.compute.kernels.moe import supported_operands
from rpcnet.compute.kernels.native_args import device_threads
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType


def _supported(node: Tensor) -> bool:
    operands = supported_operands(node)
    if operands is None:
        return False
    a, b = operands
    return b.type == GgmlType.F32 and weight_layout(a) is not None


@kernel(
    Op.MUL_MAT_ID, "any supported expert type x f32 -> f32 (native)", _supported, priority=NATIVE
)
def mul_mat_id_native(node: Tensor) -> Step:
    a_t, b_t, ids_t = node.src[0], node.src[1], node.src[2]
    assert a_t is not None and b_t is not None and ids_t is not None
    layout = weight_layout(a_t)
    assert layout is not None
    row = layout[0]
    k, m, n_exp = a_t.ne[0], a_t.ne[1], a_t.ne[2]
    type_id, stride, threads = a_t.type, a_t.nb[1], device_threads(node)
    ids_v = plain_view(ids_t)[0, 0]  # (n_tok, n_used)
    b_v = plain_view(b_t)[0]  # (n_tok, b.ne1, K)
    out = plain_view(node)[0]  # (n_tok, n_used, M)
    b_ne1 = b_t.ne[1]
    experts: dict[int, np.ndarray] = {}

    def expert(e: int) -> np.ndarray:
        w = experts.get(e)
        if w is None:
            w = experts[e] = weight_rows(a_t, a_t.offset + e * a_t.nb[2], row)
        return w

    def run() -> None:
        ids = np.asarray(ids_v)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n_exp):
            raise ComputeError(f"MUL_MAT_ID: expert id out of range [0, {n_exp})")
        flat = ids.reshape(-1)
        order = np.argsort(flat, kind="stable")
        sorted_ids = flat[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        ends = np.r_[starts[1:], sorted_ids.size]
        n_used = ids.shape[1]
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            sel = order[s:e]
            tok, slot = sel // n_used, sel % n_used
            rows = np.ascontiguousarray(b_v[tok, slot % b_ne1], dtype=np.float32).reshape(-1, k)
            res = np.empty((rows.shape[0], m), dtype=np.float32)
            _native.matmul_quant(type_id, expert(int(sorted_ids[s])), stride, rows, res, threads)
            out[tok, slot] = res

    return run


def _scratch(node: Tensor) -> int:
    """Gathered activation rows (one per (token, slot), at most), their converted copy, results."""
    a = node.src[0]
    k = a.ne[0] if a is not None else 0
    gathered = 4 * k * node.ne[1] * node.ne[2]
    return 2 * gathered + 2 * scratch.logical_f32(node) + scratch.logical_f32(node.src[2])


scratch.register(mul_mat_id_native.__name__, _scratch)
