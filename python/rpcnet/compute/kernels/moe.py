"""MUL_MAT_ID: per-token expert matmuls, out[:, e, t] = experts[ids[e, t]] · b[:, e % b.ne1, t].

src0 experts [K, M, n_expert] (any loadable type), src1 b [K, n_used or 1, n_tok] (f32/f16),
src2 ids I32 [n_used, n_tok]; out F32 [M, n_used, n_tok]. Rows are grouped by expert so each
selected expert is decoded once per run and multiplied against all its rows at once.

The native kernel runs the whole node in one step (`_native.mul_mat_id_step`): it routes the
tokens to their experts, converts each activation row once to the experts' vec_dot type (a
token's row serves every expert it selects), reads each selected expert's weights once and
spreads (expert, weight-row chunk) tasks over the threads: ggml's conversion and per-expert
order, as for MUL_MAT. Being a native step, it runs inside the plan's detached runs with its
neighbours, with no Python between them. Other layouts (strided elements, f16 activations) take
the NumPy kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from rpcnet import _native
from rpcnet.compute import convert
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.kernels.kernel_table import NATIVE, BuildContext, OpFamily, Step
from rpcnet.compute.kernels.matmul import weight_layout
from rpcnet.compute.kernels.native_args import disjoint, rows_contiguous, tensor_arg
from rpcnet.compute.kernels.operands import vec_dot_operand
from rpcnet.compute.ops import Op
from rpcnet.compute.scratch import F32 as F32_BYTES
from rpcnet.compute.scratch import logical_f32
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily("moe", cuda=("rpcnet.compute.cuda.kernels.matmul",))

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


def expert_groups(ids: np.ndarray) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(expert, tokens, slots) for each expert that `ids` [n_tok, n_used] selects, in expert
    order, its selections in token order."""
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    sorted_ids = flat[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    ends = np.r_[starts[1:], sorted_ids.size]
    n_used = ids.shape[1]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        sel = order[s:e]
        yield int(sorted_ids[s]), sel // n_used, sel % n_used


@FAMILY.kernel(Op.MUL_MAT_ID, "f32|f16|bf16|quantized experts x f32|f16 -> f32", _supported)
def mul_mat_id(node: Tensor, context: BuildContext) -> Step:
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
        for e, tok, slot in expert_groups(ids):
            w = convert.load_f32(expert(e))[0, 0]  # (M, K)
            rows = b[tok, slot % b_ne1]  # (n, K)
            out[tok, slot] = rows @ w.T

    return run


@FAMILY.scratch_rule(Op.MUL_MAT_ID)
def _scratch(node: Tensor, limit: int | None) -> int:
    """One expert dequantized, the activations converted and rounded, the products, NumPy's
    copies of the ids (sorted, gathered)."""
    a, b = node.src[0], node.src[1]
    one_expert = 0 if a is None else a.ne[0] * a.ne[1] * F32_BYTES * 5 // 4
    ids = node.src[2] if len(node.src) > 2 else None
    return one_expert + 2 * logical_f32(b) + 2 * logical_f32(node) + 4 * logical_f32(ids)


# --- native kernel ---------------------------------------------------------------------------


def _native_supported(node: Tensor) -> bool:
    operands = supported_operands(node)
    if operands is None:
        return False
    a, b = operands
    ids = node.src[2]
    assert ids is not None
    return (
        b.type == GgmlType.F32
        and weight_layout(a) is not None
        and rows_contiguous(b, 4)
        and rows_contiguous(ids, 4)
        and rows_contiguous(node, 4)
        and all(_apart(node, t) for t in (a, b, ids))
    )


def _apart(node: Tensor, t: Tensor) -> bool:
    """The output does not overlap operand `t` (the step reads its inputs while it writes)."""
    return node.buffer is None or t.buffer is not node.buffer or disjoint(node, t)


def _native_scratch(node: Tensor, limit: int | None) -> int:
    """Every activation row converted once, each expert's rows gathered, results per thread."""
    a, b = node.src[0], node.src[1]
    k = a.ne[0] if a is not None else 0
    rows = b.ne[1] * b.ne[2] if b is not None else 0
    routed = node.ne[1] * node.ne[2]
    return 4 * k * rows + 2 * 4 * k * routed + logical_f32(node)


@FAMILY.kernel(
    Op.MUL_MAT_ID,
    "any supported expert type x f32 -> f32 (native)",
    _native_supported,
    NATIVE,
    _native_scratch,
)
def mul_mat_id_native(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t, ids_t = node.src[0], node.src[1], node.src[2]
    assert a_t is not None and b_t is not None and ids_t is not None
    block = (_native.matmul_quant_block(a_t.type) or (1, 0, 0))[0]
    return _native.mul_mat_id_step(
        a_t.type,
        tensor_arg(a_t, ne0=a_t.ne[0] // block),
        tensor_arg(b_t),
        tensor_arg(ids_t),
        tensor_arg(node),
        context.threads,
    )
