"""Differential tests of data-movement ops against the REAL reference rpc-server.

GET_ROWS, SET_ROWS, CPY, DUP and CONT: the same single-op graph with the same input bytes runs
on llama.cpp's rpc-server and on rpcnet; outputs must match byte for byte (quantizing copies are
compared after dequantization with a one-step tolerance where ggml's SIMD quantizer may round a
code differently from the reference quantizer rpcnet implements; q8_0 must be exact).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rpcnet.compute import quant as Q
from rpcnet.ggml_types import GgmlType as T
from support import require
from support.hyp import examples
from support.opgraph import OpGraph, contiguous_nb
from support.raw_blocks import F16_FIELDS, random_blocks

DUP, CPY, CONT, GET_ROWS, SET_ROWS = 1, 34, 35, 40, 42
F32, F16, I32, I64, BF16 = 0, 1, 26, 27, 30

HYP = settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

QUANT_DST = [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL]


def run_both(g: OpGraph, outs, ref: int, ours: int):
    return g.run(ref, outs), g.run(ours, outs)


def values_bytes(type_id: int, values: np.ndarray) -> bytes:
    """float values (..., ne0) encoded as `type_id` with rpcnet's (ggml-exact) codecs."""
    values = np.asarray(values, dtype=np.float32)
    if type_id == F32:
        return values.tobytes()
    if type_id == I32:
        return values.astype(np.int32).tobytes()
    return Q.quantize(type_id, values.reshape(-1, values.shape[-1])).tobytes()


def source_rows(type_id: int, n_rows: int, ne0: int, scale: float, rng) -> tuple[np.ndarray, bytes]:
    """Normal values (times `scale`) and a source tensor's bytes of `type_id`: the values
    encoded, or random raw blocks for the types rpcnet cannot quantize."""
    values = rng.standard_normal((n_rows, ne0)).astype(np.float32) * scale
    if type_id in F16_FIELDS:
        return values, random_blocks(type_id, n_rows, ne0, rng)
    if type_id in (F16, BF16):
        return values, Q.quantize(type_id, values).tobytes()
    return values, values_bytes(type_id, values)


def decode(type_id: int, raw: bytes, ne0: int) -> np.ndarray:
    """Rows of float32 values, decoded by the independent `gguf` package (not by rpcnet)."""
    if type_id == F32:
        return np.frombuffer(raw, np.float32).reshape(-1, ne0)
    gguf = require.module("gguf")
    rows = np.frombuffer(raw, np.uint8).reshape(-1, Q.row_bytes(type_id, ne0))
    return gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(type_id)).reshape(-1, ne0)


def assert_quant_close(type_id: int, ref: bytes, ours: bytes, ne0: int) -> None:
    """Exact, or (ggml's SIMD quantizer vs the _ref one) within one quantization step. Q8_0 is
    exact: rpcnet follows the x86 SIMD quantize_row_q8_0 that the reference runs."""
    if ref == ours:
        return
    assert type_id != T.Q8_0, "q8_0 bytes differ from the reference"
    a, b = decode(type_id, ref, ne0), decode(type_id, ours, ne0)
    if type_id in (F16, BF16, F32):
        np.testing.assert_array_equal(a, b)
        return
    # one step of the block's scale: |x| max / (levels/2)
    levels = {T.Q8_0: 127, T.Q4_0: 8, T.Q4_1: 15, T.Q5_0: 16, T.Q5_1: 31, T.IQ4_NL: 8}[type_id]
    blocks = a.reshape(-1, 32)
    step = np.abs(blocks).max(axis=1, keepdims=True) / levels * 1.01 + 1e-6
    diff = np.abs(a.reshape(-1, 32) - b.reshape(-1, 32))
    assert (diff <= step).all(), f"max diff {diff.max()} exceeds one quantization step"
    # and the bytes may differ only in a few blocks
    assert np.mean(diff.max(axis=1) > 0) < 0.25


# --- GET_ROWS --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src_type",
    [F32, F16, BF16, I32, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.IQ4_NL, T.Q4_K, T.Q6_K],
)
def test_get_rows_types(reference_v8, rpcnet_v8, src_type):
    rng = np.random.default_rng(src_type)
    ne0 = 256 if src_type in F16_FIELDS else 64
    ne = (ne0, 10, 2, 1)
    n_rows = 10 * 2
    values, raw = source_rows(src_type, n_rows, ne0, 3.0, rng)
    g = OpGraph()
    a = g.input(src_type, ne, raw)
    ids = rng.integers(0, 10, size=(2, 5)).astype(np.int32)  # [ne0=5, ne1=2]
    b = g.input(I32, (5, 2, 1, 1), ids)
    out_type = I32 if src_type == I32 else F32
    out = g.op(GET_ROWS, out_type, (ne0, 5, 2, 1), (a, b))
    (ref,), (ours,) = run_both(g, [out], reference_v8, rpcnet_v8)
    assert ref == ours


@HYP
@given(
    ne0=st.sampled_from([32, 64, 96]),
    n_src=st.integers(1, 9),
    n_ids=st.integers(1, 7),
    ne2=st.integers(1, 3),
    ne3=st.integers(1, 2),
    src_type=st.sampled_from([F32, F16, T.Q8_0, T.Q4_1]),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_get_rows_3d_property(
    reference_v8, rpcnet_v8, ne0, n_src, n_ids, ne2, ne3, src_type, strided, seed
):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((ne3 * ne2 * n_src, ne0)).astype(np.float32)
    raw = values_bytes(src_type, values) if src_type != F16 else values.astype(np.float16).tobytes()
    g = OpGraph()
    a = g.input(src_type, (ne0, n_src, ne2, ne3), raw)
    ids = rng.integers(0, n_src, size=(ne3, ne2, n_ids)).astype(np.int32)
    if strided:  # ids as a strided view: every other element of a wider buffer
        wide = np.zeros((ne3, ne2, n_ids * 2), np.int32)
        wide[..., ::2] = ids
        base = g.input(I32, (n_ids * 2, ne2, ne3, 1), wide)
        b = g.view(
            base, (n_ids, ne2, ne3, 1), (8, n_ids * 8, n_ids * 8 * ne2, n_ids * 8 * ne2 * ne3)
        )
    else:
        b = g.input(I32, (n_ids, ne2, ne3, 1), ids)
    out = g.op(GET_ROWS, F32, (ne0, n_ids, ne2, ne3), (a, b))
    (ref,), (ours,) = run_both(g, [out], reference_v8, rpcnet_v8)
    assert ref == ours


# --- SET_ROWS --------------------------------------------------------------------------------


@pytest.mark.parametrize("dst_type", [F32, F16, BF16, *QUANT_DST])
@pytest.mark.parametrize("idx_type", [I64, I32])
def test_set_rows_types(reference_v8, rpcnet_v8, dst_type, idx_type):
    rng = np.random.default_rng(dst_type * 7 + idx_type)
    ne0, n_dst, n_set = 64, 12, 5
    g = OpGraph()
    dst_vals = rng.standard_normal((n_dst, ne0)).astype(np.float32)
    dst = g.input(dst_type, (ne0, n_dst, 1, 1), values_bytes(dst_type, dst_vals))
    rows = g.input(
        F32, (ne0, n_set, 1, 1), rng.standard_normal((n_set, ne0)).astype(np.float32) * 4
    )
    ids = rng.permutation(n_dst)[:n_set].astype(np.int64 if idx_type == I64 else np.int32)
    idx = g.input(idx_type, (n_set, 1, 1, 1), ids)
    out = g.op(SET_ROWS, dst_type, (ne0, n_dst, 1, 1), (rows, idx, dst), inplace_of=dst)
    (ref,), (ours,) = run_both(g, [out], reference_v8, rpcnet_v8)
    assert_quant_close(dst_type, ref, ours, ne0)


@HYP
@given(
    dst_type=st.sampled_from([F32, F16, T.Q8_0, T.Q4_0]),
    rows_f16=st.booleans(),
    n_kv=st.integers(4, 16),
    n_heads=st.integers(1, 4),
    ne3=st.integers(1, 2),
    bcast2=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_set_rows_kv_cache_property(
    reference_v8, rpcnet_v8, dst_type, rows_f16, n_kv, n_heads, ne3, bcast2, seed
):
    """A KV-cache-like store: rows [ne0, n_tok, n_heads, ne3] into a cache view, ids broadcast."""
    rng = np.random.default_rng(seed)
    ne0 = 32
    n_tok = int(rng.integers(1, n_kv + 1))
    g = OpGraph()
    cache_vals = rng.standard_normal((ne3 * n_heads * n_kv, ne0)).astype(np.float32)
    cache = g.input(dst_type, (ne0, n_kv, n_heads, ne3), values_bytes(dst_type, cache_vals))
    rows_vals = rng.standard_normal((ne3, n_heads, n_tok, ne0)).astype(np.float32)
    rows_type = F16 if rows_f16 else F32
    rows_raw = rows_vals.astype(np.float16) if rows_f16 else rows_vals
    rows = g.input(rows_type, (ne0, n_tok, n_heads, ne3), rows_raw)
    i_ne1 = 1 if bcast2 else n_heads
    ids = np.stack([rng.permutation(n_kv)[:n_tok] for _ in range(ne3 * i_ne1)]).astype(np.int64)
    idx = g.input(I64, (n_tok, i_ne1, ne3, 1), ids)
    out = g.op(SET_ROWS, dst_type, (ne0, n_kv, n_heads, ne3), (rows, idx, cache), inplace_of=cache)
    (ref,), (ours,) = run_both(g, [out], reference_v8, rpcnet_v8)
    assert_quant_close(dst_type, ref, ours, ne0)


def test_set_rows_into_strided_view(reference_v8, rpcnet_v8):
    """Destination is a view of a wider cache (every other row)."""
    rng = np.random.default_rng(5)
    ne0, n_rows = 32, 8
    g = OpGraph()
    base = g.input(
        F16, (ne0, 2 * n_rows, 1, 1), rng.standard_normal(2 * n_rows * ne0).astype(np.float16)
    )
    view = g.view(
        base, (ne0, n_rows, 1, 1), (2, 4 * ne0, 4 * ne0 * n_rows, 4 * ne0 * n_rows), offs=2 * ne0
    )
    rows = g.input(F32, (ne0, 3, 1, 1), rng.standard_normal(3 * ne0).astype(np.float32))
    idx = g.input(I32, (3, 1, 1, 1), np.array([7, 0, 4], np.int32))
    out = g.op(
        SET_ROWS,
        F16,
        (ne0, n_rows, 1, 1),
        (rows, idx, view),
        nb=(2, 4 * ne0, 4 * ne0 * n_rows, 4 * ne0 * n_rows),
        inplace_of=base,
        offs=2 * ne0,
    )
    whole = g.op(
        CPY,
        F16,
        (ne0, 2 * n_rows, 1, 1),
        (base, g.input(F16, (ne0, 2 * n_rows, 1, 1), np.zeros(2 * n_rows * ne0, np.float16))),
    )
    (ref_out, ref_all), (our_out, our_all) = run_both(g, [out, whole], reference_v8, rpcnet_v8)
    assert ref_all == our_all
    assert ref_out == our_out


# --- CPY / DUP / CONT ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src_type,dst_type",
    [
        (F32, F16),
        (F32, BF16),
        (F16, F32),
        (BF16, F32),
        (F16, BF16),
        (F32, I32),
        (I32, F32),
        (F32, F32),
        (T.Q8_0, F32),
        (T.Q4_K, F32),
        (T.Q8_0, T.Q8_0),
        *[(F32, t) for t in QUANT_DST],
        (F16, T.Q8_0),
    ],
)
def test_cpy_types(reference_v8, rpcnet_v8, src_type, dst_type):
    rng = np.random.default_rng(src_type * 100 + dst_type)
    ne0 = 256 if src_type in F16_FIELDS else 64
    ne = (ne0, 6, 2, 1)
    n = 12
    values, raw = source_rows(src_type, n, ne0, 5.0, rng)
    g = OpGraph()
    a = g.input(src_type, ne, raw)
    dst = g.input(
        dst_type,
        ne,
        bytes(
            len(values_bytes(F32, values))
            if dst_type in (F32, I32)
            else Q.row_bytes(dst_type, ne0) * n
        ),
    )
    out = g.op(CPY, dst_type, ne, (a, dst), inplace_of=dst)
    (ref,), (ours,) = run_both(g, [out], reference_v8, rpcnet_v8)
    if dst_type in QUANT_DST and src_type != dst_type:
        assert_quant_close(dst_type, ref, ours, ne0)
    else:
        assert ref == ours


@HYP
@given(
    ne=st.tuples(st.integers(1, 6), st.integers(1, 5), st.integers(1, 4), st.integers(1, 2)),
    perm=st.permutations([0, 1, 2, 3]),
    src_type=st.sampled_from([F32, F16]),
    dst_type=st.sampled_from([F32, F16, BF16]),
    op=st.sampled_from([CONT, DUP]),
    seed=st.integers(0, 2**16),
)
def test_cont_permuted_property(reference_v8, rpcnet_v8, ne, perm, src_type, dst_type, op, seed):
    """CONT/DUP of a permuted view: element order is the view's logical order."""
    rng = np.random.default_rng(seed)
    dtype = np.float32 if src_type == F32 else np.float16
    base_vals = rng.standard_normal(int(np.prod(ne))).astype(dtype)
    g = OpGraph()
    a = g.input(src_type, ne, base_vals)
    nb = contiguous_nb(src_type, ne)
    # view dim i = base dim perm[i]
    v_ne = tuple(ne[p] for p in perm)
    v_nb = tuple(nb[p] for p in perm)
    v = g.view(a, v_ne, v_nb)
    if op == DUP:
        dst_type = src_type  # ggml_dup keeps the type
    out = g.op(op, dst_type, v_ne, (v,))
    (ref,), (ours,) = run_both(g, [out], reference_v8, rpcnet_v8)
    assert ref == ours


def test_cont_reshape_and_cpy_transposed(reference_v8, rpcnet_v8):
    """CONT into a different shape; CPY from a transposed view into f16 and from a row-strided
    view into q8_0 (ggml can only quantize sources whose rows are contiguous)."""
    rng = np.random.default_rng(3)
    g = OpGraph()
    a = g.input(F32, (8, 6, 4, 1), rng.standard_normal(192).astype(np.float32))
    t = g.view(a, (6, 8, 4, 1), (32, 4, 192, 768))  # transpose dims 0, 1
    c = g.op(CONT, F32, (12, 16, 1, 1), (t,))
    hd = g.input(F16, (6, 8, 4, 1), bytes(2 * 192))
    h = g.op(CPY, F16, (6, 8, 4, 1), (t, hd), inplace_of=hd)
    big = g.input(F32, (64, 6, 1, 1), rng.standard_normal(384).astype(np.float32))
    rows = g.view(big, (32, 3, 2, 1), (4, 512, 256, 1536), offs=128)  # odd rows' second half
    qd = g.input(T.Q8_0, (32, 6, 1, 1), bytes(Q.row_bytes(T.Q8_0, 32) * 6))
    q = g.op(CPY, T.Q8_0, (32, 6, 1, 1), (rows, qd), inplace_of=qd)
    (ref_c, ref_h, ref_q), (our_c, our_h, our_q) = run_both(g, [c, h, q], reference_v8, rpcnet_v8)
    assert ref_c == our_c
    assert ref_h == our_h
    assert_quant_close(T.Q8_0, ref_q, our_q, 32)


def test_cpy_into_cache_view(reference_v8, rpcnet_v8):
    """CPY of new K rows into a slice of an f16 cache (output is a view with an offset)."""
    rng = np.random.default_rng(4)
    ne0, n_kv, n_new = 32, 10, 3
    g = OpGraph()
    cache = g.input(F16, (ne0, n_kv, 1, 1), rng.standard_normal(ne0 * n_kv).astype(np.float16))
    k = g.input(F32, (ne0, n_new, 1, 1), rng.standard_normal(ne0 * n_new).astype(np.float32))
    offs = 4 * ne0 * 2
    dst = g.view(
        cache, (ne0, n_new, 1, 1), (2, 2 * ne0, 2 * ne0 * n_new, 2 * ne0 * n_new), offs=offs
    )
    out = g.op(CPY, F16, (ne0, n_new, 1, 1), (k, dst), inplace_of=cache, offs=offs)
    whole = g.op(CONT, F16, (ne0, n_kv, 1, 1), (cache,))
    (r1, r2), (o1, o2) = run_both(g, [out, whole], reference_v8, rpcnet_v8)
    assert r1 == o1 and r2 == o2
