"""MUL_MAT_ID: per-token expert matmuls, out[:, e, t] = experts[ids[e, t]] · b[:, e % b.ne1, t].

src0 experts [K, M, n_expert] (any loadable type), src1 b [K, n_used or 1, n_tok] (f32/f16),
src2 ids I32 [n_used, n_tok]; out F32 [M, n_used, n_tok]. Rows are grouped by expert so each
selected expert is decoded once per run and multiplied against all its rows at once.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rpcnet.compute import convert
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.kernels.kernel_table import Step, kernel
from rpcnet.compute.kernels.operands import vec_dot_operand
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

f32 = np.float32


def supported_operands(node: Tensor) -> tuple[Tensor, Tensor] | None:
    """(experts, b) when MUL_MAT_ID's shapes and id/output types fit, whatever computes it."""
    a, b, ids = node.src[0], node.src[1], node.src[2] if len(node.src) > 2 else None
    if (
        a is None
        or b is None
        or ids is None
        or ids.type != GgmlType.I32
        or node.type != GgmlType.F32
    ):
        return None
    k, m, n_exp = a.ne[0], a.ne[1], a.ne[2]
    n_used, n_tok = ids.ne[0], ids.ne[1]
    fits = (
        a.ne[3] == 1
        and b.ne[0] == k
        and b.ne[3] == 1
        and b.ne[1] > 0
        and n_used % b.ne[1] == 0
        and b.ne[2] == n_tok
        and ids.ne[2] == 1
        and ids.ne[3] == 1
        and n_exp > 0
        and tuple(node.ne) == (m, n_used, n_tok, 1)
    )
    return (a, b) if fits else None


def _supported(node: Tensor) -> bool:
    operands = supported_operands(node)
    return operands is not None and all(convert.can_load(t.type) for t in operands)


@kernel(Op.MUL_MAT_ID, "f32|f16|bf16|quantized experts x f32|f16 -> f32", _supported)
def mul_mat_id(node: Tensor) -> Step:
    a_t, b_t, ids_t = node.src[0], node.src[1], node.src[2]
    assert a_t is not None and b_t is not None and ids_t is not None
    n_exp = a_t.ne[2]
    experts: dict[int, Tensor] = {}  # (K, M) descriptors, made when a token first selects one

    def expert(e: int) -> Tensor:
        t = experts.get(e)
        if t is None:
            ne = (a_t.ne[0], a_t.ne[1], 1, 1)
            t = dataclasses.replace(a_t, ne=ne, offset=a_t.offset + e * a_t.nb[2], src=())
            experts[e] = t
        return t

    ids_v = plain_view(ids_t)[0, 0]  # (n_tok, n_used)
    out = plain_view(node)[0]  # (n_tok, n_used, M)
    b_ne1 = b_t.ne[1]

    def run() -> None:
        ids = np.asarray(ids_v)
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= n_exp):
            raise ComputeError(f"MUL_MAT_ID: expert id out of range [0, {n_exp})")
        b = vec_dot_operand(convert.load_f32(b_t)[0], a_t.type)  # (n_tok, b.ne1, K)
        flat = ids.reshape(-1)
        order = np.argsort(flat, kind="stable")
        sorted_ids = flat[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        ends = np.r_[starts[1:], sorted_ids.size]
        n_used = ids.shape[1]
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            sel = order[s:e]
            tok, slot = sel // n_used, sel % n_used
            w = convert.load_f32(expert(int(sorted_ids[s])))[0, 0]  # (M, K)
            rows = b[tok, slot % b_ne1]  # (n, K)
            out[tok, slot] = rows @ w.T

    return run
