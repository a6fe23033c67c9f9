"""Differential tests of ROPE, SOFT_MAX, FLASH_ATTN_EXT and MUL_MAT_ID against the REAL
reference rpc-server (same single-op graph, same input bytes, outputs compared numerically).

Tolerances: ~1e-5 relative for rope/softmax in f32; flash attention with f16 V is looser because
ggml accumulates V·softmax in f16 there while rpcnet accumulates in f32.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rpcnet.compute import quant as Q
from rpcnet.ggml_types import GgmlType as T
from support.fa_graph import fa_dims, flash_attn_node
from support.hyp import examples
from support.opgraph import OpGraph, as_f32, contiguous_nb, pack_params
from support.raw_blocks import F16_FIELDS, random_blocks

MUL_MAT_ID, SOFT_MAX, ROPE = 30, 46, 48
F32, F16, I32, BF16 = 0, 1, 26, 30
NORMAL, NEOX, MROPE, VISION, IMROPE = 0, 2, 8, 24, 40

HYP = settings(
    max_examples=examples(40),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def run_both(g: OpGraph, outs, ref: int, ours: int):
    return g.run(ref, outs), g.run(ours, outs)


def close(ours: np.ndarray, ref: np.ndarray, rtol: float, atol_rel: float) -> None:
    """allclose with an absolute floor relative to the reference's magnitude."""
    scale = float(np.nanmax(np.abs(ref))) if np.isfinite(ref).any() else 1.0
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol_rel * max(scale, 1e-30))


def encode(type_id: int, values: np.ndarray) -> bytes:
    values = np.ascontiguousarray(values, dtype=np.float32)
    if type_id == F32:
        return values.tobytes()
    return Q.quantize(type_id, values.reshape(-1, values.shape[-1])).tobytes()


# --- ROPE ------------------------------------------------------------------------------------


def rope_params(
    n_dims,
    mode,
    n_ctx_orig=4096,
    freq_base=10000.0,
    freq_scale=1.0,
    ext_factor=0.0,
    attn_factor=1.0,
    beta_fast=32.0,
    beta_slow=1.0,
    sections=(0, 0, 0, 0),
    n_offs=0,
):
    return pack_params(
        0,
        n_dims,
        mode,
        0,
        n_ctx_orig,
        float(freq_base),
        float(freq_scale),
        float(ext_factor),
        float(attn_factor),
        float(beta_fast),
        float(beta_slow),
        *[int(s) for s in sections],
        n_offs,
    )


def run_rope(
    ref, ours, x_type, ne, params, positions, freq_factors=None, row_pad=0, seed=0, inplace=False
):
    rng = np.random.default_rng(seed)
    g = OpGraph()
    wide = (ne[0] + row_pad, ne[1], ne[2], ne[3])
    vals = rng.standard_normal(int(np.prod(wide))).astype(np.float32) * 2
    dtype = np.float32 if x_type == F32 else np.float16
    base = g.input(x_type, wide, vals.astype(dtype))
    x = base
    if row_pad:  # rows are a prefix of wider rows: a strided view (e.g. Q inside fused QKV)
        x = g.view(base, ne, contiguous_nb(x_type, wide))
    pos = g.input(I32, (len(positions), 1, 1, 1), np.asarray(positions, np.int32))
    srcs = (
        (x, pos)
        if freq_factors is None
        else (
            x,
            pos,
            g.input(F32, (len(freq_factors), 1, 1, 1), np.asarray(freq_factors, np.float32)),
        )
    )
    out = g.op(ROPE, x_type, ne, srcs, params=params, inplace_of=x if inplace else None)
    (r,), (o,) = run_both(g, [out], ref, ours)
    if x_type == F32:
        ref_v, our_v = as_f32(r, ne), as_f32(o, ne)
        close(our_v, ref_v, rtol=1e-5, atol_rel=2e-6)
    else:
        ref_v = np.frombuffer(r, np.float16).astype(np.float32)
        our_v = np.frombuffer(o, np.float16).astype(np.float32)
        close(our_v, ref_v, rtol=1e-3, atol_rel=1e-3)


@pytest.mark.parametrize(
    "mode,n_dims,ne0,extra",
    [
        (NORMAL, 64, 64, {}),
        (NEOX, 64, 64, {}),
        (NORMAL, 32, 64, {}),  # partial rotation, the rest copied through
        (NEOX, 32, 64, {"n_offs": 16}),  # leading dims left unrotated
        (NEOX, 64, 64, {"freq_scale": 0.25, "ext_factor": 1.0, "attn_factor": 1.0}),  # YaRN
        (
            NORMAL,
            64,
            64,
            {
                "freq_scale": 0.5,
                "ext_factor": 0.5,
                "beta_fast": 16.0,
                "n_ctx_orig": 2048,
                "freq_base": 500000.0,
            },
        ),
        (NEOX, 64, 96, {"freq_base": 1000000.0, "attn_factor": 0.8}),
    ],
)
def test_rope_modes(reference_v8, rpcnet_v8, mode, n_dims, ne0, extra):
    ne = (ne0, 4, 6, 1)
    positions = [0, 1, 7, 300, 4095, 65000]
    run_rope(reference_v8, rpcnet_v8, F32, ne, rope_params(n_dims, mode, **extra), positions)


@pytest.mark.parametrize("mode", [NORMAL, NEOX])
def test_rope_freq_factors_f16_and_strided(reference_v8, rpcnet_v8, mode):
    rng = np.random.default_rng(mode)
    ne = (64, 3, 5, 1)
    positions = rng.integers(0, 30000, 5)
    ff = rng.uniform(1.0, 8.0, 32)
    params = rope_params(64, mode, freq_base=500000.0)
    run_rope(reference_v8, rpcnet_v8, F32, ne, params, positions, freq_factors=ff, row_pad=32)
    run_rope(reference_v8, rpcnet_v8, F16, ne, params, positions, freq_factors=ff)
    run_rope(reference_v8, rpcnet_v8, F32, ne, params, positions, inplace=True)


@pytest.mark.parametrize(
    "mode,n_dims,ne0,sections",
    [
        (MROPE, 64, 64, (8, 12, 12, 0)),  # qwen2-vl style
        (MROPE, 32, 64, (6, 5, 4, 1)),
        (IMROPE, 64, 64, (12, 10, 10, 0)),  # qwen3-vl interleaved
        (VISION, 32, 64, (16, 16, 0, 0)),  # vision encoder: n_dims = ne0 / 2
    ],
)
def test_rope_multi(reference_v8, rpcnet_v8, mode, n_dims, ne0, sections):
    rng = np.random.default_rng(n_dims + mode)
    n_tok = 5
    ne = (ne0, 3, n_tok, 1)
    positions = rng.integers(0, 2000, 4 * n_tok)
    params = rope_params(n_dims, mode, sections=sections, freq_base=1000000.0)
    run_rope(reference_v8, rpcnet_v8, F32, ne, params, positions)
    yarn = rope_params(n_dims, mode, sections=sections, freq_scale=0.5, ext_factor=1.0)
    run_rope(
        reference_v8, rpcnet_v8, F32, ne, yarn, positions, freq_factors=rng.uniform(1, 3, n_dims)
    )


@HYP
@given(
    mode=st.sampled_from([NORMAL, NEOX]),
    half_dims=st.integers(1, 24),
    extra=st.integers(0, 8),
    heads=st.integers(1, 4),
    n_tok=st.integers(1, 6),
    freq_base=st.sampled_from([10000.0, 500000.0, 1e6]),
    yarn=st.booleans(),
    freq_scale=st.sampled_from([1.0, 0.5, 0.125]),
    seed=st.integers(0, 2**16),
)
def test_rope_property(
    reference_v8, rpcnet_v8, mode, half_dims, extra, heads, n_tok, freq_base, yarn, freq_scale, seed
):
    rng = np.random.default_rng(seed)
    n_dims = 2 * half_dims
    ne = (n_dims + 2 * extra, heads, n_tok, 1)
    positions = rng.integers(0, 100000, n_tok)
    params = rope_params(
        n_dims,
        mode,
        freq_base=freq_base,
        freq_scale=freq_scale,
        ext_factor=1.0 if yarn else 0.0,
        n_ctx_orig=int(rng.integers(512, 8192)),
    )
    run_rope(reference_v8, rpcnet_v8, F32, ne, params, positions, seed=seed)


# --- SOFT_MAX --------------------------------------------------------------------------------


def run_softmax(
    ref, ours, ne, scale=1.0, max_bias=0.0, mask=None, mask_ne=None, sinks=False, seed=0
):
    rng = np.random.default_rng(seed)
    g = OpGraph()
    a = g.input(F32, ne, rng.standard_normal(int(np.prod(ne))).astype(np.float32) * 3)
    srcs = [a]
    if mask is not None:
        mvals = rng.standard_normal(int(np.prod(mask_ne))).astype(np.float32)
        mvals[rng.random(mvals.size) < 0.3] = -np.inf
        mvals = mvals.reshape(mask_ne[::-1])
        mvals[..., 0] = 0.0  # keep at least one finite entry per row
        srcs.append(g.input(mask, mask_ne, mvals.astype(np.float16 if mask == F16 else np.float32)))
    if sinks:
        if mask is None:
            srcs.append(None)
        srcs.append(g.input(F32, (ne[2], 1, 1, 1), rng.standard_normal(ne[2]).astype(np.float32)))
    out = g.op(
        SOFT_MAX,
        F32,
        ne,
        [s if s is not None else 0 for s in srcs],
        params=pack_params(float(scale), float(max_bias)),
    )
    (r,), (o,) = run_both(g, [out], ref, ours)
    # v_expf lanes, libm expf on the row tails (ne0 % 8) and the sum order are replayed
    close(as_f32(o, ne), as_f32(r, ne), rtol=0.0, atol_rel=0.0)


def test_softmax_plain(reference_v8, rpcnet_v8):
    run_softmax(reference_v8, rpcnet_v8, (37, 5, 3, 2), scale=0.125)


@pytest.mark.parametrize("mask_type", [F16, F32])
def test_softmax_mask_alibi_sinks(reference_v8, rpcnet_v8, mask_type):
    # mask padded in ne1 and broadcast over heads; ALiBi with a non-power-of-two head count
    run_softmax(
        reference_v8,
        rpcnet_v8,
        (20, 6, 6, 1),
        scale=0.3,
        max_bias=8.0,
        mask=mask_type,
        mask_ne=(20, 8, 1, 1),
        sinks=True,
        seed=1,
    )
    run_softmax(
        reference_v8,
        rpcnet_v8,
        (16, 4, 4, 2),
        scale=1.0,
        mask=mask_type,
        mask_ne=(16, 4, 2, 2),
        seed=2,
    )


@HYP
@given(
    ne0=st.integers(1, 70),
    ne1=st.integers(1, 5),
    heads=st.integers(1, 6),
    mask=st.sampled_from([None, F16, F32]),
    bcast=st.booleans(),
    max_bias=st.sampled_from([0.0, 0.0, 8.0]),
    sinks=st.booleans(),
    scale=st.floats(0.05, 2.0),
    seed=st.integers(0, 2**16),
)
def test_softmax_property(
    reference_v8, rpcnet_v8, ne0, ne1, heads, mask, bcast, max_bias, sinks, scale, seed
):
    mask_ne = (ne0, ne1 + (seed % 3), 1 if bcast else heads, 1)
    run_softmax(
        reference_v8,
        rpcnet_v8,
        (ne0, ne1, heads, 1),
        scale=scale,
        max_bias=max_bias if mask is not None else 0.0,
        mask=mask,
        mask_ne=mask_ne,
        sinks=sinks,
        seed=seed,
    )


# --- FLASH_ATTN_EXT --------------------------------------------------------------------------


def run_fattn(
    ref,
    ours,
    *,
    kv_type=F16,
    v_type=None,
    mask=True,
    sinks=False,
    scale=None,
    max_bias=0.0,
    softcap=0.0,
    kv_size=None,
    seed=0,
    tol=None,
    **dims,
):
    """q [dk, n_q, n_head, n3]; K/V are permuted views of a [dk * n_head_kv, kv_size, n3] cache;
    the mask is [n_kv, n_q, mask_heads, n3]. `dims`: FA_DIMS' sizes (3 query rows unless given)."""
    dk, dv, n_q, n_kv, n_head, n_head_kv, n3, mask_heads = fa_dims(**{"n_q": 3, **dims})
    rng = np.random.default_rng(seed)
    v_type = kv_type if v_type is None else v_type
    kv_size = kv_size or n_kv + 5
    g = OpGraph()
    q_vals = rng.standard_normal(dk * n_q * n_head * n3).astype(np.float32)
    q = g.input(F32, (dk, n_q, n_head, n3), q_vals)

    def cache_view(type_id, d):
        vals = rng.standard_normal((n3 * kv_size, n_head_kv * d)).astype(np.float32)
        if type_id == F16:
            raw = vals.astype(np.float16).tobytes()
        else:
            raw = encode(type_id, vals)
        cache = g.input(type_id, (d * n_head_kv, kv_size, n3, 1), raw)
        row = Q.row_bytes(type_id, d * n_head_kv)
        head = Q.row_bytes(type_id, d)
        nb = (Q.type_size(type_id), row, head, row * kv_size)
        return g.view(cache, (d, n_kv, n_head_kv, n3), nb)

    k = cache_view(kv_type, dk)
    v = cache_view(v_type, dv)
    mask_node = sinks_node = None
    if mask:
        m = np.zeros((n3, mask_heads, n_q, n_kv), np.float32)
        for i in range(n_q):  # causal over the last n_q positions, plus a few random holes
            m[..., i, n_kv - n_q + i + 1 :] = -np.inf
        m[rng.random(m.shape) < 0.1] = -np.inf
        mask_node = g.input(F16, (n_kv, n_q, mask_heads, n3), m.astype(np.float16))
    if sinks:
        sinks_node = g.input(F32, (n_head, 1, 1, 1), rng.standard_normal(n_head).astype(np.float32))
    scale = 1.0 / np.sqrt(dk) if scale is None else scale
    out_ne = (dv, n_head, n_q, n3)
    out = flash_attn_node(g, [q, k, v], mask_node, sinks_node, out_ne, scale, max_bias, softcap)
    (r,), (o,) = run_both(g, [out], ref, ours)
    ref_v, our_v = as_f32(r, out_ne), as_f32(o, out_ne)
    plain = kv_type == v_type and kv_type in (F32, F16)
    tiled_or_split = plain and (n_q >= 64 or (n_q == 1 and n3 == 1 and n_kv >= 512))
    if tol is None and kv_type in (F32, F16, T.Q8_0) and not tiled_or_split:
        # rpcnet replays ggml's one-chunk online softmax (lane-exact f16/f32/q8_0 K·Q dot, f16
        # VKQ buffer for f16 V): bit-exact in all but rare rows (an ulp)
        tol = 1e-6
    if tol is None:
        # ggml accumulates softmax·V in f16 when V is f16; q4_1/q5_1 K dot products round the
        # q8_1 block sum of Q to f16. Elsewhere both sides compute in f32.
        tol = 3e-3 if v_type == F16 else 1e-3 if kv_type in (T.Q4_1, T.Q5_1) else 2e-5
    close(our_v, ref_v, rtol=tol, atol_rel=tol)


@pytest.mark.parametrize(
    "kv_type,v_type",
    [
        (F32, F32),
        (F16, F16),
        (BF16, BF16),
        (T.Q8_0, T.Q8_0),
        (T.Q4_0, T.Q4_0),
        (T.Q4_1, T.Q5_0),
        (T.IQ4_NL, T.IQ4_NL),
        (F16, T.Q8_0),
        (T.Q5_1, F16),
    ],
)
def test_fattn_kv_types(reference_v8, rpcnet_v8, kv_type, v_type):
    run_fattn(reference_v8, rpcnet_v8, kv_type=kv_type, v_type=v_type, seed=kv_type)


def test_fattn_gqa_sinks_softcap_alibi(reference_v8, rpcnet_v8):
    run_fattn(reference_v8, rpcnet_v8, n_head=8, n_head_kv=2, sinks=True, seed=1)
    run_fattn(reference_v8, rpcnet_v8, n_head=4, n_head_kv=1, softcap=30.0, scale=0.5, seed=2)
    run_fattn(reference_v8, rpcnet_v8, n_head=6, n_head_kv=6, max_bias=8.0, seed=3)
    run_fattn(
        reference_v8, rpcnet_v8, n_head=2, n_head_kv=1, mask=False, sinks=True, kv_type=F32, seed=4
    )
    run_fattn(reference_v8, rpcnet_v8, dk=64, dv=32, n_head=4, n_head_kv=4, seed=5)


def test_fattn_batched_streams_and_per_head_mask(reference_v8, rpcnet_v8):
    # q.ne3 > 1 (independent sequences), per-head mask slices broadcast over a head divisor
    run_fattn(reference_v8, rpcnet_v8, n3=2, n_head=4, n_head_kv=2, mask_heads=2, seed=9)
    run_fattn(
        reference_v8,
        rpcnet_v8,
        n3=3,
        n_head=2,
        n_head_kv=1,
        mask_heads=1,
        kv_type=T.Q8_0,
        sinks=True,
        seed=10,
    )


def test_fattn_tiled_and_split_paths(reference_v8, rpcnet_v8):
    # >= 64 query rows with f16 or f32 K/V: ggml's f32 tiled path (Q stays f32), native: exact
    run_fattn(reference_v8, rpcnet_v8, n_q=70, n_kv=96, n_head=2, n_head_kv=1, seed=6, tol=0)
    f32_kv = dict(n_q=64, n_kv=130, n_head=4, n_head_kv=2, kv_type=F32, v_type=F32)
    run_fattn(reference_v8, rpcnet_v8, **f32_kv, seed=12, tol=0)
    # single query row over >= 512 kv: ggml's split-KV path (f16 accumulation over long rows)
    run_fattn(reference_v8, rpcnet_v8, n_q=1, n_kv=600, n_head=4, n_head_kv=2, seed=7, tol=1e-2)
    run_fattn(reference_v8, rpcnet_v8, n_q=1, n_kv=600, kv_type=F32, seed=8)


@HYP
@given(
    dk=st.sampled_from([32, 64]),
    n_q=st.integers(1, 9),
    n_kv_extra=st.integers(0, 40),
    gqa=st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3)]),
    kv_type=st.sampled_from([F32, F16, T.Q8_0]),
    mask=st.booleans(),
    sinks=st.booleans(),
    softcap=st.sampled_from([0.0, 0.0, 20.0]),
    seed=st.integers(0, 2**16),
)
def test_fattn_property(
    reference_v8, rpcnet_v8, dk, n_q, n_kv_extra, gqa, kv_type, mask, sinks, softcap, seed
):
    run_fattn(
        reference_v8,
        rpcnet_v8,
        dk=dk,
        dv=dk,
        n_q=n_q,
        n_kv=n_q + n_kv_extra,
        n_head=gqa[0],
        n_head_kv=gqa[1],
        kv_type=kv_type,
        mask=mask,
        sinks=sinks,
        softcap=softcap,
        seed=seed,
    )


# --- MUL_MAT_ID ------------------------------------------------------------------------------


def run_mmid(
    ref, ours, *, w_type=F32, k=64, m=24, n_exp=8, n_used=2, n_tok=5, b_ne1=1, seed=0, tol=None
):
    rng = np.random.default_rng(seed)
    g = OpGraph()
    w_vals = rng.standard_normal((n_exp * m, k)).astype(np.float32)
    if w_type in F16_FIELDS:
        raw = random_blocks(w_type, n_exp * m, k, rng)
    elif w_type == F16:
        raw = w_vals.astype(np.float16).tobytes()
    else:
        raw = encode(w_type, w_vals)
    w = g.input(w_type, (k, m, n_exp, 1), raw)
    b = g.input(
        F32, (k, b_ne1, n_tok, 1), rng.standard_normal(k * b_ne1 * n_tok).astype(np.float32)
    )
    ids = np.stack([rng.permutation(n_exp)[:n_used] for _ in range(n_tok)]).astype(np.int32)
    idx = g.input(I32, (n_used, n_tok, 1, 1), ids)
    out_ne = (m, n_used, n_tok, 1)
    out = g.op(MUL_MAT_ID, F32, out_ne, (w, b, idx))
    (r,), (o,) = run_both(g, [out], ref, ours)
    if tol is None:
        # q4_1/q5_1 dot products add m·s with s = f16(d·Σq) of the q8_1 activation block
        tol = 2e-3 if w_type in (T.Q4_1, T.Q5_1) else 1e-5
    close(as_f32(o, out_ne), as_f32(r, out_ne), rtol=tol, atol_rel=tol)


@pytest.mark.parametrize("w_type", [F32, F16, BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K])
@pytest.mark.parametrize("b_ne1", [1, 2])
def test_mul_mat_id(reference_v8, rpcnet_v8, w_type, b_ne1):
    k = 256 if w_type in F16_FIELDS else 64
    run_mmid(reference_v8, rpcnet_v8, w_type=w_type, b_ne1=b_ne1, k=k, seed=w_type + 10 * b_ne1)


@HYP
@given(
    n_exp=st.integers(1, 10),
    n_used_frac=st.floats(0.1, 1.0),
    n_tok=st.integers(1, 12),
    bcast=st.booleans(),
    w_type=st.sampled_from([F32, F16, T.Q8_0]),
    seed=st.integers(0, 2**16),
)
def test_mul_mat_id_property(
    reference_v8, rpcnet_v8, n_exp, n_used_frac, n_tok, bcast, w_type, seed
):
    n_used = max(1, int(n_exp * n_used_frac))
    run_mmid(
        reference_v8,
        rpcnet_v8,
        w_type=w_type,
        n_exp=n_exp,
        n_used=n_used,
        n_tok=n_tok,
        b_ne1=1 if bcast else n_used,
        k=32,
        m=8,
        seed=seed,
    )
