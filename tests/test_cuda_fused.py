"""The fused decode kernels EXECUTED on the CPU (tests/support/cuda_emu): a norm that quantizes
what it writes, products of one input in one launch, and the gate/up products with their GLU,
each against NumPy oracles (gguf.quants for weights, ggml's q8_1 and q8_K definitions, float64
formulas), in both the warp-per-row and the block-per-row (wide rows) forms."""

from __future__ import annotations

import numpy as np
import pytest
from rpcnet.compute.cuda import launch, launch_fused
from support.cuda_emu import EmuBackend
from support.cuda_quant import float_activations, q8_1_oracle
from test_cuda_emulated import _gguf_dequant, _mmvq_activations, random_rows

GROUP_TYPES = ["Q8_0", "Q4_K", "Q6_K", "IQ4_NL", "F16", "F32"]
#: row lengths below and at the wide-row form (launch.split_rows)
ROW_LENGTHS = [512, 2048]


@pytest.fixture(scope="module")
def be() -> EmuBackend:
    return EmuBackend()


def _activations(y: np.ndarray, type_name: str) -> np.ndarray:
    """What the products multiply the weights by, per column."""
    if type_name in ("F32", "F16", "BF16"):
        return float_activations(y, type_name)
    return np.stack([_mmvq_activations(y[c], type_name) for c in range(y.shape[0])])


@pytest.mark.parametrize("block", [32, 256])
def test_norm_quantizes_what_it_writes(be, block):
    rng = np.random.default_rng(block)
    rows, n = 3, 1024
    x = (rng.standard_normal((rows, n)) * rng.uniform(0.1, 20, (rows, n))).astype(np.float32)
    wt = rng.standard_normal(n).astype(np.float32)
    dst = be.zeros((rows, n), np.float32)
    q = be.zeros(launch.q8_1_bytes(n, rows), np.uint8)
    launch_fused.rms_norm_mul_q8(be, be.asarray(x), dst, 1e-6, be.asarray(wt), q, block)
    out = be.asnumpy(dst)
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-6) * wt
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    blocks = be.asnumpy(q).reshape(-1, 36)
    if block == 32:  # byte for byte what ggml's q8_1 quantizer makes of the written rows
        np.testing.assert_array_equal(blocks.reshape(-1), q8_1_oracle(out.reshape(-1)))
    else:  # q8_K's f32 scale in each block's first four bytes
        scale = blocks[:, :4].copy().view(np.float32).astype(np.float64)
        got = (scale * blocks[:, 4:].view(np.int8)).reshape(-1)
        want_q = np.concatenate([_mmvq_activations(out[r], "Q4_K") for r in range(rows)])
        np.testing.assert_array_equal(got, want_q)


def test_norm_refuses_rows_it_cannot_quantize(be):
    x = be.zeros((1, 96), np.float32)
    with pytest.raises(ValueError, match="multiple of 256"):
        launch_fused.rms_norm_mul_q8(be, x, x, 1e-6, be.zeros(96, np.float32), x, 256)


@pytest.mark.parametrize("k", ROW_LENGTHS)
@pytest.mark.parametrize("type_name", GROUP_TYPES)
def test_group_of_three_products(be, type_name, k):
    rows, ncols = (22, 5, 9), 2  # not multiples of the warps per block
    rng = np.random.default_rng(k)
    y = rng.standard_normal((ncols, k)).astype(np.float32)
    raws = [random_rows(type_name, m, k, seed=i + k) for i, m in enumerate(rows)]
    dsts = [be.full((ncols, m), np.nan, np.float32) for m in rows]
    scratch = be.zeros(launch.q8_1_bytes(k, ncols), np.uint8)
    weights = [be.asarray(r) for r in raws]
    launch_fused.matvec_group(be, type_name, weights, be.asarray(y), dsts, k, rows, ncols, scratch)
    yq = _activations(y, type_name)
    for raw, dst in zip(raws, dsts, strict=True):
        w = _gguf_dequant(type_name, raw, k).astype(np.float64)
        want, scale = yq @ w.T, np.abs(yq) @ np.abs(w).T
        got = be.asnumpy(dst).astype(np.float64)
        assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), type_name


def test_group_reads_blocks_already_quantized(be):
    """`quantized`: the scratch holds the input's blocks (its producer wrote them); the input
    itself is not read."""
    k, m = 512, 6
    y = np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)
    scratch = be.asarray(q8_1_oracle(y.reshape(-1)))
    raw = random_rows("Q8_0", m, k, seed=2)
    dst = be.full((1, m), np.nan, np.float32)
    garbage = be.full((1, k), np.nan, np.float32)
    launch_fused.matvec_group(
        be, "Q8_0", [be.asarray(raw)], garbage, [dst], k, [m], 1, scratch, quantized=True
    )
    w = _gguf_dequant("Q8_0", raw, k).astype(np.float64)
    yq = _activations(y, "Q8_0")
    want, scale = yq @ w.T, np.abs(yq) @ np.abs(w).T
    assert np.all(np.abs(be.asnumpy(dst) - want) <= 1e-5 * scale)


GLU_OPS = {  # glu.cu's op ids -> act(a) * b in float64
    0: lambda a, b: np.maximum(a, 0) * b,
    2: lambda a, b: a / (1 + np.exp(-a)) * b,
    4: lambda a, b: a / (1 + np.exp(-1.702 * a)) * b,
}


@pytest.mark.parametrize("k", ROW_LENGTHS)
@pytest.mark.parametrize(("type_name", "op"), [("Q8_0", 2), ("Q4_K", 0), ("F16", 4), ("F32", 2)])
def test_gate_up_products_with_their_glu(be, type_name, op, k):
    m, ncols = 13, 2
    rng = np.random.default_rng(op + k)
    y = rng.standard_normal((ncols, k)).astype(np.float32)
    gate_raw, up_raw = (random_rows(type_name, m, k, seed=s + k) for s in (7, 8))
    dst = be.full((ncols, m), np.nan, np.float32)
    scratch = be.zeros(launch.q8_1_bytes(k, ncols), np.uint8)
    launch_fused.matvec_glu(
        be, type_name, be.asarray(gate_raw), be.asarray(up_raw), be.asarray(y), dst,
        k, m, ncols, op, 1.702, 7.0, yq=scratch,
    )  # fmt: skip
    yq = _activations(y, type_name)
    wg, wu = (_gguf_dequant(type_name, r, k).astype(np.float64) for r in (gate_raw, up_raw))
    g, u = yq @ wg.T, yq @ wu.T
    sg, su = np.abs(yq) @ np.abs(wg).T, np.abs(yq) @ np.abs(wu).T
    want = GLU_OPS[op](g, u)
    # the products' own error (1e-5 of their magnitude), carried through act(a) * b
    bound = 1e-5 * (sg * np.abs(u) * 1.2 + su * np.abs(GLU_OPS[op](g, np.ones_like(u))))
    got = be.asnumpy(dst).astype(np.float64)
    assert np.all(np.abs(got - want) <= bound + 1e-6 * np.abs(want) + 1e-30), type_name


def _rope_oracle(x: np.ndarray, pos: np.ndarray, mode: int, base: float, ff: np.ndarray | None):
    """x [ncols, heads, d] rotated over whole heads in float64 (ggml's NORMAL or NEOX pairs)."""
    d = x.shape[-1]
    k = np.arange(d // 2)
    theta = pos[:, None].astype(np.float64) * base ** (-2.0 * k / d)
    if ff is not None:
        theta = theta / ff.astype(np.float64)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    if mode == 0:
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[..., : d // 2], x[..., d // 2 :]
        out[..., : d // 2], out[..., d // 2 :] = a * c - b * s, a * s + b * c
    return out


@pytest.mark.parametrize("freq_factors", [False, True])
@pytest.mark.parametrize("k", ROW_LENGTHS)
@pytest.mark.parametrize(("type_name", "mode"), [("Q8_0", 0), ("Q4_K", 2), ("F16", 0), ("F32", 2)])
def test_qkv_products_with_rope(be, type_name, mode, k, freq_factors):
    head_dim, heads, kv_heads, ncols = 64, 4, 2, 2
    rows = (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    rng = np.random.default_rng(k + mode)
    y = rng.standard_normal((ncols, k)).astype(np.float32)
    pos = np.array([3, 700], np.int32)
    ff = rng.uniform(1.0, 8.0, head_dim // 2).astype(np.float32) if freq_factors else None
    raws = [random_rows(type_name, m, k, seed=i + 3 * k) for i, m in enumerate(rows)]
    dsts = [be.full((ncols, m), np.nan, np.float32) for m in rows]
    scratch = be.zeros(launch.q8_1_bytes(k, ncols), np.uint8)
    ff_dev = None if ff is None else be.asarray(ff)
    rope = launch_fused.RopeArgs(be.asarray(pos), head_dim, mode, 10000.0, freq_factors=ff_dev)
    weights = [be.asarray(r) for r in raws]
    launch_fused.matvec_qkv_rope(
        be, type_name, weights, be.asarray(y), dsts, k, rows, ncols, rope, scratch
    )
    yq = _activations(y, type_name)
    for i, (raw, dst) in enumerate(zip(raws, dsts, strict=True)):
        w = _gguf_dequant(type_name, raw, k).astype(np.float64)
        prod, scale = yq @ w.T, np.abs(yq) @ np.abs(w).T
        got = be.asnumpy(dst).astype(np.float64)
        if i < 2:  # Q and K rotated: a pair's error is at most its two products' errors
            shape = (ncols, rows[i] // head_dim, head_dim)
            want = _rope_oracle(prod.reshape(shape), pos, mode, 10000.0, ff).reshape(ncols, -1)
            scale3 = scale.reshape(shape)
            if mode == 0:  # each value's rotation partner: 2p <-> 2p+1, or p <-> p + d/2
                partner = scale3.reshape(*shape[:2], -1, 2)[..., ::-1].reshape(shape)
            else:
                partner = np.roll(scale3, head_dim // 2, axis=-1)
            bound = 1e-5 * (scale3 + partner).reshape(ncols, -1) + 2e-6 * np.abs(prod).max()
        else:
            want, bound = prod, 1e-5 * scale
        assert np.all(np.abs(got - want) <= bound + 1e-30), (type_name, i)


def test_qkv_refuses_partial_heads(be):
    rope = launch_fused.RopeArgs(be.zeros(1, np.int32), 64, 0, 10000.0)
    w = be.zeros(64 * 34, np.uint8)
    with pytest.raises(ValueError, match="whole heads"):
        launch_fused.matvec_qkv_rope(
            be, "Q8_0", [w, w, w], be.zeros((1, 64), np.float32), [w, w, w], 64,
            [96, 64, 64], 1, rope,
        )  # fmt: skip


def test_qkv_products_store_k_and_v_into_cache_rows(be):
    """K rotated into f16 cache rows (one row a token, i64 ids, one out of range: dropped) and
    V into a transposed f32 cache (rows of one element, i32 ids), as the SET_ROWS after them."""
    head_dim, k, ncols = 64, 256, 2
    rows = (2 * head_dim, head_dim, head_dim)
    rng = np.random.default_rng(40)
    y = rng.standard_normal((ncols, k)).astype(np.float32)
    pos = np.array([5, 9], np.int32)
    raws = [random_rows("Q8_0", m, k, seed=40 + i) for i, m in enumerate(rows)]
    dsts = [be.full((ncols, m), np.nan, np.float32) for m in rows]
    k_cache = be.zeros((8, head_dim), np.float16)
    k_ids = np.array([3, 8], np.int64)  # 8: past the cache's rows
    v_cache = be.full(8 * head_dim, -1.0, np.float32)
    v_ids = rng.permutation(8 * head_dim)[: ncols * head_dim].astype(np.int32)
    stores = (
        launch_fused.RowStore(k_cache.view(np.uint8), be.asarray(k_ids), "F16", head_dim, 128, 8),
        launch_fused.RowStore(v_cache.view(np.uint8), be.asarray(v_ids), "F32", 1, 4, 8 * head_dim),
    )
    rope = launch_fused.RopeArgs(be.asarray(pos), head_dim, 0, 10000.0)
    scratch = be.zeros(launch.q8_1_bytes(k, ncols), np.uint8)
    weights = [be.asarray(r) for r in raws]
    launch_fused.matvec_qkv_rope(
        be, "Q8_0", weights, be.asarray(y), dsts, k, rows, ncols, rope, scratch, stores=stores
    )
    yq = _activations(y, "Q8_0")
    w = [_gguf_dequant("Q8_0", r, k).astype(np.float64) for r in raws]
    k_want = _rope_oracle((yq @ w[1].T).reshape(ncols, 1, head_dim), pos, 0, 10000.0, None)
    k_got = be.asnumpy(k_cache).astype(np.float64)
    k_scale = 4e-5 * (np.abs(yq) @ np.abs(w[1]).T).max() + 1e-3 * np.abs(k_want).max()
    assert np.all(np.abs(k_got[3] - k_want[0, 0]) <= k_scale)  # f16 rounding bounds
    np.testing.assert_array_equal(np.delete(k_got, 3, axis=0), 0.0)  # nothing else written
    v_want = (yq @ w[2].T).reshape(-1)
    v_got = be.asnumpy(v_cache).astype(np.float64)
    assert np.all(np.abs(v_got[v_ids] - v_want) <= 1e-5 * (np.abs(yq) @ np.abs(w[2]).T).reshape(-1))
    np.testing.assert_array_equal(np.delete(v_got, v_ids), -1.0)
    assert np.isnan(be.asnumpy(dsts[1])).all() and np.isnan(be.asnumpy(dsts[2])).all()


@pytest.mark.parametrize("kv_type", ["F16", "Q8_0"])  # one warp in order; warps merged
def test_flash_attention_quantizes_its_output(be, kv_type):
    """The q8_1 blocks the attention kernel writes for the projection after it are ggml's
    quantization of the output it writes, byte for byte."""
    from gguf.quants import quantize
    from rpcnet.compute.cuda import launch_attention
    from test_cuda_emulated import _gguf_type

    rng = np.random.default_rng(50)
    heads, kv_heads, n_q, d, n_kv = 4, 2, 2, 64, 40
    q = rng.standard_normal((heads, n_q, d)).astype(np.float32)
    k_raw, v_raw = (
        quantize(rng.standard_normal((kv_heads, n_kv, d)).astype(np.float32), _gguf_type(kv_type))
        for _ in range(2)
    )
    out = be.zeros((n_q, heads, d), np.float32)
    q8 = be.zeros(launch.q8_1_bytes(heads * d, n_q), np.uint8)
    launch_attention.flash_attn_decode(
        be, be.asarray(q), be.asarray(np.ascontiguousarray(k_raw)),
        be.asarray(np.ascontiguousarray(v_raw)), None, out, kv_type, 0.125, q8=q8,
    )  # fmt: skip
    got = be.asnumpy(out)
    assert np.isfinite(got).all() and np.abs(got).max() > 0
    np.testing.assert_array_equal(be.asnumpy(q8), q8_1_oracle(got.reshape(-1)))


@pytest.mark.parametrize("k", ROW_LENGTHS)
@pytest.mark.parametrize("block", [32, 256])
def test_glu_quantizes_its_output_as_groups_complete(be, block, k):
    """The GLU launch's q8_1 (or q8_K) blocks of what it writes are ggml's quantization of it,
    each group made by the block that completes it; the counters are back at zero after each
    launch, so a second launch does the same."""
    m, ncols = 512, 2
    rng = np.random.default_rng(block + k)
    y = (0.1 * rng.standard_normal((ncols, k))).astype(np.float32)  # q8_1 sums fit an f16
    gate_raw, up_raw = (random_rows("Q8_0", m, k, seed=s + k) for s in (60, 61))
    dst = be.full((ncols, m), np.nan, np.float32)
    scratch = be.zeros(launch.q8_1_bytes(k, ncols), np.uint8)
    blocks = be.zeros(launch.q8_1_bytes(m, ncols), np.uint8)
    counters = be.zeros(ncols * m // 32, np.uint32)
    for _ in range(2):
        launch_fused.matvec_glu(
            be, "Q8_0", be.asarray(gate_raw), be.asarray(up_raw), be.asarray(y), dst,
            k, m, ncols, 2, 1.702, 7.0, scratch, q8=(blocks, block, counters),
        )  # fmt: skip
        out = be.asnumpy(dst)
        got = be.asnumpy(blocks)
        if block == 32:
            np.testing.assert_array_equal(got, q8_1_oracle(out.reshape(-1)))
        else:
            b = got.reshape(-1, 36)
            values = b[:, :4].copy().view(np.float32).astype(np.float64) * b[:, 4:].view(np.int8)
            want = np.concatenate([_mmvq_activations(out[c], "Q4_K") for c in range(ncols)])
            np.testing.assert_array_equal(values.reshape(-1), want)
        np.testing.assert_array_equal(be.asnumpy(counters), 0)
        blocks[...] = 0


def test_glu_refuses_rows_that_do_not_fill_blocks(be):
    w = be.zeros(96 * 34, np.uint8)
    y = be.zeros((1, 32), np.float32)
    with pytest.raises(ValueError, match="blocks of 256"):
        launch_fused.matvec_glu(be, "Q8_0", w, w, y, y, 32, 96, 1, 2, 1.702, 7.0, w, q8=(w, 256, w))


def _attention_oracle(q, k, v, mask, scale, sinks, round_to):
    """ggml's unfused attention in float64 from the operands as the CPU's products see them:
    Q (and the softmax weights) rounded to the K (V) type first. q [H, n_q, D], k [H_kv,
    n_kv, D], v [H_kv, Dv, n_kv] (the transposed cache), mask [n_q, n_kv] -> [n_q, H, Dv]."""
    heads, kv_heads = q.shape[0], k.shape[0]
    kk = np.repeat(k.astype(np.float64), heads // kv_heads, axis=0)
    vv = np.repeat(v.astype(np.float64), heads // kv_heads, axis=0)
    s = np.einsum("hqd,hjd->hqj", round_to(q).astype(np.float64), kk) * scale + mask
    mx = s.max(axis=-1, keepdims=True)
    if sinks is not None:
        mx = np.maximum(mx, sinks[:, None, None])
    e = np.exp(s - mx)
    total = e.sum(axis=-1, keepdims=True)
    if sinks is not None:
        total = total + np.exp(sinks[:, None, None] - mx)
    p = round_to((e / total).astype(np.float32)).astype(np.float64)
    return np.einsum("hqj,hij->qhi", p, vv)


@pytest.mark.parametrize("kv_type", ["F16", "F32"])
@pytest.mark.parametrize("sinks", [False, True])
def test_unfused_attention_in_one_launch(be, kv_type, sinks):
    from rpcnet.compute.cuda import launch_attention

    rng = np.random.default_rng(70)
    heads, kv_heads, n_q, d, n_kv = 4, 2, 2, 64, 77
    dtype = np.float16 if kv_type == "F16" else np.float32
    q = rng.standard_normal((heads, n_q, d)).astype(np.float32)
    k = rng.standard_normal((kv_heads, n_kv, d)).astype(dtype)
    v = rng.standard_normal((kv_heads, d, n_kv)).astype(dtype)
    mask = np.where(rng.random((n_q, n_kv)) < 0.2, -np.inf, 0).astype(np.float16)
    sink = rng.standard_normal(heads).astype(np.float32) if sinks else None
    dst = be.full((n_q, heads, d), np.nan, np.float32)
    q8 = be.zeros(launch.q8_1_bytes(heads * d, n_q), np.uint8)
    el = np.dtype(dtype).itemsize
    ptrs = (
        be.asarray(q.transpose(1, 0, 2).copy()),  # [n_q, H, D]: columns d*H apart, heads d
        be.asarray(k).view(np.uint8),
        be.asarray(v).view(np.uint8),
        be.asarray(mask),
        None if sink is None else be.asarray(sink),
        dst,
        q8,
    )
    dims = (d, d, n_q, n_kv, heads, kv_heads)
    strides = (heads * d, d, d * el, n_kv * d * el, n_kv * el, d * n_kv * el, n_kv)
    launch_attention.attn_decode(be, (kv_type, kv_type), ptrs, dims, strides, 0.125)
    rounded = (lambda a: a.astype(np.float16).astype(np.float32)) if kv_type == "F16" else None
    want = _attention_oracle(
        q, k, v, mask.astype(np.float64), 0.125, sink, rounded or (lambda a: a)
    )
    got = be.asnumpy(dst)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(be.asnumpy(q8), q8_1_oracle(got.reshape(-1)))


def test_unfused_attention_refuses_more_positions_than_it_holds(be):
    from rpcnet.compute.cuda import launch_attention

    x = be.zeros(8, np.float32)
    with pytest.raises(ValueError, match="n_kv <= 4096"):
        launch_attention.attn_decode(
            be, ("F16", "F16"), (x, x, x, None, None, x, None), (64, 64, 1, 4097, 1, 1),
            (0, 0, 0, 0, 0, 0, 0), 1.0,
        )  # fmt: skip


@pytest.mark.parametrize("k", ROW_LENGTHS)
def test_qkv_with_v_of_another_k_quant(be, k):
    """Q4_K_M's mix: Q and K in Q4_K, V in Q6_K, one launch."""
    head_dim, ncols = 64, 1
    rows = (2 * head_dim, head_dim, head_dim)
    types = ("Q4_K", "Q4_K", "Q6_K")
    y = np.random.default_rng(k).standard_normal((ncols, k)).astype(np.float32)
    pos = np.array([11], np.int32)
    raws = [
        random_rows(t, m, k, seed=80 + i) for i, (t, m) in enumerate(zip(types, rows, strict=True))
    ]
    dsts = [be.full((ncols, m), np.nan, np.float32) for m in rows]
    scratch = be.zeros(launch.q8_1_bytes(k, ncols), np.uint8)
    rope = launch_fused.RopeArgs(be.asarray(pos), head_dim, 0, 10000.0)
    launch_fused.matvec_qkv_rope(
        be, "Q4_K", [be.asarray(r) for r in raws], be.asarray(y), dsts, k, rows, ncols, rope,
        scratch, v_type="Q6_K",
    )  # fmt: skip
    yq = _activations(y, "Q4_K")
    w = [_gguf_dequant(t, r, k).astype(np.float64) for t, r in zip(types, raws, strict=True)]
    v_want, v_scale = yq @ w[2].T, np.abs(yq) @ np.abs(w[2]).T
    assert np.all(np.abs(be.asnumpy(dsts[2]) - v_want) <= 1e-5 * v_scale)
    q_want = _rope_oracle((yq @ w[0].T).reshape(ncols, 2, head_dim), pos, 0, 10000.0, None)
    q_scale = (np.abs(yq) @ np.abs(w[0]).T).max()
    assert np.all(np.abs(be.asnumpy(dsts[0]) - q_want.reshape(ncols, -1)) <= 2e-5 * q_scale)
    with pytest.raises(ValueError, match="no Q/K/V launch"):
        launch_fused.matvec_qkv_rope(
            be, "Q8_0", dsts, be.asarray(y), dsts, k, rows, ncols, rope, v_type="Q6_K"
        )
