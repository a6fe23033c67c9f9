"""The CUDA C sources of the cuda backend: where they are and the compile options they need.

One `.cu` file is one CuPy RawModule (one NVRTC program); the `.cuh`/`.h` files next to them are
found through the include path. Nothing here needs CuPy or a driver.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SRC_DIR = Path(__file__).resolve().parent / "src"


def headers_digest() -> str:
    """A digest of every header the modules include: CuPy's kernel cache keys a module by its
    source and options only, so a header change must change an option."""
    h = hashlib.sha256()
    for path in sorted([*SRC_DIR.glob("*.cuh"), *SRC_DIR.glob("*.h")]):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


#: NVRTC options every module is compiled with. The architecture is not among them: CuPy adds
#: the device's own (-arch=compute_XY), and the NVRTC test adds sm_80 and sm_90.
COMPILE_OPTIONS: tuple[str, ...] = (
    f"--include-path={SRC_DIR}",
    f"-DRPC_HEADERS_DIGEST=0x{headers_digest()}ull",
)


def module_names() -> list[str]:
    """Every kernel module (a `.cu` file's stem), sorted."""
    return sorted(p.stem for p in SRC_DIR.glob("*.cu"))


def module_path(name: str) -> Path:
    return SRC_DIR / f"{name}.cu"


def module_source(name: str) -> str:
    return module_path(name).read_text()


def arch_option(major: int, minor: int) -> str:
    """The virtual architecture flag for compute capability major.minor (e.g. compute_90)."""
    return f"--gpu-architecture=compute_{major}{minor}"


#: ggml type name -> kernel-name suffix, as in blocks.cuh's RPC_FOR_*_TYPES.
FLOAT_TYPES: dict[str, str] = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
QUANT_TYPES: dict[str, str] = {
    "Q4_0": "q4_0",
    "Q4_1": "q4_1",
    "Q5_0": "q5_0",
    "Q5_1": "q5_1",
    "Q8_0": "q8_0",
    "Q2_K": "q2_K",
    "Q3_K": "q3_K",
    "Q4_K": "q4_K",
    "Q5_K": "q5_K",
    "Q6_K": "q6_K",
    "IQ4_NL": "iq4_nl",
    "IQ4_XS": "iq4_xs",
    "MXFP4": "mxfp4",
}
WEIGHT_TYPES: dict[str, str] = {**FLOAT_TYPES, **QUANT_TYPES}
FLOAT_SUFFIXES = tuple(FLOAT_TYPES.values())
#: Byte alignment the kernels assume for a weight row's start (blocks.cuh's rpc_ld_u32a<A>).
WEIGHT_ALIGN: dict[str, int] = {
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "Q4_0": 2,
    "Q4_1": 4,
    "Q5_0": 2,
    "Q5_1": 4,
    "Q8_0": 2,
    "Q2_K": 4,
    "Q3_K": 2,
    "Q4_K": 4,
    "Q5_K": 4,
    "Q6_K": 2,
    "IQ4_NL": 2,
    "IQ4_XS": 4,
    "MXFP4": 1,
}
#: ggml type ids (rust/src/types.rs is the source of truth; blocks.cuh's RpcType mirrors these)
TYPE_IDS: dict[str, int] = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "IQ4_NL": 20,
    "IQ4_XS": 23,
    "BF16": 30,
    "MXFP4": 39,
}


#: (Q/K type, V type) pairs the Q/K/V launch takes besides one type for all three: V kept at
#: more bits, as llama.cpp's K-quant _M mixes do (matvec_group.cu)
QKV_MIXES: frozenset[tuple[str, str]] = frozenset(
    {("Q2_K", "Q4_K"), ("Q3_K", "Q4_K"), ("Q3_K", "Q5_K"), ("Q4_K", "Q6_K"), ("Q5_K", "Q6_K")}
)


def qkv_rope_kernel(qk_type: str, v_type: str, split: bool) -> str:
    """The Q/K/V-with-RoPE kernel for Q and K weights of `qk_type` and V of `v_type`."""
    name = WEIGHT_TYPES[qk_type]
    if v_type != qk_type:
        name += f"_v_{WEIGHT_TYPES[v_type]}"
    return f"rpc_mv_qkv_rope{'_split' if split else ''}_{name}"


def matvec_kernel(type_name: str, split: bool = False) -> str:
    """The decode matvec kernel for a weight type: MMVQ (q8_1 activations) or float; `split`:
    the variant where a block's warps share one wide row."""
    suffix = WEIGHT_TYPES[type_name]
    kind = "mmv" if type_name in FLOAT_TYPES else "mmvq"
    return f"rpc_{kind}_split_{suffix}" if split else f"rpc_{kind}_{suffix}"


def matvec_id_kernel(type_name: str) -> str:
    """The MUL_MAT_ID (MoE) decode matvec kernel for a weight type."""
    suffix = WEIGHT_TYPES[type_name]
    return f"rpc_mmv_id_{suffix}" if type_name in FLOAT_TYPES else f"rpc_mmvq_id_{suffix}"


def dequantize_kernel(type_name: str, out: str = "f16") -> str:
    return f"rpc_dequantize_{WEIGHT_TYPES[type_name]}_{out}"


def expected_kernels() -> dict[str, set[str]]:
    """Per module, the kernel entry points the host side launches (checked against the PTX)."""
    return {
        "matvec": {matvec_kernel(t, s) for t in WEIGHT_TYPES for s in (False, True)}
        | {matvec_id_kernel(t) for t in WEIGHT_TYPES},
        "quantize": {
            "rpc_quantize_q8_1",
            "rpc_quantize_q8_1_as_q8_k",
            "rpc_act_round_q8_32",
            "rpc_act_round_q8_k",
        },
        "dequantize": {dequantize_kernel(t, o) for t in WEIGHT_TYPES for o in ("f16", "f32")},
        "matvec_group": {
            f"rpc_mv_{kind}{split}_{suffix}"
            for kind in ("group", "glu", "qkv_rope")
            for split in ("", "_split")
            for suffix in WEIGHT_TYPES.values()
        }
        | {qkv_rope_kernel(a, b, split) for a, b in QKV_MIXES for split in (False, True)},
        "norm": {
            "rpc_rms_norm_f32",
            "rpc_rms_norm_mul_f32",
            "rpc_rms_norm_mul_q8_f32",
            "rpc_norm_f32",
        },
        "softmax": {"rpc_soft_max_f32"},
        "rope": {"rpc_rope_f32", "rpc_rope_f16"},
        "glu": {"rpc_glu_f32"},
        "elementwise": {"rpc_binary_f32", "rpc_unary_f32"},
        "rows": {f"rpc_get_rows_{s}" for s in WEIGHT_TYPES.values()}
        | {f"rpc_set_rows_{s}" for s in ("f32", "f16", "bf16", "q8_0")},
        "cpy": {f"rpc_cpy_{a}_{b}" for a in FLOAT_SUFFIXES for b in FLOAT_SUFFIXES}
        | {"rpc_scatter_params"},
        "attn_decode": {f"rpc_attn_decode_{t}_{t}" for t in ("f16", "bf16", "f32")},
        "flash_attn": {f"rpc_flash_attn_{k}_{v}" for k in ("f16", "q8_0") for v in ("f16", "q8_0")}
        | {"rpc_flash_attn_bf16_bf16"},
    }
