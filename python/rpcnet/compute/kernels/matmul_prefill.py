"""MUL_MAT for prompts with f16/bf16 weights: one BLAS GEMM per block of weight rows.

From PREFILL_ROWS activation rows on, a matmul is compute-bound. For f16/bf16 weights the
exact products (f16 x f16 and bf16 x bf16 fit in float32) leave only the summation order to
differ from ggml's, so a BLAS GEMM keeps the logits within float noise and runs far above the
row-dot kernel's speed. Weights are converted a block of rows at a time and never cached: what
this kernel holds is bounded by its chunk (compute/scratch.py), not by the model.
"""

from __future__ import annotations

from rpcnet.compute import convert, scratch
from rpcnet.compute.kernels.matmul import (
    _supported as generic_supported,
)
from rpcnet.compute.kernels.matmul import (
    batched_matmul,
    weight_chunk_bytes,
    weight_chunks,
)
from rpcnet.compute.kernels.operands import vec_dot_operand
from rpcnet.compute.kernels.registry import PREFILL, Step, kernel
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

PREFILL_ROWS = 32  # activation rows from which the GEMM beats reading the weights row by row
PREFILL_CHUNK = 32 << 20  # float32 bytes of weight rows converted at once (stays in cache-ish)
# Stored half-precision weights only: f32 operands are as often intermediate activations (e.g.
# a cast K), whose products keep ggml's order so a float-noise difference cannot flip a later
# rounding.
FLOAT_WEIGHTS = {GgmlType.F16, GgmlType.BF16}


def _supported(node: Tensor) -> bool:
    a, b = node.src[0], node.src[1]
    if a is None or b is None or a.type not in FLOAT_WEIGHTS or b.type != GgmlType.F32:
        return False
    # weight matrices only: attention products against the KV cache (batched over heads) keep
    # ggml's order, where a float-noise difference could flip a later rounding
    weights = a.ne[2] == 1 and a.ne[3] == 1
    return weights and b.ne[1] >= PREFILL_ROWS and generic_supported(node)


def _chunk(node: Tensor) -> int:
    device = getattr(node.buffer, "device", None)
    budget = getattr(device, "scratch", None)
    return min(PREFILL_CHUNK, weight_chunk_bytes(getattr(budget, "limit", None)))


@kernel(Op.MUL_MAT, "f16|bf16 x f32 -> f32, N >= 32 (BLAS GEMM)", _supported, priority=PREFILL)
def mul_mat_prefill(node: Tensor) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    out = plain_view(node)
    chunks = weight_chunks(a_t, _chunk(node), always=True)

    def run() -> None:
        b = vec_dot_operand(convert.load_f32(b_t), a_t.type)  # f16/bf16-rounded like ggml
        for m0, m1, part in chunks:
            batched_matmul(b, convert.load_f32(part), out[..., m0:m1])

    return run


# Temporaries: one converted block of weight rows, the activations (loaded and rounded), the
# GEMM's result before it lands in the output.
scratch.register(
    mul_mat_prefill.__name__,
    lambda node: (
        min(_chunk(node), scratch.logical_f32(node.src[0]))
        + 2 * scratch.logical_f32(node.src[1])
        + scratch.logical_f32(node)
    ),
)
