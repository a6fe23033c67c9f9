"""The ggml type table Python sees (built from rust/src/types.rs) against the gguf package."""

from __future__ import annotations

import gguf
import pytest
from rpcnet import _native
from rpcnet.compute import quant
from rpcnet.ggml_types import GGML_TYPE_COUNT, TYPE_TRAITS, GgmlType, traits_of, type_name

GGUF_TYPES = {t.name: t.value for t in gguf.GGMLQuantizationType}

# gguf-py still describes q8_1 with float32 d and s (4 + 4 + 32 bytes); ggml's block_q8_1 is
# `ggml_half2 ds; int8_t qs[32]`, i.e. 2 * 2 + 32 bytes.
Q8_1_GGML_BYTES = 2 * 2 + 32
# Types newer than the gguf release pinned here: q2_0 is `ggml_half d; uint8_t qs[64 / 4]`.
NEWER_THAN_GGUF = {"Q2_0": (64, 2 + 64 // 4)}


def test_every_gguf_type_has_the_same_id_and_sizes():
    for name, type_id in GGUF_TYPES.items():
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(type_id)]
        if name == "Q8_1":
            assert size != Q8_1_GGML_BYTES, "gguf fixed q8_1: drop the exception"
            size = Q8_1_GGML_BYTES
        assert GgmlType[name] == type_id
        traits = TYPE_TRAITS[type_id]
        assert (traits.block_size, traits.type_size) == (block, size), name
        assert traits.quantized == (block > 1), name
        assert traits.name.upper() == name


def test_no_type_beyond_gguf_but_the_listed_newer_ones():
    extra = {m.name for m in GgmlType} - set(GGUF_TYPES)
    assert extra == set(NEWER_THAN_GGUF)
    for name, (block, size) in NEWER_THAN_GGUF.items():
        traits = TYPE_TRAITS[GgmlType[name]]
        assert (traits.block_size, traits.type_size, traits.quantized) == (block, size, True)


def test_removed_ids_are_the_gaps_in_gguf():
    top = max(GGUF_TYPES.values())
    gaps = set(range(top)) - set(GGUF_TYPES.values())
    removed = set(range(GGML_TYPE_COUNT)) - set(TYPE_TRAITS)
    assert removed == gaps
    assert GGML_TYPE_COUNT == max(GgmlType) + 1
    for type_id in removed:
        assert type_name(type_id) == f"type#{type_id}"
        with pytest.raises(ValueError, match="removed"):
            traits_of(type_id)
        with pytest.raises(_native.TensorError, match="removed"):
            _native.type_info(type_id)


def test_traits_match_native_type_info_and_quant_helpers():
    for type_id, traits in TYPE_TRAITS.items():
        assert _native.type_info(type_id) == tuple(traits)
        assert type_name(type_id) == traits.name
        assert quant.block_size(type_id) == traits.block_size
        assert quant.type_size(type_id) == traits.type_size
        assert quant.row_bytes(type_id, 4 * traits.block_size) == 4 * traits.type_size
    assert type_name(GGML_TYPE_COUNT) == f"type#{GGML_TYPE_COUNT}"
