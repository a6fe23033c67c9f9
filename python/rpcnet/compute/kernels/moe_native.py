"""MUL_MAT_ID fast path: the whole node in one native step (`_native.mul_mat_id_step`).

The step routes the tokens to their experts, converts each activation row once to the experts'
vec_dot type (a token's row serves every expert it selects), reads each selected expert's
weights once and spreads (expert, weight-row chunk) tasks over the threads: ggml's conversion
and per-expert order, as for MUL_MAT (see `moe.mul_mat_id` for the op's contract). Being a
native step, it runs inside the plan's detached runs with its neighbours, with no Python
between them. Other layouts (strided elements, f16 activations) take the NumPy kernel.
"""

from __future__ import annotations

from rpcnet import _native
from rpcnet.compute import scratch
from rpcnet.compute.kernels.kernel_table import NATIVE, Step, kernel
from rpcnet.compute.kernels.matmul_native import weight_layout
from rpcnet.compute.kernels.moe import supported_operands
from rpcnet.compute.kernels.native_args import (
    device_threads,
    disjoint,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType


def _supported(node: Tensor) -> bool:
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


@kernel(
    Op.MUL_MAT_ID, "any supported expert type x f32 -> f32 (native)", _supported, priority=NATIVE
)
def mul_mat_id_native(node: Tensor) -> Step:
    a_t, b_t, ids_t = node.src[0], node.src[1], node.src[2]
    assert a_t is not None and b_t is not None and ids_t is not None
    block = (_native.matmul_quant_block(a_t.type) or (1, 0, 0))[0]
    return _native.mul_mat_id_step(
        a_t.type,
        tensor_arg(a_t, ne0=a_t.ne[0] // block),
        tensor_arg(b_t),
        tensor_arg(ids_t),
        tensor_arg(node),
        device_threads(node),
    )


def _scratch(node: Tensor) -> int:
    """Every activation row converted once, each expert's rows gathered, results per thread."""
    a, b = node.src[0], node.src[1]
    k = a.ne[0] if a is not None else 0
    rows = b.ne[1] * b.ne[2] if b is not None else 0
    routed = node.ne[1] * node.ne[2]
    return 4 * k * rows + 2 * 4 * k * routed + scratch.logical_f32(node)


scratch.register(mul_mat_id_native.__name__, _scratch)
