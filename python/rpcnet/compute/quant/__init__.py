"""ggml block formats: vectorised (NumPy/CuPy) dequantizers and ggml-bit-exact quantizers.

dequantize(type_id, raw, n_rows, row_elems, xp=numpy) -> float32 (n_rows, row_elems)
quantize(type_id, x, xp=numpy)                          -> uint8 (n_rows, row_bytes)
dequantizable_types() / quantizable_types()             -> frozenset of ggml type ids
row_bytes(type_id, row_elems)                           -> int
"""

from rpcnet.compute.quant.registry import (
    BF16,
    F16,
    F32,
    I32,
    I64,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    Q2_K,
    Q3_K,
    Q4_0,
    Q4_1,
    Q4_K,
    Q5_0,
    Q5_1,
    Q5_K,
    Q6_K,
    Q8_0,
    TYPE_TRAITS,
    block_size,
    dequantizable_types,
    dequantize,
    quantizable_types,
    quantize,
    row_bytes,
    type_name,
    type_size,
)

__all__ = [
    "BF16",
    "F16",
    "F32",
    "I32",
    "I64",
    "IQ4_NL",
    "IQ4_XS",
    "MXFP4",
    "Q2_K",
    "Q3_K",
    "Q4_0",
    "Q4_1",
    "Q4_K",
    "Q5_0",
    "Q5_1",
    "Q5_K",
    "Q6_K",
    "Q8_0",
    "TYPE_TRAITS",
    "block_size",
    "dequantizable_types",
    "dequantize",
    "quantizable_types",
    "quantize",
    "row_bytes",
    "type_name",
    "type_size",
]
