"""Activations as ggml's CPU dot products see them.

ggml's CPU backend converts the float32 activation (src1) of a matmul to the weight type's
`vec_dot_type` before the dot product: f16 for f16 weights, bf16 for bf16, q8_0/q8_1 for the
legacy quants and q8_K for k-/i-quants. Rounding the same way makes rpcnet's results match the
reference to float32 noise instead of to the quantization error of the activation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet.compute.views import bf16_to_f32, f32_to_bf16
from rpcnet.ggml_types import GgmlType

f32 = np.float32
T = GgmlType
# Weight types whose dot products take the activation quantized to q8_0 / q8_1 (same values)...
Q8_0_PARTNERS = frozenset(
    {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q8_1, T.IQ4_NL, T.MXFP4, T.NVFP4, T.Q1_0, T.Q2_0}
)
# ... and to q8_K (256-element blocks, float32 scale): k-quants, i-quants, ternary.
Q8_K_PARTNERS = frozenset(
    {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ2_XXS, T.IQ2_XS, T.IQ3_XXS, T.IQ1_S, T.IQ3_S}
    | {T.IQ2_S, T.IQ4_XS, T.IQ1_M, T.TQ1_0, T.TQ2_0}
)


def _q8_k_values(x: Any) -> Any:
    """Values of x after ggml's quantize_row_q8_K_ref (scale -127/max, codes clamped to 127)."""
    blocks = x.reshape(-1, 256)
    pick = np.abs(blocks).argmax(axis=1)
    peak = blocks[np.arange(blocks.shape[0]), pick]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (f32(-127.0) / peak).astype(f32)
        codes = np.minimum(f32(127), np.rint((iscale[:, None] * blocks).astype(f32)))
        d = (f32(1) / iscale).astype(f32)
        vals = np.where(peak[:, None] == 0, f32(0), d[:, None] * codes).astype(f32)
    return vals.reshape(x.shape)


def vec_dot_operand(values: Any, weight_type: int) -> Any:
    """float32 activations as ggml's CPU dot products see them against `weight_type` weights:
    rounded to the weight type's vec_dot type (f16, bf16, q8_0/q8_1 or q8_K)."""
    if weight_type == GgmlType.F16:
        return values.astype(np.float16).astype(f32)
    if weight_type == GgmlType.BF16:
        return bf16_to_f32(f32_to_bf16(values)).reshape(values.shape)
    k = values.shape[-1]
    if weight_type in Q8_0_PARTNERS and k % 32 == 0:
        from rpcnet.compute import quant

        rows = np.ascontiguousarray(values, dtype=f32).reshape(-1, k)
        packed = quant.quantize_cpu(GgmlType.Q8_0, rows)
        return quant.dequantize(GgmlType.Q8_0, packed, rows.shape[0], k).reshape(values.shape)
    if weight_type in Q8_K_PARTNERS and k % 256 == 0:
        return _q8_k_values(np.ascontiguousarray(values, dtype=f32))
    return values
