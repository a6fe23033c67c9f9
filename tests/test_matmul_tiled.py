"""ggml's multi-row MUL_MAT paths that sum differently from vec_dot, against the REAL reference
rpc-server (llama.cpp b11739), bit for bit:

* the tiled K-quant kernel (ggml-cpu `tiled/`): Q2_K…Q6_K and IQ4_XS weights from 8 activation
  rows per src1 batch (MUL_MAT) or per expert (MUL_MAT_ID), fewer rows through vec_dot;
* the Hadamard hint (MUL_MAT op_params[1] = 1, set by llama.cpp on the rotation of a quantized
  KV cache): the reference ignores src0 and runs its fast Walsh-Hadamard transform.

Weights come from llama.cpp's own quantizer; the portable and the SIMD builds both run. The
reference server is the oracle for the bits; gguf's dequantizer plus a float64 dot product
checks that the server's numbers are the product at all.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize
from rpcnet import _native
from support import refenv
from support.opgraph import OpGraph, as_f32, pack_params

F32, I32, MUL_MAT, MUL_MAT_ID = 0, 26, 29, 30
TILED = {"Q2_K": 10, "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_XS": 23}
ROWS = (1, 7, 8, 9, 16, 33)  # around the reference's threshold (8) and its 16-row microtiles
SHAPES = ((37, 256), (21, 768))  # odd M (not a multiple of 4, 8 or 16), one and three slabs


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> dict[tuple[int, int, int], np.ndarray]:
    """{(type, M, K): rows from llama.cpp's quantizer}; rows of different magnitudes."""
    tmp = tmp_path_factory.mktemp("tiled")
    rng = np.random.default_rng(10)
    sources = {}
    for type_id in TILED.values():
        for m, k in SHAPES:
            w = rng.standard_normal((m, k)).astype(np.float32)
            sources[f"t{type_id}_{m}_{k}"] = w * np.logspace(-1, 1, m, dtype=np.float32)[:, None]
    np.savez(tmp / "in.npz", **sources)
    refenv.run_probe("v8", "quantize_rows", tmp / "in.npz", tmp / "out.npz", timeout=300)
    with np.load(tmp / "out.npz") as q:
        return {(t, m, k): q[f"t{t}_{m}_{k}"] for t in TILED.values() for m, k in SHAPES}


def kernel(type_id: int, wq: np.ndarray, x: np.ndarray, llamafile: bool = True) -> np.ndarray:
    out = np.full((x.shape[0], wq.shape[0]), np.nan, np.float32)
    _native.matmul_quant(type_id, wq, wq.shape[1], np.ascontiguousarray(x), out, 2, llamafile)
    return out


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("name", sorted(TILED))
def test_every_row_count_matches_reference(name, path, weights, reference_v8):
    type_id = TILED[name]
    rng = np.random.default_rng(type_id)
    for m, k in SHAPES:
        wq = weights[(type_id, m, k)]
        g = OpGraph()
        w = g.input(type_id, (k, m), wq.reshape(-1))
        cases = []
        for n in ROWS:
            xv = (rng.standard_normal((n, k)) * rng.uniform(0.1, 5, (n, 1))).astype(np.float32)
            cases.append((g.op(MUL_MAT, F32, (m, n), (w, g.input(F32, (k, n), xv))), xv))
        ref = g.run(reference_v8, [c[0] for c in cases])
        deq = np.asarray(dequantize(wq, gguf.GGMLQuantizationType(type_id)), np.float64)
        for (_, xv), r in zip(cases, ref, strict=True):
            n = xv.shape[0]
            want = as_f32(r, (m, n)).reshape(n, m)
            # the server computes the product (activations quantized to q8_K: ~1e-2 relative)
            exact = xv.astype(np.float64) @ deq.reshape(m, k).T
            scale = np.abs(xv).astype(np.float64) @ np.abs(deq.reshape(m, k)).T
            assert np.all(np.abs(want - exact) <= 2e-2 * scale), f"{name} N={n}: not the product"
            got = kernel(type_id, wq, xv)
            assert same_bits(got, want), (
                f"{name} M={m} K={k} N={n} ({path}): {np.sum(got != want)} values differ"
            )


@pytest.mark.parametrize("name", ["Q4_K", "IQ4_XS"])
def test_threshold_is_per_batch_and_per_expert(name, weights, reference_v8, rpcnet_v8):
    """MUL_MAT decides on ne11 (rows of one batch), MUL_MAT_ID on the rows routed to an expert."""
    type_id = TILED[name]
    m, k = SHAPES[0]
    wq = weights[(type_id, m, k)]
    rng = np.random.default_rng(2)
    g = OpGraph()
    w = g.input(type_id, (k, m), wq.reshape(-1))
    outs = []
    for n1, n2 in [(1, 8), (4, 2), (7, 3), (8, 2), (9, 1)]:  # fewer than 8 per batch: vec_dot
        x = g.input(F32, (k, n1, n2), rng.standard_normal((n2, n1, k)).astype(np.float32))
        outs.append((g.op(MUL_MAT, F32, (m, n1, n2), (w, x)), (m, n1, n2)))
    experts = g.input(type_id, (k, 8, 4), wq[:32].reshape(-1))  # 4 experts of 8 rows
    for n_tok, used in [(8, 1), (8, 2), (12, 1), (20, 2)]:
        ids = np.stack([rng.permutation(4)[:used] for _ in range(n_tok)]).astype(np.int32)
        ids[: n_tok // 2 + 1, 0] = 0  # expert 0 gets over half the tokens: across 8 at n_tok 12+
        b = g.input(F32, (k, 1, n_tok), rng.standard_normal((n_tok, k)).astype(np.float32))
        idt = g.input(I32, (used, n_tok), ids)
        outs.append((g.op(MUL_MAT_ID, F32, (8, used, n_tok), (experts, b, idt)), (8, used, n_tok)))
    ids_ = [o for o, _ in outs]
    ref, ours = g.run(reference_v8, ids_), g.run(rpcnet_v8, ids_)
    for (_, ne), r, o in zip(outs, ref, ours, strict=True):
        assert same_bits(as_f32(o, ne), as_f32(r, ne)), f"{name} {ne}"


def test_portable_and_simd_agree_on_tiled_rows(weights):
    for type_id in TILED.values():
        m, k = SHAPES[1]
        wq = weights[(type_id, m, k)]
        x = np.random.default_rng(type_id).standard_normal((19, k)).astype(np.float32)
        try:
            assert _native.set_portable_kernels(False)
            simd = kernel(type_id, wq, x)
            assert not _native.set_portable_kernels(True)
            portable = kernel(type_id, wq, x)
        finally:
            _native.set_portable_kernels(False)
        assert same_bits(simd, portable), type_id
        # MUL_MAT_ID's calls (llamafile off) take the tiled order too from 8 rows on
        assert same_bits(kernel(type_id, wq, x, llamafile=False), simd), type_id


def test_hadamard_hint_matches_reference(reference_v8, rpcnet_v8):
    """src0 is ignored (random here): each src1 row gets ggml's FWHT, scaled by 1/sqrt(n)."""
    rng = np.random.default_rng(6)
    g = OpGraph()
    outs = []
    for n in (64, 128):
        w = g.input(F32, (n, n), rng.standard_normal((n, n)).astype(np.float32))
        for rows in (1, 4, 9):
            xv = rng.standard_normal((rows, n)).astype(np.float32)
            x = g.input(F32, (n, rows), xv)
            node = g.op(MUL_MAT, F32, (n, rows), (w, x), params=pack_params(0, 1))
            outs.append((node, xv))
    ids = [o for o, _ in outs]
    ref, ours = g.run(reference_v8, ids), g.run(rpcnet_v8, ids)
    for (_, xv), r, o in zip(outs, ref, ours, strict=True):
        rows, n = xv.shape
        want, got = as_f32(r, (n, rows)).reshape(rows, n), as_f32(o, (n, rows)).reshape(rows, n)
        h = np.ones((1, 1))
        while h.shape[0] < n:
            h = np.block([[h, h], [h, -h]])
        exact = xv.astype(np.float64) @ h.T / np.sqrt(n)
        assert np.allclose(want, exact, rtol=0, atol=1e-5 * np.abs(xv).sum(axis=1).max())
        assert same_bits(got, want), f"n={n} rows={rows}"
