"""Which ggml ops the CUDA C kernels cover, and with which entry points.

This is the cuda side's own table (op name -> kernel entry points), kept next to the sources so
the NVRTC test can check every entry exists. The builders that launch them are registered in
the shared kernel registry under device "cuda" (`compute/cuda/kernels/`); `missing_ops()`
says which CPU ops have no cuda entry there.
"""

from __future__ import annotations

from rpcnet.compute.cuda import sources


def op_table() -> dict[str, set[str]]:
    """ggml op name -> the kernel entry points that implement it."""
    expected = sources.expected_kernels()
    return {
        "MUL_MAT": {sources.matvec_kernel(t) for t in sources.WEIGHT_TYPES}
        | expected["quantize"]
        | expected["dequantize"],
        "MUL_MAT_ID": {sources.matvec_id_kernel(t) for t in sources.WEIGHT_TYPES}
        | expected["quantize"],
        "RMS_NORM": {"rpc_rms_norm_f32", "rpc_rms_norm_mul_f32"},
        "NORM": {"rpc_norm_f32"},
        "SOFT_MAX": expected["softmax"],
        "ROPE": expected["rope"],
        "GLU": expected["glu"],
        "GET_ROWS": {k for k in expected["rows"] if k.startswith("rpc_get_rows_")},
        "SET_ROWS": {k for k in expected["rows"] if k.startswith("rpc_set_rows_")},
        "CPY": expected["cpy"],
        "DUP": expected["cpy"],
        "CONT": expected["cpy"],
        "FLASH_ATTN_EXT": expected["flash_attn"],
        **{op: {"rpc_binary_f32"} for op in ("ADD", "SUB", "MUL", "DIV")},
        **{op: {"rpc_unary_f32"} for op in ("UNARY", "SCALE", "SQR", "SQRT", "SIN", "COS", "LOG")},
    }


def missing_ops() -> list[str]:
    """CPU ops (as `rpcnet ops` lists them) that no CUDA kernel covers yet."""
    from rpcnet.compute import kernels  # noqa: F401 - registers the CPU kernels
    from rpcnet.compute.kernels.kernel_table import table
    from rpcnet.compute.ops import op_name

    covered = {op_name(k.op) for k in table("cuda")}
    return sorted({op_name(k.op) for k in table("cpu")} - covered)
