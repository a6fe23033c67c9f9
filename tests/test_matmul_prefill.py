"""Prompt-sized MUL_MAT with float weights: the BLAS GEMM kernel (matmul_prefill.py).

Oracle: ggml's definition in float64 — activations rounded to the weight type's vec_dot type
(f16 / bf16 / none), exact products, summed — and the REAL reference server on the same graph.
The kernel must not keep a float copy of the weights (no derived cache), whatever their size.
"""

from __future__ import annotations

import numpy as np
import pytest
from rpcnet.compute.ops import Op
from rpcnet.ggml_types import GgmlType
from support.opgraph import OpGraph

MUL_MAT = Op.MUL_MAT


def bf16_round(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return r.view(np.float32)


def stored(w: np.ndarray, t: GgmlType) -> tuple[np.ndarray, np.ndarray]:
    """(the bytes' array as sent, its values as float64)."""
    if t == GgmlType.F16:
        h = w.astype(np.float16)
        return h, h.astype(np.float64)
    if t == GgmlType.BF16:
        r = bf16_round(w)
        return (r.view(np.uint32) >> 16).astype(np.uint16), r.astype(np.float64)
    return w, w.astype(np.float64)


def rounded_activations(x: np.ndarray, t: GgmlType) -> np.ndarray:
    if t == GgmlType.F16:
        return x.astype(np.float16).astype(np.float64)
    if t == GgmlType.BF16:
        return bf16_round(x).astype(np.float64)
    return x.astype(np.float64)


def graph(t: GgmlType, w_raw: np.ndarray, x: np.ndarray, m: int, k: int, n: int):
    g = OpGraph()
    a = g.input(t, (k, m), w_raw)
    b = g.input(GgmlType.F32, (k, n), x)
    out = g.op(MUL_MAT, GgmlType.F32, (m, n), (a, b))
    return g, out


@pytest.mark.parametrize("t", [GgmlType.F16, GgmlType.BF16])
@pytest.mark.parametrize(("m", "k", "n"), [(36, 256, 32), (64, 96, 100)])
def test_prefill_gemm_matches_ggml_definition_and_reference(reference_v8, rpcnet_v8, t, m, k, n):
    rng = np.random.default_rng(m * 1000 + k + n)
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal((n, k), dtype=np.float32)
    w_raw, w64 = stored(w, t)
    g, out = graph(t, w_raw, x, m, k, n)
    (ours,) = g.run(rpcnet_v8, [out])
    (ref,) = g.run(reference_v8, [out])
    ours = np.frombuffer(ours, np.float32).reshape(n, m)
    ref = np.frombuffer(ref, np.float32).reshape(n, m)
    exact = rounded_activations(x, t) @ w64.T
    scale = np.abs(rounded_activations(x, t)) @ np.abs(w64).T  # sum of |terms|
    assert np.all(np.abs(ours - exact) <= 1e-6 * scale + 1e-30)
    # only the summation order differs from the reference's tinyBLAS / vec_dot order
    assert np.all(np.abs(ours - ref) <= 2e-6 * scale + 1e-30)


def test_prefill_keeps_no_float_copy(server_factory):
    """f16 weights at N >= 32 run without the derived cache (bounded by the kernel's chunk)."""
    srv = server_factory(mem=1 << 30)
    m, k, n = 64, 256, 48
    rng = np.random.default_rng(7)
    w_raw, _ = stored(rng.standard_normal((m, k), dtype=np.float32), GgmlType.F16)
    x = rng.standard_normal((n, k), dtype=np.float32)
    g, out = graph(GgmlType.F16, w_raw, x, m, k, n)
    g.run(srv.port, [out])
    assert srv.call(lambda: srv.server.devices[0].derived.held) == 0
