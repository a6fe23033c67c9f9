"""The model families and weight types of the numerics test (tests/test_numerics.py).

Every family is small (2 layers, n_embd 256 so that every K-quant applies to every matrix) with
random weights of normal scale and a vocabulary of 384: its logits are spread (std ~2), so an
argmax that agrees on every step says something. ``spec(family, wtype)`` gives the
:class:`~support.models.ModelSpec`: f32/f16/bf16 are written directly, the others are made from
the f32 model by the REAL llama.cpp quantizer (``support.models.ensure_model``).
"""

from __future__ import annotations

import dataclasses

from support.models import ModelSpec

FLOAT_TYPES = ("f32", "f16", "bf16")
QUANT_TYPES = ("q8_0", "q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "IQ4_XS")
WEIGHT_TYPES = FLOAT_TYPES + QUANT_TYPES

_COMMON = dict(n_embd=256, n_layer=2, n_ff=512, n_vocab=384)

FAMILIES: dict[str, ModelSpec] = {
    "llama-gqa": ModelSpec("num-llama-gqa", n_head=4, n_head_kv=2, seed=21, **_COMMON),
    "llama-mha": ModelSpec("num-llama-mha", n_head=4, n_head_kv=4, seed=22, **_COMMON),
    "qwen3": ModelSpec(
        "num-qwen3", arch="qwen3", n_head=4, n_head_kv=2, head_dim=64, seed=23, **_COMMON
    ),
    "qwen3moe": ModelSpec(
        "num-qwen3moe",
        arch="qwen3moe",
        n_head=4,
        n_head_kv=2,
        n_expert=4,
        n_expert_used=2,
        n_ff_exp=256,
        seed=24,
        **_COMMON,
    ),
    "gemma2": ModelSpec(
        "num-gemma2", arch="gemma2", n_head=4, n_head_kv=2, head_dim=64, seed=25, **_COMMON
    ),
    # not "phi3" in the name: llama.cpp then wants phi-3's special tokens in the vocabulary
    "phi3": ModelSpec("num-phi", arch="phi3", n_head=4, n_head_kv=4, seed=26, **_COMMON),
}


def spec(family: str, wtype: str) -> ModelSpec:
    base = FAMILIES[family]
    if wtype == "f32":
        return base
    name = f"{base.name}-{wtype}"
    if wtype in FLOAT_TYPES:
        return dataclasses.replace(base, name=name, dtype=wtype)
    if wtype not in QUANT_TYPES:
        raise ValueError(f"unknown weight type {wtype!r}")
    return dataclasses.replace(base, name=name, quant=wtype, base=base)
