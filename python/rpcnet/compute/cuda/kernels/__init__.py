"""The CUDA kernels in the shared kernel registry, under device "cuda".

Each entry's `supports` is exactly what its launcher (launch.py) handles: the launchers are
written for the layouts llama.cpp's graphs use (contiguous activations, weights in rows of
blocks), so a node outside them is rejected at plan time ("unsupported ... on cuda": the client
is closed), never computed on the host behind its back.

Importing this module registers the entries and imports neither CuPy nor launch.py (which
imports the CuPy backend module, itself CuPy-free): builders run only for nodes in buffers of a
cuda device, whose backend is a `CudaBackend`. Entries whose steps call cuBLAS through CuPy or
allocate CuPy temporaries (prefill, the xp kernels that are not `out=` only) are registered
`capturable=False`: a CUDA graph cannot record them, so a plan with one runs eagerly.

(op, types) the CPU device has and these entries do not cover are listed with the reason in
`NOT_YET_ON_CUDA` (tests/test_cuda_registry.py prints them).
"""

from __future__ import annotations

#: (op, what is missing) the CPU device serves that no cuda entry covers yet: documented gaps,
#: not silent fallbacks (a graph with such a node is refused at plan time on cuda).
NOT_YET_ON_CUDA: dict[str, str] = {
    "FLASH_ATTN_EXT": "more than 32 query rows with quantized or bf16 K/V, and mixed K/V types "
    "other than f16 with q8_0",
    "GLU": "the split form (one source, halves) and SWIGLU_CLAMP",
    "SOFT_MAX": "ALiBi (max_bias > 0) and non-contiguous inputs",
    "ROPE": "MROPE/IMROPE/VISION and f16 (kernels exist, builders do not)",
    "NORM": "f16/bf16 (f32 runs as an xp kernel; the CUDA C rpc_norm_f32 has no builder yet)",
    "MUL_MAT": "quantized or bf16 weights in batched (ne2/ne3 > 1) or strided products",
    "CPY": "to and from quantized types and i32",
    "ARGSORT": "f16/bf16 inputs",
    "CLAMP": "f16/bf16",
    "SUM_ROWS": "f16/bf16",
    "PAD": "circular padding, bf16 and integer types",
    **{
        op: "no CUDA kernel yet"
        for op in (
            "ACC ADD1 ADD_ID ARANGE ARGMAX CONCAT COUNT_EQUAL CUMSUM DIAG_MASK_INF "
            "DIAG_MASK_ZERO FILL GROUP_NORM L2_NORM LEAKY_RELU MEAN REPEAT SSM_CONV SUM "
            "TIMESTEP_EMBEDDING TOP_K TRI"
        ).split()
    },
}

# Importing the families registers their entries.
from rpcnet.compute.cuda.kernels import (  # noqa: E402
    array_code,
    attention,
    elementwise,
    group_attention,
    groups,
    matmul,
    rows,
)

__all__ = [
    "NOT_YET_ON_CUDA",
    "array_code",
    "attention",
    "elementwise",
    "group_attention",
    "groups",
    "matmul",
    "rows",
]
