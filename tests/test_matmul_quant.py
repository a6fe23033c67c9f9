"""The native matmul for every weight type (`_native.matmul_quant`, MUL_MAT / MUL_MAT_ID paths).

Weights come from llama.cpp's own quantizer (`ggml_quantize_chunk` via the reference env).
Oracles: (1) ggml's definition in NumPy — weights dequantized by gguf, activations quantized by
an independent NumPy version of ggml's x86 activation quantizers, the dot in float64; (2) the
reference rpc-server running the same single-op MUL_MAT graph. Both the portable and the SIMD
builds run every check.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize as gguf_dequantize
from rpcnet import _native
from rpcnet.compute.cuda.sources import TYPE_IDS
from rpcnet.compute.kernels.kernel_table import select
from support import refenv
from support.ggml_oracle import q8_x86
from support.opgraph import OpGraph, as_f32
from support.tensors import node as _tensor

F32, F16, BF16, I32 = 0, 1, 30, 26
MUL_MAT, MUL_MAT_ID = 29, 30
# every weight type rpcnet computes (the same set on CPU and CUDA), by ggml name
TYPES = TYPE_IDS
# vec_dot type of each weight type on ggml's CPU backend (type_traits_cpu)
VEC_DOT = {2: "q8_0", 3: "q8_1", 6: "q8_0", 7: "q8_1", 8: "q8_0", 20: "q8_0", 39: "q8_0"}
VEC_DOT |= {t: "q8_K" for t in (10, 11, 12, 13, 14, 23)}
VEC_DOT |= {0: "f32", 1: "f16", 30: "bf16"}
M = 37  # weight rows in every test matrix (not a multiple of 4: ggml keeps vec_dot)


def k_values(type_id: int) -> tuple[int, int]:
    """An odd K (not a multiple of 256 where the type allows it) and a larger one."""
    if type_id in (0, 1, 30):
        return 87, 1024
    if VEC_DOT[type_id] == "q8_K":
        return 256, 1280
    return 96, 1024


@pytest.fixture(scope="module")
def real_weights(tmp_path_factory) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """{(type, K): (float32 source (M, K), bytes from llama.cpp's quantizer (M, row bytes))}."""
    tmp = tmp_path_factory.mktemp("quant")
    rng = np.random.default_rng(1234)
    sources = {}
    for type_id in TYPES.values():
        for k in k_values(type_id):
            # rows of different magnitudes, a few outliers: exercises scales and mins
            w = rng.standard_normal((M, k)).astype(np.float32)
            w *= np.logspace(-2, 1, M, dtype=np.float32)[:, None]
            w[:, ::17] *= 3.0
            sources[(type_id, k)] = w
    quantized = {k: v for k, v in sources.items() if k[0] != F32}
    np.savez(tmp / "in.npz", **{f"t{t}_{k}": w for (t, k), w in quantized.items()})
    refenv.run_probe("v8", "quantize_rows", tmp / "in.npz", tmp / "out.npz", timeout=300)
    out = {}
    with np.load(tmp / "out.npz") as q:
        for (t, k), w in sources.items():
            out[(t, k)] = (w, w.view(np.uint8).copy() if t == F32 else q[f"t{t}_{k}"])
    return out


# ---- NumPy oracle: ggml's definitions, written independently of the kernels -----------------


def q8_k_ref(x: np.ndarray):
    """quantize_row_q8_K_ref per 256-block: (d float32, codes)."""
    b = x.reshape(x.shape[0], -1, 256).astype(np.float32)
    idx = np.abs(b).argmax(axis=2)  # first of the largest magnitudes, like the `>` scan
    mx = np.take_along_axis(b, idx[..., None], axis=2)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127) / mx, np.float32(0)).astype(np.float32)
    codes = np.minimum(127, np.rint(b * iscale[..., None])).astype(np.int64)
    with np.errstate(divide="ignore"):
        d = np.where(mx != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    return d, codes


def bf16_round(x: np.ndarray) -> np.ndarray:
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint32) << 16
    return r.view(np.float32)


def oracle(type_id: int, wbytes: np.ndarray, k: int, x: np.ndarray):
    """(exact result of ggml's definition in float64 (N, M), Σ|terms| (N, M))."""
    m = wbytes.shape[0]
    if type_id == F32:
        wd = wbytes.view(np.float32).reshape(m, k).astype(np.float64)
    else:
        qtype = gguf.GGMLQuantizationType(type_id)
        wd = np.asarray(gguf_dequantize(wbytes, qtype), np.float64).reshape(m, k)
    kind = VEC_DOT[type_id]
    correction = 0.0
    if kind in ("q8_0", "q8_1"):
        d, codes, s = q8_x86(x, kind == "q8_1")
        xd = (d[..., None].astype(np.float64) * codes).reshape(x.shape)
        if kind == "q8_1":
            # ggml adds m · s with s = fp16(d · Σcodes) instead of m · d · Σcodes
            blk = 20 if type_id == 3 else 24
            mins = wbytes.reshape(m, -1, blk)[:, :, 2:4].copy().view(np.float16)[..., 0]
            delta = s.astype(np.float64) - d.astype(np.float64) * codes.sum(axis=2)
            correction = delta @ mins.astype(np.float64).T
    elif kind == "q8_K":
        d, codes = q8_k_ref(x)
        xd = (d[..., None].astype(np.float64) * codes).reshape(x.shape)
    elif kind == "f16":
        xd = x.astype(np.float16).astype(np.float64)
    elif kind == "bf16":
        xd = bf16_round(x).astype(np.float64)
    else:
        xd = x.astype(np.float64)
    scale = np.abs(xd) @ np.abs(wd).T + np.abs(correction)
    return xd @ wd.T + correction, scale


def run_kernel(type_id, w, stride, x, threads=2, llamafile=False):
    out = np.full((x.shape[0], w.shape[0] if w.ndim == 2 else M), np.nan, np.float32)
    _native.matmul_quant(type_id, w, stride, np.ascontiguousarray(x), out, threads, llamafile)
    return out


@pytest.mark.parametrize("name", sorted(TYPES))
def test_matches_ggml_definition(name, path, real_weights):
    type_id = TYPES[name]
    rng = np.random.default_rng(type_id)
    for k in k_values(type_id):
        _, wq = real_weights[(type_id, k)]
        row = wq.shape[1]
        for n in (1, 3, 9, 64):
            x = (rng.standard_normal((n, k)) * rng.uniform(0.1, 10, (n, 1))).astype(np.float32)
            got = run_kernel(type_id, wq, row, x)
            want, scale = oracle(type_id, wq, k, x)
            err = np.abs(got - want)
            assert np.all(err <= 1e-5 * scale + 1e-30), (
                f"{name} K={k} N={n} ({path}): max err/scale {np.max(err / scale):.3g}"
            )
        # M = 1 and strided rows (stride a whole number of blocks larger than the row)
        x = rng.standard_normal((2, k)).astype(np.float32)
        one = run_kernel(type_id, wq[:1], row, x, threads=1)
        block_bytes = _native.matmul_quant_block(type_id)[1]
        stride = row + 3 * block_bytes
        padded = np.full((M, stride), 0x5A, np.uint8)
        padded[:, :row] = wq
        flat = padded.reshape(-1)[: (M - 1) * stride + row]
        strided = run_kernel(type_id, flat, stride, x, threads=3)
        dense = run_kernel(type_id, wq, row, x, threads=1)
        assert np.array_equal(strided, dense), f"{name}: strided rows differ"
        assert np.array_equal(one[:, 0], dense[:, 0]), f"{name}: M=1 differs"


@pytest.mark.parametrize("name", sorted(TYPES))
def test_portable_and_simd_builds_agree_bitwise(name, real_weights):
    type_id = TYPES[name]
    rng = np.random.default_rng(99)
    try:
        for k in k_values(type_id):
            _, wq = real_weights[(type_id, k)]
            x = rng.standard_normal((5, k)).astype(np.float32)
            for llamafile in (False, True):  # vec_dot and tinyBLAS orders (M = 36 for the latter)
                w = wq if not llamafile else wq[:36]
                assert _native.set_portable_kernels(False)
                simd = run_kernel(type_id, w, w.shape[1], x, llamafile=llamafile)
                assert not _native.set_portable_kernels(True)
                portable = run_kernel(type_id, w, w.shape[1], x, llamafile=llamafile)
                assert np.array_equal(simd.view(np.uint32), portable.view(np.uint32)), name
    finally:
        _native.set_portable_kernels(False)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_each_row_keeps_every_rows_single_row_bits(name, real_weights):
    """`each_row` (what a joint decode pass runs: several clients' rows over weights read once)
    gives every row the bits of its own single-row product, for every type, on both builds."""
    type_id = TYPES[name]
    rng = np.random.default_rng(7)
    try:
        for portable in (False, True):
            _native.set_portable_kernels(portable)
            for k in k_values(type_id):
                _, wq = real_weights[(type_id, k)]
                x = (rng.standard_normal((5, k)) * rng.uniform(0.1, 10, (5, 1))).astype(np.float32)
                together = np.full((5, M), np.nan, np.float32)
                _native.matmul_quant(type_id, wq, wq.shape[1], x, together, 2, False, True)
                alone = np.concatenate(
                    [run_kernel(type_id, wq, wq.shape[1], x[r : r + 1]) for r in range(5)]
                )
                assert np.array_equal(together.view(np.uint32), alone.view(np.uint32)), (name, k)
                assert np.isfinite(alone).all() and len(np.unique(alone)) > M  # not vacuous
    finally:
        _native.set_portable_kernels(False)


# ---- the reference rpc-server ----------------------------------------------------------------

# ggml's MUL_MAT at N >= 8 runs its tiled kernel for the K-quants and IQ4_XS, at N >= 2
# llamafile's tinyBLAS for IQ4_NL, f32, f16 and bf16: the kernel reproduces both (its
# `llamafile` flag), so every N is bit-exact.


def _graph(type_id, wq, k, ns, rng):
    g = OpGraph()
    w = g.input(type_id, (k, M), wq.reshape(-1))
    outs = []
    for n in ns:
        xv = rng.standard_normal((n, k)).astype(np.float32)
        x = g.input(F32, (k, n), xv)
        outs.append((g.op(MUL_MAT, F32, (M, n), (w, x)), xv))
    return g, outs


@pytest.mark.parametrize("name", sorted(TYPES))
def test_against_reference_server(name, path, real_weights, reference_v8, rpcnet_v8):
    type_id = TYPES[name]
    rng = np.random.default_rng(type_id + 7)
    for k in k_values(type_id):
        _, wq = real_weights[(type_id, k)]
        g, outs = _graph(type_id, wq, k, (1, 3, 9, 64), rng)
        ids = [o for o, _ in outs]
        ref = g.run(reference_v8, ids)
        served = g.run(rpcnet_v8, ids)
        for (_, xv), r, s in zip(outs, ref, served, strict=True):
            n = xv.shape[0]
            want = as_f32(r, (M, n)).reshape(n, M)
            got = run_kernel(type_id, wq, wq.shape[1], xv, llamafile=True)
            served_f32 = as_f32(s, (M, n)).reshape(n, M)
            if name in ("F16", "BF16") and n >= 32:  # the server's prompt GEMM
                _, scale = oracle(type_id, wq, k, xv)
                assert np.all(np.abs(served_f32 - want) <= 2e-6 * scale), f"{name} N={n} GEMM"
            else:
                assert np.array_equal(served_f32, got), "server != kernel"
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
                f"{name} K={k} N={n} ({path}): not bit-exact, max |d| "
                f"{np.max(np.abs(got - want)):.3g}"
            )


# ---- registration -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(TYPES))
def test_native_kernels_selected_for_every_type(name):
    type_id = TYPES[name]
    k = k_values(type_id)[1]
    for ne_a, ne_b in [((k, 64), (k, 1)), ((k, 64), (k, 300)), ((k, 64, 2), (k, 3, 4))]:
        node = _tensor(F32, (64, *ne_b[1:]), MUL_MAT, (_tensor(type_id, ne_a), _tensor(F32, ne_b)))
        assert select(node).name == "mul_mat_native", (name, ne_a, ne_b)
    experts = _tensor(type_id, (k, 64, 4))
    ids = _tensor(I32, (2, 5))
    node = _tensor(F32, (64, 2, 5), MUL_MAT_ID, (experts, _tensor(F32, (k, 1, 5)), ids))
    assert select(node).name == "mul_mat_id_native"


def test_batched_broadcast_and_mul_mat_id_against_reference(reference_v8, rpcnet_v8, real_weights):
    """ne02 = 2 weights broadcast over ne12 = 4 activation batches; MUL_MAT_ID over 4 experts."""
    rng = np.random.default_rng(5)
    type_id, k = TYPES["Q4_K"], 256
    _, wq = real_weights[(type_id, k)]
    experts = wq[:32]  # 4 experts of 8 rows
    g = OpGraph()
    w = g.input(type_id, (k, 16, 2), wq[:32].reshape(-1))
    xv = rng.standard_normal((4, 3, k)).astype(np.float32)
    x = g.input(F32, (k, 3, 4), xv)
    mm = g.op(MUL_MAT, F32, (16, 3, 4), (w, x))
    e = g.input(type_id, (k, 8, 4), experts.reshape(-1))
    b = g.input(F32, (k, 1, 6), rng.standard_normal((6, k)).astype(np.float32))
    ids = g.input(I32, (2, 6), rng.integers(0, 4, (6, 2)).astype(np.int32))
    mmid = g.op(MUL_MAT_ID, F32, (8, 2, 6), (e, b, ids))
    ref = g.run(reference_v8, [mm, mmid])
    ours = g.run(rpcnet_v8, [mm, mmid])
    for r, o, ne in zip(ref, ours, [(16, 3, 4), (8, 2, 6)], strict=True):
        assert np.array_equal(as_f32(o, ne), as_f32(r, ne)), ne


@pytest.mark.parametrize("name", ["Q8_0", "Q4_1", "Q6_K"])  # q8_0, q8_1, q8_K activations
def test_activation_ties_round_like_reference(name, path, real_weights, reference_v8):
    """Activations exactly halfway between two codes: ggml's x86 path rounds them to even."""
    type_id = TYPES[name]
    k = k_values(type_id)[0]
    _, wq = real_weights[(type_id, k)]
    rng = np.random.default_rng(11)
    x = (rng.integers(-100, 100, (1, k)) + 0.5).astype(np.float32)
    x[0, ::32] = 127.0  # amax 127 in every block: scale 1, the codes are x itself
    g = OpGraph()
    w = g.input(type_id, (k, M), wq.reshape(-1))
    out = g.op(MUL_MAT, F32, (M, 1), (w, g.input(F32, (k, 1), x)))
    want = as_f32(g.run(reference_v8, [out])[0], (M, 1)).reshape(1, M)
    got = run_kernel(type_id, wq, wq.shape[1], x)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
def test_float_weights_follow_llamafile_sgemm(name, path, real_weights, reference_v8, rpcnet_v8):
    """M % 4 == 0 and N >= 2: ggml's MUL_MAT runs llamafile's tinyBLAS; rpcnet its order."""
    type_id, m = TYPES[name], 36
    rng = np.random.default_rng(21)
    for k in k_values(type_id):
        wq = real_weights[(type_id, k)][1][:m]
        g = OpGraph()
        w = g.input(type_id, (k, m), wq.reshape(-1))
        outs = []
        for n in (1, 2, 9, 64):
            xv = rng.standard_normal((n, k)).astype(np.float32)
            outs.append((g.op(MUL_MAT, F32, (m, n), (w, g.input(F32, (k, n), xv))), xv))
        ids = [o for o, _ in outs]
        ref, served = g.run(reference_v8, ids), g.run(rpcnet_v8, ids)
        for (_, xv), r, s in zip(outs, ref, served, strict=True):
            n = xv.shape[0]
            want = as_f32(r, (m, n)).reshape(n, m)
            got = np.empty((n, m), np.float32)
            _native.matmul_quant(type_id, wq, wq.shape[1], xv, got, 2, True)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), f"{name} K={k} N={n}"
            served_f32 = as_f32(s, (m, n)).reshape(n, m)
            assert np.array_equal(served_f32, got), f"{name}: server"
