"""The CUDA kernels on a real GPU (marked `gpu`: run by bench/gpu_check.sh with `pytest -m gpu`).

Oracles are independent of the kernels: `gguf.quants.dequantize` on weights from the REAL
llama.cpp quantizer, the NumPy q8_1 quantizer written from ggml's definition, and float64 NumPy
formulas of each op. Without CuPy or a GPU these tests fail (CudaUnavailable), never skip.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.cuda_quant import (
    FTYPES,
    QUANT_TYPES,
    dequant_q8_1,
    flash_attn_oracle,
    float_activations,
    q8_1_oracle,
    real_quantized_rows,
    soft_max_case,
)

pytestmark = pytest.mark.gpu

ALL_TYPES = ["F32", *FTYPES]


@pytest.fixture(scope="module")
def be():
    from rpcnet.compute.cuda.device import CudaBackend

    backend = CudaBackend(0)
    backend.kernels.warm()
    # Inputs the tests make with CuPy go on the kernels' stream: a non-blocking stream is not
    # ordered against the legacy stream.
    backend.device.use()
    backend.stream.use()
    return backend


@pytest.fixture(scope="module")
def cp(be):
    return be.cp


@pytest.fixture(scope="module")
def real_tensors(tmp_path_factory):
    return real_quantized_rows(tmp_path_factory)


def _gguf_dequant(type_name: str, raw: np.ndarray, n: int) -> np.ndarray:
    import gguf
    from gguf.quants import dequantize

    out = dequantize(raw, gguf.GGMLQuantizationType[type_name])
    return np.asarray(out, np.float32).reshape(raw.shape[0], n)


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
    w = _gguf_dequant(type_name, wide, k).astype(np.float64)
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
    w = _gguf_dequant(type_name, raw, k).astype(np.float64)
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
    w = _gguf_dequant(type_name, raw[: 3 * m], k).reshape(3, m, k).astype(np.float64)
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
    oracle = _gguf_dequant(type_name, raw, k)
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
    w = _gguf_dequant(type_name, raw, k).astype(np.float64)
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
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(6)
    x = rng.standard_normal((7, 4096)).astype(np.float32)
    wt = rng.standard_normal(4096).astype(np.float32)
    eps = 1e-6
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + eps)
    out = cp.zeros_like(cp.asarray(x))
    launch.rms_norm(be, cp.asarray(x), out, eps)
    fused = cp.zeros_like(out)
    launch.rms_norm(be, cp.asarray(x), fused, eps, weight=cp.asarray(wt))
    be.synchronize()
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(cp.asnumpy(fused), want * wt, rtol=1e-5, atol=1e-6)


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
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(8)
    tokens, heads, d, n_dims, base = 5, 3, 128, 96, 10000.0
    x = rng.standard_normal((tokens, heads, d)).astype(np.float32)
    pos = np.array([0, 1, 7, 300, 4095], np.int32)
    k = np.arange(n_dims // 2)
    theta = pos[:, None].astype(np.float64) * base ** (-2.0 * k / n_dims)  # ggml: p * base^(-2k/n)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    want = x.astype(np.float64).copy()
    if mode == 0:
        a, b = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        want[..., 0:n_dims:2], want[..., 1:n_dims:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., : n_dims // 2], x[..., n_dims // 2 : n_dims]
        want[..., : n_dims // 2], want[..., n_dims // 2 : n_dims] = a * c - b * s, a * s + b * c
    out = cp.zeros_like(cp.asarray(x))
    launch.rope_neox_or_normal(be, cp.asarray(x), cp.asarray(pos), out, n_dims, mode, base)
    be.synchronize()
    # Angles are float32 (as in ggml): one ulp of p * base^(-2k/n) is ~1.2e-7 * p radians, so
    # the tolerance grows with the position (strict for small ones, where mode bugs would show).
    tol = (1e-5 + 2e-6 * pos.astype(np.float64))[:, None, None]
    assert np.all(np.abs(cp.asnumpy(out) - want) <= tol)


GLU_ORACLES = {
    0: lambda a, b: np.maximum(a, 0) * b,
    1: lambda a, b: 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * a * (1 + 0.044715 * a * a))) * b,
    2: lambda a, b: a / (1 + np.exp(-a)) * b,
    4: lambda a, b: a / (1 + np.exp(-1.702 * a)) * b,
}


@pytest.mark.parametrize("op", sorted(GLU_ORACLES))
def test_glu(be, cp, op):
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(op)
    a = (rng.standard_normal((6, 1000)) * 3).astype(np.float32)
    b = rng.standard_normal((6, 1000)).astype(np.float32)
    out = cp.zeros_like(cp.asarray(a))
    launch.glu(be, cp.asarray(a), cp.asarray(b), out, op)
    be.synchronize()
    want = GLU_ORACLES[op](a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_get_rows(be, cp, real_tensors, type_name):
    from rpcnet.compute.cuda import launch

    raw, k = real_tensors[type_name]
    ids = np.array([3, 0, 3, raw.shape[0] - 1], np.int32)
    out = cp.zeros((ids.size, k), cp.float32)
    launch.get_rows(be, type_name, cp.asarray(raw), cp.asarray(ids), out, k)
    be.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), _gguf_dequant(type_name, raw, k)[ids])


@pytest.mark.parametrize("softcap", [0.0, 30.0])
@pytest.mark.parametrize("kv_type", ["F16", "Q8_0", "BF16"])
def test_flash_attn_decode(be, cp, kv_type, softcap):
    import gguf
    from gguf.quants import quantize
    from rpcnet.compute.cuda import launch_attention

    rng = np.random.default_rng(10)
    heads, kv_heads, n_q, n_kv, d = 8, 2, 2, 200, 128
    q = rng.standard_normal((heads, n_q, d)).astype(np.float32)
    kf = rng.standard_normal((kv_heads, n_kv, d)).astype(np.float32)
    vf = rng.standard_normal((kv_heads, n_kv, d)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kv_type]
    k_raw, v_raw = quantize(kf, qtype), quantize(vf, qtype)  # gguf's own quantizer
    mask = np.where(np.arange(n_kv)[None, :] > 150 + np.arange(n_q)[:, None], -np.inf, 0)
    mask = mask.astype(np.float16)
    sinks = rng.standard_normal(heads).astype(np.float32)
    scale = 1 / np.sqrt(d)

    want = flash_attn_oracle(q, k_raw, v_raw, kv_type, kf.shape, mask, scale, softcap, sinks)
    out = cp.zeros((n_q, heads, d), cp.float32)
    launch_attention.flash_attn_decode(
        be,
        cp.asarray(q),
        cp.asarray(np.ascontiguousarray(k_raw)),
        cp.asarray(np.ascontiguousarray(v_raw)),
        cp.asarray(mask),
        out,
        kv_type,
        scale,
        softcap,
        cp.asarray(sinks),
    )
    be.synchronize()
    # f16 V: an f16 sum can round the other way after a last-bit difference of a dot product
    tol = 2e-3 if kv_type == "F16" else 1e-4
    np.testing.assert_allclose(cp.asnumpy(out), want, rtol=tol, atol=tol * 1e-1)


def test_allocation_failure_returns_none(be):
    assert be.allocate(1 << 50) is None


def test_views_and_staged_round_trip(be, cp):
    nbytes = (64 << 20) + 12345  # several staging chunks and a ragged tail
    buf = be.allocate(nbytes + 4096)
    assert buf is not None
    payload = np.random.default_rng(11).integers(0, 256, nbytes, dtype=np.uint8)
    fed = 0

    def fill(view):
        nonlocal fed
        view[:] = payload[fed : fed + len(view)].tobytes()
        fed += len(view)

    be.upload(buf, 4096, nbytes, fill)
    be.synchronize()
    view = be.view(buf, 4096, (nbytes,), (1,), cp.uint8)
    assert int(cp.asnumpy(view[:16]).sum()) == int(payload[:16].sum())
    back = bytearray()
    be.download(buf, 4096, nbytes, lambda v: back.extend(bytes(v)))
    assert bytes(back) == payload.tobytes()
    f = be.view(buf, 4096, (8, 4), (16, 4), cp.float32)
    np.testing.assert_array_equal(cp.asnumpy(f), payload[: 8 * 16].view(np.float32).reshape(8, 4))
    be.fill(buf, 4096, 1024, 0)
    be.copy(buf, 4096 + 1024, buf, 4096, 1024)
    be.synchronize()
    assert not cp.asnumpy(buf[4096 : 4096 + 2048]).any()


def test_captured_matvec_replays_with_new_inputs(be, cp, real_tensors):
    """A decode-shaped plan (q8_1 quantize + MMVQ) captured once and replayed: new activation
    contents give new, correct results without recapturing."""
    from rpcnet.compute.cuda import launch
    from rpcnet.compute.cuda.capture import GraphReplayCache
    from rpcnet.compute.cuda.device import CupyCapturer

    raw, k = real_tensors["Q8_0"]
    m = raw.shape[0]
    w_dev = cp.asarray(raw)
    y_dev = cp.zeros((1, k), cp.float32)
    dst = cp.zeros((1, m), cp.float32)
    scratch = cp.zeros(launch.q8_1_bytes(k, 1), cp.uint8)
    cache = GraphReplayCache(CupyCapturer(be.stream))
    w = _gguf_dequant("Q8_0", raw, k).astype(np.float64)

    def step():
        launch.matvec(be, "Q8_0", w_dev, y_dev, dst, k, m, 1, scratch)

    rng = np.random.default_rng(13)
    modes = []
    for _ in range(4):
        y = rng.standard_normal((1, k)).astype(np.float32)
        with be.device, be.stream:
            y_dev.set(y, stream=be.stream)
        modes.append(cache.run("s", "plan", frozenset({1}), True, step))
        be.synchronize()
        yq = dequant_q8_1(q8_1_oracle(y[0]))
        want, scale = w @ yq, np.abs(w) @ np.abs(yq)
        assert np.all(np.abs(cp.asnumpy(dst)[0] - want) <= 1e-5 * scale + 1e-30)
    assert modes == ["eager", "captured", "replayed", "replayed"]


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "DIV"])
def test_binary_broadcast(be, cp, op):
    from rpcnet.compute.cuda import launch

    rng = np.random.default_rng(15)
    a = rng.standard_normal((2, 3, 5, 64)).astype(np.float32)
    b = rng.uniform(0.5, 2, (1, 3, 1, 64)).astype(np.float32)  # repeats over dims 3 and 1
    want = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide}[op](a, b)
    out = cp.zeros(a.shape, cp.float32)
    a_dev = cp.asarray(a)
    launch.binary(be, op, a_dev, cp.asarray(b), out)
    # a transposed (non-contiguous) view in and out
    out_t = cp.zeros((64, 5, 3, 2), cp.float32).transpose(3, 2, 1, 0)
    launch.binary(be, op, a_dev, cp.asarray(b), out_t)
    be.synchronize()
    np.testing.assert_array_equal(cp.asnumpy(out), want)
    np.testing.assert_array_equal(cp.asnumpy(out_t), want)


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
    w = _gguf_dequant(type_name, raw, k).astype(np.float64)
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


def test_device_buffer_through_the_cuda_backend_seam():
    """DeviceBuffer on a cuda protocol device: staged receive in pieces, reads, fill, copy,
    host_array/write_back — the calls the session makes — byte-exact against NumPy."""
    from rpcnet.compute.buffer import DeviceBuffer
    from rpcnet.compute.cuda.serve import make_cuda_devices

    (device,) = make_cuda_devices("cuda:0", 1 << 30, None, ready=True)
    try:
        assert device.name == "CUDA0" and device.description.startswith("NVIDIA")
        free, total = device.memory_report()
        assert 0 < free <= total <= 1 << 30
        size = (20 << 20) + 777
        mem = device.allocate(size)
        buf = DeviceBuffer(1, device, 0x1000, size, mem)
        payload = np.random.default_rng(5).integers(0, 256, size - 100, dtype=np.uint8)
        fed = 0
        for piece in buf.host_sink(100, size - 100).pieces():
            piece[:] = payload[fed : fed + len(piece)].tobytes()
            fed += len(piece)
        assert fed == size - 100
        assert bytes(buf.read(100, size - 100)) == payload.tobytes()
        buf.fill(100, 64, 0xAB)
        buf.copy_from(1000, buf, 100, 64)
        assert bytes(buf.read(1000, 64)) == b"\xab" * 64
        host = buf.host_array(0, 4096)
        host[:] = 7
        buf.write_back(0, host)
        assert bytes(buf.read(0, 4096)) == b"\x07" * 4096
        sink = buf.host_sink(4096, 8192)
        sink.whole()[:] = b"\x01" * 8192
        sink.commit()
        assert bytes(buf.read(4096, 8192)) == b"\x01" * 8192
    finally:
        device.shutdown()


def test_plan_on_a_cuda_device_runs_eager_captured_replayed_like_the_cpu():
    """A decode-shaped plan (RMS_NORM, then a q8_0 and an f16 matvec, then SWIGLU) compiled for
    a cuda device by the registry, run by its PlanRunner (eager, captured, replayed), against
    the same plan on the CPU device."""
    import struct

    from rpcnet import _native
    from rpcnet.compute.buffer import DeviceBuffer
    from rpcnet.compute.cuda.serve import make_cuda_devices
    from rpcnet.compute.device import cpu_device
    from rpcnet.compute.graph import compile_plan
    from rpcnet.compute.ops import Glu, Op
    from rpcnet.compute.tensor import FLAG_COMPUTE, Tensor
    from rpcnet.ggml_types import GgmlType as T

    rng = np.random.default_rng(9)
    k, m = 512, 256
    x = rng.standard_normal(k).astype(np.float32)
    w16 = rng.standard_normal((m, k)).astype(np.float16)
    wq = rng.standard_normal((m, k)).astype(np.float32)
    import gguf.quants

    wq8 = gguf.quants.quantize(wq, gguf.GGMLQuantizationType.Q8_0)

    def build(device):
        size = 4 << 20
        buf = DeviceBuffer(1, device, 0x1000, size, device.allocate(size))
        used = [0]

        def tensor(type_, ne, op=0, params=(), src=(), data=None):
            _, block, ts, _ = _native.type_info(type_)
            nb1 = ts * ne[0] // block
            nb = (ts, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])
            raw = b"".join(
                struct.pack("<f" if isinstance(p, float) else "<i", p) for p in params
            ).ljust(64, b"\0")
            t = Tensor(
                0,
                int(type_),
                ne,
                nb,
                int(op),
                raw,
                FLAG_COMPUTE if op else 0,
                "",
                buf,
                used[0],
                tuple(src),
            )
            if data is not None:
                buf.write(t.offset, np.ascontiguousarray(data).tobytes())
            used[0] += (t.nbytes + 255) // 256 * 256
            return t

        xt = tensor(T.F32, (k, 1, 1, 1), data=x)
        n = tensor(T.F32, (k, 1, 1, 1), Op.RMS_NORM, (1e-6,), (xt,))
        g = tensor(T.F32, (m, 1, 1, 1), Op.MUL_MAT, (), (tensor(T.Q8_0, (k, m, 1, 1), data=wq8), n))
        u = tensor(T.F32, (m, 1, 1, 1), Op.MUL_MAT, (), (tensor(T.F16, (k, m, 1, 1), data=w16), n))
        out = tensor(T.F32, (m, 1, 1, 1), Op.GLU, (int(Glu.SWIGLU), 0), (g, u))
        return [n, g, u, out], buf, out

    cpu = cpu_device(0, capacity=1 << 30)
    (gpu,) = make_cuda_devices("cuda:0", 1 << 30, None, ready=True)
    try:
        nodes, cbuf, cout = build(cpu)
        compile_plan(nodes, "cpu").run()
        want = np.frombuffer(bytes(cbuf.read(cout.offset, 4 * m)), np.float32)
        nodes, gbuf, gout = build(gpu)
        plan = compile_plan(nodes, gpu.kind)
        for expected in ("eager", "captured", "replayed"):
            assert gpu.submit(gpu.plan_work(plan, "session")).result() == expected
            got = np.frombuffer(bytes(gbuf.read(gout.offset, 4 * m)), np.float32)
            # q8_1 activations on the GPU vs f32 on the CPU: the quantized-type tolerance
            assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), expected
    finally:
        gpu.shutdown()
        cpu.shutdown()


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
