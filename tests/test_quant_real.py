"""Dequantizers bit-for-bit against the independent `gguf` decoder, on weights produced by the
REAL llama.cpp quantizer (`llama_model_quantize`, through tests/support/models.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from rpcnet.compute import quant
from support.models import QUANT_MAIN_TYPE, ZOO, ensure_model

pytestmark = pytest.mark.usefixtures("refenv_required")

MODELS = [
    "llama256-q8_0",
    "llama256-q4_0",
    "llama256-Q4_K_M",
    "llama256-Q5_K_M",
    "llama256-Q6_K",
    "llama256-IQ4_XS",
    "qwen3moe256-Q4_K_M",
]


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory):
    return os.environ.get("RPCNET_E2E_CACHE") or tmp_path_factory.mktemp("zoo")


def decoded_types(path, skipped: set[int]) -> set[str]:
    """Decodes every tensor of the gguf file at `path` (but those of `skipped` types) with
    rpcnet and with `gguf`: the bits must agree. The names of the types decoded."""
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    seen = set()
    for t in gguf.GGUFReader(str(path)).tensors:
        type_id = int(t.tensor_type)
        if type_id in skipped or type_id not in quant.dequantizable_types():
            continue
        seen.add(t.tensor_type.name)
        row_elems = int(t.shape[0])
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        rows = raw.size // quant.row_bytes(type_id, row_elems)
        ours = quant.dequantize(type_id, raw, rows, row_elems)
        oracle = np.asarray(gguf_dequantize(raw.reshape(rows, -1), t.tensor_type), np.float32)
        assert np.array_equal(
            ours.view(np.uint32), oracle.reshape(rows, row_elems).view(np.uint32)
        ), f"{path.name}: {t.name} ({t.tensor_type.name}) differs"
    return seen


@pytest.mark.parametrize("name", MODELS)
def test_real_quantized_tensors_decode_like_gguf(name, zoo_dir):
    seen = decoded_types(ensure_model(ZOO[name], zoo_dir), skipped={0, 1, 30})  # F32, F16, BF16
    spec = ZOO[name]
    assert QUANT_MAIN_TYPE[spec.quant] in seen, f"{name}: decoded only {sorted(seen)}"


# ftypes not in the e2e zoo: quantized here from the zoo's f32 base, only to check the decoders.
EXTRA_FTYPES = {
    "Q4_1": "Q4_1",
    "Q5_0": "Q5_0",
    "Q5_1": "Q5_1",
    "Q2_K": "Q2_K",
    "Q3_K_M": "Q3_K",
    "IQ4_NL": "IQ4_NL",
    "MXFP4_MOE": "MXFP4",
    "BF16": "BF16",
    "F16": "F16",
}


@pytest.mark.parametrize("ftype", sorted(EXTRA_FTYPES))
def test_more_real_quantizer_types_decode_like_gguf(ftype, zoo_dir, tmp_path):
    from support.models import quantize_model

    # MXFP4_MOE quantizes only expert tensors: it needs the MoE model.
    source = "qwen3moe256-Q4_K_M" if ftype == "MXFP4_MOE" else "llama256-q8_0"
    base = ensure_model(ZOO[source].base, zoo_dir)
    out = tmp_path / f"{ftype}.gguf"
    quantize_model(base, out, ftype)
    seen = decoded_types(out, skipped={0})  # F32
    assert EXTRA_FTYPES[ftype] in seen, f"{ftype}: decoded only {sorted(seen)}"
