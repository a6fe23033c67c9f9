"""Random raw blocks of quant types a test cannot quantize with rpcnet: every bit pattern of
the quants, with the f16 scale fields forced to finite, moderate values."""

from __future__ import annotations

import numpy as np
from rpcnet.compute import quant as Q
from rpcnet.ggml_types import GgmlType as T

#: byte offsets of the f16 scale fields in one block (ggml-common.h)
F16_FIELDS = {T.Q4_K: [0, 2], T.Q6_K: [208], T.Q5_K: [0, 2], T.Q2_K: [80, 82], T.Q3_K: [108]}


def random_blocks(type_id: int, n_rows: int, ne0: int, rng: np.random.Generator) -> bytes:
    """`n_rows` rows of `ne0` values of `type_id` as raw bytes."""
    size = Q.type_size(type_id)
    n_blocks = n_rows * ne0 // Q.block_size(type_id)
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off in F16_FIELDS[type_id]:
        d = rng.uniform(0.001, 0.05, n_blocks).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.tobytes()
