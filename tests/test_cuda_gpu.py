"""The CUDA kernels on a real GPU (marked `gpu`: run by bench/gpu_check.sh with `pytest -m gpu`).

Oracles are independent of the kernels: `gguf.quants.dequantize` on weights from the REAL
llama.cpp quantizer, the NumPy q8_1 quantizer written from ggml's definition, and float64 NumPy
formulas of each op. Without CuPy or a GPU these tests fail (CudaUnavailable), never skip.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import cuda_kernel_checks as checks
from support.cuda_kernel_checks import GLU_ORACLES, gguf_dequant
from support.cuda_quant import (
    FTYPES,
    QUANT_TYPES,
    dequant_q8_1,
    float_activations,
    q8_1_oracle,
    soft_max_case,
)

pytestmark = pytest.mark.gpu
pytest_plugins = ["support.cuda_gpu_fixtures"]

ALL_TYPES = ["F32", *FTYPES]


def test_quantize_q8_1_kernel_matches_ggml_definition(be, cp):
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(5)
    k, ncols = 4096, 3
    x = (rng.standard_normal((ncols, k)) * rng.uniform(0.01, 30, (ncols, k))).astype(np.float32)
    x[0, :32] = 0.0
    out = cp.zeros(launch.q8_1_bytes(k, ncols), cp.uint8)
    launch.quantize_q8_1(be, cp.asarray(x), out, k, ncols, k)
    be.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), q8_1_oracle(x.reshape(-1)))


@pytest.mark.parametrize("ncols", [1, 3])
@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q6_K", "IQ4_XS", "F16", "F32"])
def test_matvec_of_wide_rows_splits_them_and_agrees(be, cp, real_tensors, type_name, ncols):
    """Rows of 4096 (a model's width): the kernels whose warps split a row, against float64
    and against the warp-per-row kernels."""
    from rpcnet.compute.cuda import launch

    raw, k0 = real_tensors[type_name]
    per_row, rows = 4096 // k0, 12
    pick = (np.arange(rows * per_row) * 7) % raw.shape[0]  # real rows laid end to end
    wide = np.ascontiguousarray(raw[pick].reshape(rows, -1))
    k = k0 * per_row
    assert launch.split_rows(type_name, k)
    w = gguf_dequant(type_name, wide, k).astype(np.float64)
    y = np.random.default_rng(ncols + 30).standard_normal((ncols, k)).astype(np.float32)
    w_dev, y_dev = cp.asarray(wide), cp.asarray(y)
    outs = []
    for split in (True, False):
        dst = cp.full((ncols, rows), np.nan, cp.float32)
        scratch = cp.zeros(launch.q8_1_bytes(k, ncols), cp.uint8)
        launch.matvec(be, type_name, w_dev, y_dev, dst, k, rows, ncols, scratch, split=split)
        be.synchronize()
        outs.append(cp.asnumpy(dst).astype(np.float64))
    if type_name in QUANT_TYPES:
        yq = np.stack([_mmvq_activations(y[c], type_name) for c in range(ncols)])
    else:
        yq = float_activations(y, type_name)
    want, scale = yq @ w.T, np.abs(yq) @ np.abs(w).T
    for got in outs:
        assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), type_name


def _mmvq_activations(y: np.ndarray, type_name: str) -> np.ndarray:
    """The activation values the MMVQ kernels multiply: q8_1 of ggml's definition, or for the
    types whose CPU dot product takes q8_K (K-quants, IQ4_XS) q8_K's values with the scale
    as q8_K keeps it, in f32."""
    if type_name not in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"):
        return dequant_q8_1(q8_1_oracle(y))
    b = y.reshape(-1, 256)
    pick = np.abs(b).argmax(axis=-1)[..., None]  # the first of equal magnitudes
    mx = np.take_along_axis(b, pick, axis=-1)
    iscale = np.divide(np.float32(-127), mx, out=np.zeros_like(mx), where=mx != 0)
    q = np.minimum(np.float32(127), np.rint(iscale * b))
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (d.astype(np.float64) * q).reshape(-1)  # the f32 scale, as q8_K keeps it


@pytest.mark.parametrize("ncols", [1, 3, 8])
@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_matvec_matches_float64(be, cp, real_tensors, type_name, ncols):
    from rpcnet.compute.cuda import launch

    raw, k = real_tensors[type_name]
    raw = raw[:22]  # not a multiple of the warps per block
    m = raw.shape[0]
    w = gguf_dequant(type_name, raw, k).astype(np.float64)
    rng = np.random.default_rng(ncols)
    y = rng.standard_normal((ncols, k)).astype(np.float32)
    dst = cp.full((ncols, m), np.nan, cp.float32)
    scratch = cp.zeros(launch.q8_1_bytes(k, ncols), cp.uint8)
    launch.matvec(be, type_name, cp.asarray(raw), cp.asarray(y), dst, k, m, ncols, scratch)
    be.synchronize()
    got = cp.asnumpy(dst).astype(np.float64)
    if type_name in QUANT_TYPES:
        yq = np.stack([_mmvq_activations(y[c], type_name) for c in range(ncols)])
        want = yq @ w.T
        scale = np.abs(yq) @ np.abs(w).T
    else:
        yf = float_activations(y, type_name)
        want, scale = yf @ w.T, np.abs(yf) @ np.abs(w).T
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), type_name


@pytest.mark.parametrize("ne11", [1, 2])
@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_matvec_id_picks_experts(be, cp, real_tensors, type_name, ne11):
    """MUL_MAT_ID decode: 3 'experts' cut from one real tensor, 2 slots per token, 3 tokens."""
    from rpcnet.compute.cuda import launch

    raw, k = real_tensors[type_name]
    m = 6
    experts = raw[: 3 * m].reshape(3, m, -1)
    w = gguf_dequant(type_name, raw[: 3 * m], k).reshape(3, m, k).astype(np.float64)
    rng = np.random.default_rng(12)
    n_tokens, n_slots = 3, 2
    y = rng.standard_normal((n_tokens, ne11, k)).astype(np.float32)
    ids = np.array([[2, 0], [1, 1], [0, 2]], np.int32)
    dst = cp.full((n_tokens, n_slots, m), np.nan, cp.float32)
    scratch = cp.zeros(launch.q8_1_bytes(k, n_tokens * ne11), cp.uint8)
    launch.matvec_id(
        be,
        type_name,
        cp.asarray(np.ascontiguousarray(experts)),
        cp.asarray(y),
        cp.asarray(ids),
        dst,
        k,
        m,
        scratch,
    )
    be.synchronize()
    got = cp.asnumpy(dst).astype(np.float64)
    for t in range(n_tokens):
        for e in range(n_slots):
            yv = float_activations(y[t, e % ne11], type_name)
            if type_name in QUANT_TYPES:
                yv = _mmvq_activations(y[t, e % ne11], type_name)
            want = w[ids[t, e]] @ yv
            scale = np.abs(w[ids[t, e]]) @ np.abs(yv)
            assert np.all(np.abs(got[t, e] - want) <= 1e-5 * scale + 1e-30), (type_name, t, e)


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_dequantize_kernels_match_gguf(be, cp, real_tensors, type_name):
    from rpcnet.compute.cuda import launch

    raw, k = real_tensors[type_name]
    rows = raw.shape[0]
    oracle = gguf_dequant(type_name, raw, k)
    out32 = cp.zeros((rows, k), cp.float32)
    out16 = cp.zeros((rows, k), cp.float16)
    launch.dequantize(be, type_name, cp.asarray(raw), out32, k, rows, "f32")
    launch.dequantize(be, type_name, cp.asarray(raw), out16, k, rows, "f16")
    be.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out32), oracle)
    np.testing.assert_array_equal(cp.asnumpy(out16), oracle.astype(np.float16))


def _round_half_away(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def _rounded_like_cpu(x: np.ndarray, block: int) -> np.ndarray:
    """f32 rows as ggml's reference quantizers round them for the CPU dot product: q8_0/q8_1
    (blocks of 32, half scale, round half away) or q8_K (blocks of 256, scale from the signed
    extreme, round half even, at most 127); the values d * q, in f32."""
    rows, k = x.shape
    b = x.reshape(rows, k // block, block)
    if block == 32:
        d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        return (d.astype(np.float16).astype(np.float32) * _round_half_away(b * inv)).reshape(
            rows, k
        )
    pick = np.abs(b).argmax(axis=-1)[..., None]  # the first of equal magnitudes
    mx = np.take_along_axis(b, pick, axis=-1)
    iscale = np.divide(np.float32(-127), mx, out=np.zeros_like(mx), where=mx != 0)
    q = np.minimum(np.float32(127), np.rint(iscale * b))
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (d * q).reshape(rows, k)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0", "F16", "F32"])
def test_prefill_matmul_through_cublas(be, cp, real_tensors, type_name):
    from rpcnet.compute.cuda import launch

    raw, k = real_tensors[type_name]
    m = raw.shape[0]
    w = gguf_dequant(type_name, raw, k).astype(np.float64)
    y = np.random.default_rng(9).standard_normal((64, k)).astype(np.float32)
    w_bytes, y_bytes = launch.prefill_scratch_bytes(type_name, k, m, 64)
    w16, y16 = cp.zeros(max(w_bytes, 1), cp.uint8), cp.zeros(max(y_bytes, 1), cp.uint8)
    out = cp.full((64, m), np.nan, cp.float32)
    w_dev, y_dev = cp.asarray(raw), cp.asarray(y)
    launch.matmul_prefill(be, type_name, w_dev, y_dev, out, k, m, w16, y16)
    be.synchronize()
    got = cp.asnumpy(out)
    block = {"Q4_K": 256, "Q8_0": 32, "F16": 1, "F32": 1}[type_name]  # the CPU's activations
    yr = y if block == 1 else _rounded_like_cpu(y, block)
    want = yr.astype(np.float64) @ w.T
    scale = np.abs(yr.astype(np.float64)) @ np.abs(w).T
    # f16 operands (rounded once each, f32 sums and result) or plain f32
    bound = 1e-5 if type_name == "F32" else 1.5e-3
    assert np.all(np.abs(got - want) <= bound * scale)


def test_rms_norm_and_fused_mul(be, cp):
    checks.check_rms_norm(be, cp, 7, 4096)


@pytest.mark.parametrize("mask_dtype", [None, np.float32, np.float16])
def test_soft_max_with_mask_and_sinks(be, cp, mask_dtype):
    from rpcnet.compute.cuda import launch_attention

    rng = np.random.default_rng(7)
    heads, rows, n = 4, 5, 300
    x, mask, sinks, want = soft_max_case(rng, heads, rows, n, mask_dtype)
    out = cp.zeros((heads, rows, n), cp.float32)
    launch_attention.soft_max(
        be, cp.asarray(x), out, 0.125, None if mask is None else cp.asarray(mask), cp.asarray(sinks)
    )
    be.synchronize()
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_normal_and_neox(be, cp, mode):
    checks.check_rope(be, cp, mode)


@pytest.mark.parametrize("op", sorted(GLU_ORACLES))
def test_glu(be, cp, op):
    checks.check_glu(be, cp, op, 1000)


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_get_rows(be, cp, real_tensors, type_name):
    from rpcnet.compute.cuda import launch

    raw, k = real_tensors[type_name]
    ids = np.array([3, 0, 3, raw.shape[0] - 1], np.int32)
    out = cp.zeros((ids.size, k), cp.float32)
    launch.get_rows(be, type_name, cp.asarray(raw), cp.asarray(ids), out, k)
    be.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), gguf_dequant(type_name, raw, k)[ids])


@pytest.mark.parametrize("softcap", [0.0, 30.0])
@pytest.mark.parametrize("kv_type", ["F16", "Q8_0", "BF16"])
def test_flash_attn_decode(be, cp, kv_type, softcap):
    n_q, n_kv = 2, 200
    hidden = np.arange(n_kv)[None, :] > 150 + np.arange(n_q)[:, None]
    checks.check_flash_attn_decode(be, cp, kv_type, softcap, 8, n_kv, hidden)


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "DIV"])
def test_binary_broadcast(be, cp, op):
    checks.check_binary_broadcast(be, cp, op)


UNARY_ORACLES = {
    0: np.abs,
    2: np.negative,
    4: np.tanh,
    6: lambda x: np.maximum(x, 0),
    7: lambda x: 1 / (1 + np.exp(-x)),
    10: lambda x: x / (1 + np.exp(-x)),
    13: np.exp,
    16: lambda x: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2))),
    "SQR": np.square,
    "SIN": np.sin,
    "COS": np.cos,
    "SCALE": lambda x: x * 0.5 + 1.0,
}


@pytest.mark.parametrize("op", list(UNARY_ORACLES), ids=str)
def test_unary(be, cp, op):
    from rpcnet.compute.cuda import launch

    x = np.random.default_rng(16).standard_normal((7, 300)).astype(np.float32) * 3
    out = cp.zeros(x.shape, cp.float32)
    launch.unary(be, op, cp.asarray(x), out, 0.5, 1.0)
    be.synchronize()
    want = UNARY_ORACLES[op](x.astype(np.float64))
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("type_name", ["F16", "BF16"])
def test_float_matvec_on_rows_not_16_byte_aligned(be, cp, real_tensors, type_name):
    """The scalar path of the float matvec (weights 2 bytes off a 16-byte boundary)."""
    from rpcnet.compute.cuda import launch

    raw, k = real_tensors[type_name]
    m = raw.shape[0]
    base = cp.zeros(raw.size + 16, cp.uint8)
    w_dev = base[2 : 2 + raw.size]
    w_dev[:] = cp.asarray(raw.reshape(-1))
    y = np.random.default_rng(17).standard_normal((2, k)).astype(np.float32)
    dst = cp.zeros((2, m), cp.float32)
    launch.matvec(be, type_name, w_dev, cp.asarray(y), dst, k, m, 2)
    be.synchronize()
    w = gguf_dequant(type_name, raw, k).astype(np.float64)
    yf = float_activations(y, type_name)
    want, scale = yf @ w.T, np.abs(yf) @ np.abs(w).T
    assert np.all(np.abs(cp.asnumpy(dst) - want) <= 1e-5 * scale)


@pytest.mark.parametrize("dst_type", ["F32", "F16", "BF16", "Q8_0"])
def test_set_rows(be, cp, dst_type):
    import gguf
    from gguf.quants import dequantize, quantize
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(18)
    k, rows = 128, 6
    src = rng.standard_normal((3, k)).astype(np.float32)
    ids = np.array([4, 0, 2], np.int64)
    dst = cp.zeros(launch.row_bytes(dst_type, k) * rows, cp.uint8)
    launch.set_rows(be, cp.asarray(src), cp.asarray(ids), dst, dst_type)
    be.synchronize()
    qtype = gguf.GGMLQuantizationType[dst_type]
    got = np.asarray(dequantize(cp.asnumpy(dst).reshape(rows, -1), qtype)).reshape(rows, k)
    want = np.zeros((rows, k), np.float32)
    want[ids] = np.asarray(dequantize(quantize(src, qtype), qtype)).reshape(3, k)  # gguf's rounding
    np.testing.assert_array_equal(got, want)


def test_cpy_converts_and_permutes(be, cp):
    from rpcnet.compute.cuda import launch

    x = np.random.default_rng(19).standard_normal((4, 64)).astype(np.float32)
    out16 = cp.zeros((64, 4), cp.float16)  # same element count, another shape (ggml allows it)
    launch.cpy(be, cp.asarray(x), out16)
    back = cp.zeros((4, 64), cp.float32)
    launch.cpy(be, out16, back)
    tr = cp.zeros((64, 4), cp.float32).T  # a transposed destination view
    launch.cpy(be, cp.asarray(x), tr)
    be.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out16).reshape(-1), x.astype(np.float16).reshape(-1))
    np.testing.assert_array_equal(cp.asnumpy(back), x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(cp.asnumpy(tr), x)


@pytest.mark.parametrize("op", ["set_rows", "dequantize", "get_rows", "glu", "rope"])
def test_rows_past_the_grid_y_limit(be, cp, op):
    """More rows than grid.y holds (65535): FA-off prefill writes the transposed V cache as
    rows of one element (pp512: 512 * n_embd_v rows), and vocabularies pass 65535 rows."""
    import gguf
    from gguf.quants import dequantize, quantize
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(21)
    n = 70001
    wide = rng.standard_normal((n, 32)).astype(np.float32)
    if op == "set_rows":
        src = wide[:, :1].copy()
        ids = rng.permutation(n).astype(np.int64)
        got = cp.zeros(n, cp.float16)
        launch.set_rows(be, cp.asarray(src), cp.asarray(ids), got, "F16")
        want = np.zeros(n, np.float16)
        want[ids] = src[:, 0].astype(np.float16)
    elif op in ("dequantize", "get_rows"):
        q8 = np.asarray(quantize(wide, gguf.GGMLQuantizationType.Q8_0)).reshape(n, -1)
        deq = np.asarray(dequantize(q8, gguf.GGMLQuantizationType.Q8_0)).reshape(n, 32)
        got = cp.zeros((n, 32), cp.float32)
        if op == "dequantize":
            launch.dequantize(be, "Q8_0", cp.asarray(q8), got, 32, n, "f32")
            want = deq
        else:
            pick = rng.integers(0, n, n).astype(np.int32)
            launch.get_rows(be, "Q8_0", cp.asarray(q8), cp.asarray(pick), got, 32)
            want = deq[pick]
    elif op == "glu":
        a, b = cp.asarray(wide), cp.asarray(wide[::-1].copy())
        got = cp.zeros((n, 32), cp.float32)
        launch.glu(be, a, b, got, 0)
        want = np.maximum(wide, 0) * wide[::-1]
    else:  # position 0: rope is the identity
        x = cp.asarray(wide.reshape(n, 1, 32))
        got = cp.zeros((n, 1, 32), cp.float32)
        launch.rope_neox_or_normal(be, x, cp.zeros(n, cp.int32), got, 32, 0, 10000.0)
        want = wide.reshape(n, 1, 32)
    be.synchronize()
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("ncols", [1, 3])
def test_strided_matvec_on_cache_views(be, cp, ncols):
    """K*Q and V*KQ of a decode step on the KV cache's own layout: K rows of one head strided
    by all heads' width, V transposed (rows of kv positions), GQA broadcast over heads."""
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(23)
    d, n_kv, kv_size, h_kv, h = 64, 40, 256, 2, 8
    cache = rng.standard_normal((kv_size, h_kv * d)).astype(np.float16)  # K: [pos, head*d]
    q = rng.standard_normal((h, ncols, d)).astype(np.float32)
    dst = cp.zeros((h, ncols, n_kv), cp.float32)
    strides = (h_kv * d * 2, d * 2, d, ncols * d, n_kv, n_kv * ncols)
    launch.matvec_strided(
        be,
        "F16",
        cp.asarray(cache).view(cp.uint8).ravel(),
        cp.asarray(q),
        dst,
        d,
        n_kv,
        ncols,
        h,
        strides,
        h // h_kv,
    )
    k = cache[:n_kv].astype(np.float64).reshape(n_kv, h_kv, d)
    qf = float_activations(q, "F16")  # f16 weights: the activations rounded to f16 first
    want = np.einsum("hcd,nhd->hcn", qf, np.repeat(k, h // h_kv, axis=1))
    vt = rng.standard_normal((h_kv, d, kv_size)).astype(np.float16)  # V transposed
    p = rng.random((h, ncols, n_kv)).astype(np.float32)
    out = cp.zeros((h, ncols, d), cp.float32)
    vstrides = (kv_size * 2, d * kv_size * 2, n_kv, ncols * n_kv, d, d * ncols)
    launch.matvec_strided(
        be,
        "F16",
        cp.asarray(vt).view(cp.uint8).ravel(),
        cp.asarray(p),
        out,
        n_kv,
        d,
        ncols,
        h,
        vstrides,
        h // h_kv,
    )
    v = np.repeat(vt[..., :n_kv].astype(np.float64), h // h_kv, axis=0)  # (h, d, n_kv)
    want_v = np.einsum("hcn,hdn->hcd", float_activations(p, "F16"), v)
    be.synchronize()
    np.testing.assert_allclose(cp.asnumpy(dst), want, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(cp.asnumpy(out), want_v, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("block", [32, 256])
def test_prefill_activations_round_like_the_cpu_dot_product(be, cp, block):
    """q8_0/q8_1 (blocks of 32, half scale, round half away) and q8_K (blocks of 256, scale
    from the signed extreme, round half even, at most 127), as ggml's reference quantizers."""
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(24)
    rows, k = 5, 512
    x = (rng.standard_normal((rows, k)) * rng.uniform(0.01, 20, (rows, 1))).astype(np.float32)
    x[0, :256] = 0.0  # an all-zero block
    x[1, 7] = -40.0  # a negative extreme
    out = cp.zeros((rows, k), cp.float16)
    launch.round_activations(be, cp.asarray(x), out, k, rows, block)
    want = _rounded_like_cpu(x, block).astype(np.float16)
    be.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), want)


@pytest.mark.parametrize(("type_name", "k"), [("Q8_0", 256), ("Q8_0", 4096), ("F16", 4096)])
def test_matvec_adds_the_residual_in_place(be, cp, real_tensors, type_name, k):
    """dst = W y + r with r the destination itself (the residual ADD fused into the product)."""
    from rpcnet.compute.cuda import launch

    raw, k0 = real_tensors[type_name]
    per_row, rows = k // k0, 10
    pick = (np.arange(rows * per_row) * 5) % raw.shape[0]
    wide = np.ascontiguousarray(raw[pick].reshape(rows, -1))
    y = np.random.default_rng(40).standard_normal((2, k)).astype(np.float32)
    r = np.random.default_rng(41).standard_normal((2, rows)).astype(np.float32)
    w_dev, y_dev, dst = cp.asarray(wide), cp.asarray(y), cp.asarray(r)
    plain = cp.zeros((2, rows), cp.float32)
    scratch = cp.zeros(launch.q8_1_bytes(k, 2), cp.uint8)
    launch.matvec(be, type_name, w_dev, y_dev, plain, k, rows, 2, scratch)
    launch.matvec(be, type_name, w_dev, y_dev, dst, k, rows, 2, scratch, add=dst)
    be.synchronize()
    np.testing.assert_allclose(cp.asnumpy(dst), cp.asnumpy(plain) + r, rtol=1e-6, atol=1e-6)
