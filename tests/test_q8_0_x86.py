"""f32 -> q8_0 as ggml's CPU backend runs it on x86 (arch/x86/quants.c ``quantize_row_q8_0``).

CPY/SET_ROWS into a q8_0 tensor (a q8_0 KV cache) and the q8_0 activations of matmuls go through
``type_traits_cpu[Q8_0].from_float``; with AVX that is the SIMD routine, which

* multiplies by ``127 / amax`` (the scalar ``quantize_row_q8_0_ref`` multiplies by ``1 / d``,
  ``d = amax / 127``: the products can differ in the last bit), and
* rounds with ``vroundps`` to nearest, ties to even (the _ref uses ``roundf``: ties away from 0).

The expected bytes come from :func:`x86_rule`, a NumPy transcription of that definition written
here (not rpcnet's code), and the reference rpc-server must produce the same bytes for the same
single-op graph. The _ref codec stays bit-exact with gguf's quantizer (the file-format rule).
"""

from __future__ import annotations

import numpy as np
import pytest
from rpcnet.compute import quant as Q
from rpcnet.compute.quant.hostisa import host_has_avx
from rpcnet.ggml_types import GgmlType as T
from support import require
from support.ggml_oracle import q8_0_x86_bytes
from support.opgraph import OpGraph

CPY, SET_ROWS = 34, 42
F32, I64 = 0, 27
f32 = np.float32


def tie_blocks() -> np.ndarray:
    """Blocks whose codes differ between the x86 rule and the _ref rule (plus plain ones)."""
    rng = np.random.default_rng(5)
    # amax 127: the multiplier is exactly 1, so x.5 values are exact ties
    halves = np.array([0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -3.5, 126.5, -126.5, 64.5, -64.5])
    a = np.concatenate([[127.0], halves, rng.uniform(-100, 100, 32 - 1 - halves.size)])
    # 1.73107 * (127/2.4026875) = 91.49999 but 1.73107 * (1/d) = 91.5: the multiplier decides
    b = np.concatenate([[2.4026875, 1.73107], rng.uniform(-2, 2, 30)])
    # 0.41127902 * (127/0.5095847) is exactly 102.5: a tie the x86 rounds to 102, roundf to 103
    c = np.concatenate([[-0.5095847, 0.41127902], rng.uniform(-0.5, 0.5, 30)])
    zero = np.zeros(32)
    plain = rng.standard_normal(32 * 4) * 3
    return np.concatenate([a, b, c, zero, plain]).astype(f32).reshape(-1, 64)


def test_tie_blocks_separate_the_rules() -> None:
    """The hand-picked blocks do tell the two rules apart (else the tests below prove nothing),
    and the _ref codec still equals gguf's quantizer (the file format)."""
    gguf = require.module("gguf")
    x = tie_blocks()
    ref = Q.quantize(T.Q8_0, x).tobytes()
    assert ref == gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0).tobytes()
    ours, expected = np.frombuffer(ref, np.uint8), np.frombuffer(q8_0_x86_bytes(x), np.uint8)
    differ = np.flatnonzero(ours != expected)
    assert differ.size >= 10, differ  # ten halves of block a, one each in b and c
    assert {int(i) // 34 for i in differ} == {0, 1, 2}


@pytest.mark.skipif(not host_has_avx(), reason="the x86 rule is what AVX hosts run")
def test_quantize_cpu_follows_the_q8_0_x86_bytes() -> None:
    rng = np.random.default_rng(11)
    x = tie_blocks()
    assert Q.quantize_cpu(T.Q8_0, x).tobytes() == q8_0_x86_bytes(x)
    wide = (rng.standard_normal((17, 96)) * rng.uniform(1e-3, 1e3, (17, 1))).astype(f32)
    assert Q.quantize_cpu(T.Q8_0, wide).tobytes() == q8_0_x86_bytes(wide)


def test_quantize_cpu_saturates_like_the_packs() -> None:
    """NaN/inf: cvtps2dq gives INT32_MIN, which the saturating packs turn into -128."""
    if not host_has_avx():
        pytest.skip("x86 only")
    x = np.zeros((1, 32), f32)
    x[0, 3] = np.inf
    x[0, 5] = 2.0
    raw = Q.quantize_cpu(T.Q8_0, x)[0]
    assert raw[:2].view(np.float16)[0] == np.inf
    q = raw[2:].view(np.int8)
    assert q[3] == -128 and q[5] == 0 and not q[np.arange(32) != 3].any()


def test_cpy_f32_to_q8_0_matches_reference(reference_v8: int, rpcnet_v8: int) -> None:
    x = tie_blocks()
    ne = (x.shape[1], x.shape[0], 1, 1)
    g = OpGraph()
    src = g.input(F32, ne, x)
    dst = g.input(T.Q8_0, ne, bytes(Q.row_bytes(T.Q8_0, ne[0]) * ne[1]))
    out = g.op(CPY, T.Q8_0, ne, (src, dst), inplace_of=dst)
    (ref,) = g.run(reference_v8, [out])
    (ours,) = g.run(rpcnet_v8, [out])
    assert ref == q8_0_x86_bytes(x), "the reference server does not run the x86 rule on this host"
    assert ours == ref


def test_set_rows_into_q8_0_matches_reference(reference_v8: int, rpcnet_v8: int) -> None:
    rows = tie_blocks()
    n_dst, ne0 = 8, rows.shape[1]
    ids = np.array([6, 0, 3, 7, 1][: rows.shape[0]], np.int64)
    g = OpGraph()
    dst = g.input(T.Q8_0, (ne0, n_dst, 1, 1), bytes(Q.row_bytes(T.Q8_0, ne0) * n_dst))
    src = g.input(F32, (ne0, rows.shape[0], 1, 1), rows)
    idx = g.input(I64, (ids.size, 1, 1, 1), ids)
    out = g.op(SET_ROWS, T.Q8_0, (ne0, n_dst, 1, 1), (src, idx, dst), inplace_of=dst)
    (ref,) = g.run(reference_v8, [out])
    (ours,) = g.run(rpcnet_v8, [out])
    rb = Q.row_bytes(T.Q8_0, ne0)
    for i, row in zip(ids, rows, strict=True):
        assert ref[i * rb : (i + 1) * rb] == q8_0_x86_bytes(row), f"reference row {i}"
    assert ours == ref
