"""ggml block formats: vectorised (NumPy/CuPy) dequantizers and ggml-bit-exact quantizers.

dequantize(type_id, raw, n_rows, row_elems, xp=numpy) -> float32 (n_rows, row_elems)
quantize(type_id, x, xp=numpy)                          -> uint8 (n_rows, row_bytes)
quantize_cpu(type_id, x, xp=numpy)                      -> as ggml-cpu converts on this host
dequantizable_types() / quantizable_types()             -> frozenset of ggml type ids
row_bytes(type_id, row_elems)                           -> int

Type ids are ``rpcnet.ggml_types.GgmlType`` members (or plain ints).
"""

from rpcnet.compute.quant.codecs import (
    block_size,
    dequantizable_types,
    dequantize,
    quantizable_types,
    quantize,
    quantize_cpu,
    row_bytes,
    type_size,
)

__all__ = [
    "block_size",
    "dequantizable_types",
    "dequantize",
    "quantizable_types",
    "quantize",
    "quantize_cpu",
    "row_bytes",
    "type_size",
]
