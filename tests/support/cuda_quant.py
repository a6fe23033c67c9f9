"""Shared by the CUDA tests: weights from the REAL llama.cpp quantizer for every type the
kernels serve, and NumPy oracles of q8_1 written from ggml's reference definition."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from support import refenv
from support.models import ZOO, ensure_model

# ggml type name -> (llama ftype to quantize with, a zoo model whose f32 base is quantized).
FTYPES = {
    "Q4_0": ("Q4_0", "llama256-q8_0"),
    "Q4_1": ("Q4_1", "llama256-q8_0"),
    "Q5_0": ("Q5_0", "llama256-q8_0"),
    "Q5_1": ("Q5_1", "llama256-q8_0"),
    "Q8_0": ("Q8_0", "llama256-q8_0"),
    "Q2_K": ("Q2_K", "llama256-q8_0"),
    "Q3_K": ("Q3_K_M", "llama256-q8_0"),
    "Q4_K": ("Q4_K_M", "llama256-q8_0"),
    "Q5_K": ("Q5_K_M", "llama256-q8_0"),
    "Q6_K": ("Q6_K", "llama256-q8_0"),
    "IQ4_NL": ("IQ4_NL", "llama256-q8_0"),
    "IQ4_XS": ("IQ4_XS", "llama256-q8_0"),
    "MXFP4": ("MXFP4_MOE", "qwen3moe256-Q4_K_M"),
    "F16": ("F16", "llama256-q8_0"),
    "BF16": ("BF16", "llama256-q8_0"),
}
FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = [t for t in FTYPES if t not in FLOAT_TYPES]


def real_quantized_rows(tmp_path_factory) -> dict[str, tuple[np.ndarray, int]]:
    """Per ggml type name: rows of one real tensor of that type, as (raw uint8 [rows, bytes], n)."""
    import gguf

    assert refenv.available("v8"), "reference env missing: run tools/refenv.sh"
    zoo_dir = os.environ.get("RPCNET_E2E_CACHE") or tmp_path_factory.mktemp("zoo")
    out_dir = tmp_path_factory.mktemp("cuda_quant")
    found: dict[str, tuple[np.ndarray, int]] = {}

    def take(path: Path, wanted: set[str]) -> None:
        for t in gguf.GGUFReader(str(path)).tensors:
            name = t.tensor_type.name
            if name in wanted and name not in found and len(t.shape) >= 2:
                n = int(t.shape[0])
                raw = np.asarray(t.data).view(np.uint8).reshape(-1)
                rows = np.ascontiguousarray(raw.reshape(-1, raw.size // int(np.prod(t.shape[1:]))))
                found[name] = (rows[:24], n)

    take(ensure_model(ZOO["llama256-q8_0"].base, zoo_dir), {"F32"})
    for type_name, (ftype, base) in FTYPES.items():
        if type_name in found:
            continue
        dst = out_dir / f"{ftype}.gguf"
        args = ["--model", ensure_model(ZOO[base].base, zoo_dir), "--out", dst, "--type", ftype]
        if ftype != "MXFP4_MOE":
            args.append("--pure")
        refenv.run_probe("v8", "quantize", *args, timeout=300)
        take(dst, set(FTYPES) | {"F32"})
    missing = sorted(set(FTYPES) - set(found))
    assert not missing, f"the quantizer produced no tensor of {missing}"
    return found


def q8_1_oracle(x: np.ndarray) -> np.ndarray:
    """ggml's reference q8_1 quantizer (quantize_row_q8_1_ref) in NumPy: bytes per 32 floats."""
    blocks = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (blocks * inv[:, None]).astype(np.float32).astype(np.float64)
    q = (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int8)  # C roundf: half away from 0
    s = (q.astype(np.int32).sum(axis=1).astype(np.float32) * d).astype(np.float32)
    out = np.empty((blocks.shape[0], 36), np.uint8)
    out[:, 0:2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:4] = s.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 4:] = q.view(np.uint8)
    return out.reshape(-1)


def dequant_q8_1(y: np.ndarray) -> np.ndarray:
    b = y.reshape(-1, 36)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float64)
    return (b[:, 4:].view(np.int8).astype(np.float64) * d).reshape(-1)


def float_activations(y: np.ndarray, type_name: str) -> np.ndarray:
    """Activations as ggml's CPU dot product multiplies them with float weights of `type_name`
    (and as the CUDA float kernels do): rounded to f16 for F16, to bf16 (nearest even) for
    BF16, kept for F32; as float64."""
    y = np.asarray(y, np.float32)
    if type_name == "F16":
        return y.astype(np.float16).astype(np.float64)
    if type_name == "BF16":
        bits = y.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        return rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    return y.astype(np.float64)


def flash_attn_f16_like_cpu(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    scale: float,
    softcap: float = 0.0,
    sinks: np.ndarray | None = None,
) -> np.ndarray:
    """FLASH_ATTN_EXT with f16 K and V as ggml's CPU kernel computes it, row by row: Q rounded
    to f16, positions in order, the V sums kept in f16 (rounded after every step), the sink
    merged in f32 last. q (H, n_q, D) f32; k, v (H_kv, n_kv, D) f16; mask (n_q, n_kv) f16.
    Returns (n_q, H, Dv) float64. (Dot products in float64: their order is the only freedom.)"""
    f32, f16 = np.float32, np.float16
    heads, n_q, _ = q.shape
    group = heads // k.shape[0]
    scale_f = f32(scale) / f32(softcap) if softcap else f32(scale)
    out = np.zeros((n_q, heads, v.shape[2]))
    for h in range(heads):
        kh, vh = k[h // group].astype(f32), v[h // group].astype(f32)
        for r in range(n_q):
            qr = q[h, r].astype(f16).astype(np.float64)
            acc = np.zeros(v.shape[2], f16)
            m, total = f32(-np.inf), f32(0)
            for j in range(k.shape[1]):
                mv = f32(mask[r, j]) if mask is not None else f32(0)
                if mv == -np.inf:
                    continue
                s = f32(float(qr @ kh[j].astype(np.float64))) * scale_f
                if softcap:
                    s = f32(softcap) * f32(np.tanh(s))
                s = f32(s + mv)
                ms, vs = f32(1), f32(1)
                if s > m:
                    ms = f32(np.exp(f32(m - s))) if m != -np.inf else f32(0)
                    m = s
                    acc = (acc.astype(f32) * ms).astype(f16)
                else:
                    vs = f32(np.exp(f32(s - m)))
                # one rounding to f32 (a fused multiply-add), then to f16
                acc = (vh[j].astype(np.float64) * vs + acc.astype(np.float64)).astype(f32)
                acc = acc.astype(f16)
                total = f32(total * ms + vs)
            res = acc.astype(f32)
            if sinks is not None:
                ss = f32(sinks[h])
                if ss > m:
                    res = res * f32(np.exp(f32(m - ss)))
                    total = f32(total * f32(np.exp(f32(m - ss))) + 1)
                else:
                    total = f32(total + f32(np.exp(f32(ss - m))))
            out[r, h] = res * (f32(1) / total if total != 0 else f32(0))
    return out


def flash_attn_oracle(
    q: np.ndarray,
    k_raw: np.ndarray,
    v_raw: np.ndarray,
    kv_type: str,
    shape: tuple[int, int, int],
    mask: np.ndarray | None,
    scale: float,
    softcap: float,
    sinks: np.ndarray,
) -> np.ndarray:
    """What the CUDA flash-attention kernel computes for q (H, n_q, D) and gguf-quantized K/V of
    `shape` (H_kv, n_kv, D): the CPU's f16 algorithm for f16 K/V, else softmax(QK^T)V in
    float64 from the dequantized cache (Q rounded to bf16 for bf16 K, as the CPU does).
    (n_q, H, Dv) float64."""
    import gguf
    from gguf.quants import dequantize, quantize

    if kv_type == "F16":
        return flash_attn_f16_like_cpu(
            q, k_raw.reshape(shape), v_raw.reshape(shape), mask, scale, softcap, sinks
        )
    qtype = gguf.GGMLQuantizationType[kv_type]
    if kv_type == "BF16":  # the CPU rounds Q to bf16 for its bf16 dot product
        q = np.asarray(dequantize(quantize(q, qtype), qtype), np.float32).reshape(q.shape)
    k64 = np.asarray(dequantize(k_raw, qtype), np.float64).reshape(shape)
    v64 = np.asarray(dequantize(v_raw, qtype), np.float64).reshape(shape)
    heads, n_q, _ = q.shape
    group = heads // shape[0]
    want = np.zeros((n_q, heads, shape[2]))
    for h in range(heads):
        s = q[h].astype(np.float64) @ k64[h // group].T * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        if mask is not None:
            s = s + mask.astype(np.float64)
        mx = np.maximum(s.max(axis=1, keepdims=True), sinks[h])
        e = np.exp(s - mx)
        p = e / (e.sum(axis=1, keepdims=True) + np.exp(sinks[h] - mx))
        want[:, h, :] = p @ v64[h // group]
    return want


def soft_max_case(
    rng: np.random.Generator, heads: int, rows: int, n: int, mask_dtype: Any
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """Inputs of SOFT_MAX with scale 0.125, an optional mask of `mask_dtype` broadcast over
    heads (about 30% of positions hidden, never the first) and per-head sinks, and what it
    gives in float64: (x, mask, sinks, want)."""
    x = rng.standard_normal((heads, rows, n)).astype(np.float32)
    mask = None
    logits = x.astype(np.float64) * 0.125
    if mask_dtype is not None:
        mask = np.where(rng.random((rows, n)) < 0.3, -np.inf, 0.0).astype(mask_dtype)
        mask[:, 0] = 0
        logits = logits + mask.astype(np.float64)[None]
    sinks = rng.standard_normal(heads).astype(np.float32)
    mx = np.maximum(logits.max(axis=2, keepdims=True), sinks[:, None, None])
    e = np.exp(logits - mx)
    want = e / (e.sum(axis=2, keepdims=True) + np.exp(sinks[:, None, None] - mx))
    return x, mask, sinks, want
