"""The native (Rust) non-matmul kernels against ggml's definitions and the reference server.

Two kinds of checks, each on the SIMD and on the portable path (`_native.native_ops_portable`):

* an independent NumPy oracle written here from ggml's CPU code (ops.cpp, vec.h): the same
  roundings (f16 casts, the lane order of ggml's AVX2 f16 dot product, fused multiply-adds),
  with the C library's expf/tanhf/powf (what both ggml and Rust call), compared bit for bit;
* the REAL reference rpc-server running the same single-op graph (tests/support/opgraph.py),
  compared bit for bit where both sides use the same thread count.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.compute.kernels.kernel_table import select
from rpcnet.compute.tensor import Tensor
from support.fa_graph import fa_dims, flash_attn_node
from support.opgraph import OpGraph, as_f32, pack_params

F32, F16 = 0, 1
f32, f16, f64 = np.float32, np.float16, np.float64
ld = np.longdouble

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
for _name in ("expf", "tanhf", "powf", "sinf", "cosf"):
    getattr(_libm, _name).restype = ctypes.c_float
    getattr(_libm, _name).argtypes = [ctypes.c_float] * (2 if _name == "powf" else 1)
_libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]


def expf(x: float) -> f32:
    return f32(_libm.expf(float(x)))


def tanhf(x: f32) -> f32:
    """Correctly rounded tanhf (the reference's glibc 2.41 has CORE-MATH's), via double."""
    return f32(np.tanh(f64(x)))


@pytest.fixture(params=["simd", "portable"])
def isa(request):
    _native.native_ops_portable(request.param == "portable")
    yield request.param
    _native.native_ops_portable(False)


def arg(arr: np.ndarray, base: np.ndarray):
    """(buffer, offset, ne, nb) of a NumPy view `arr` (axes in ggml order reversed) of `base`."""
    offset = arr.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    shape = (1,) * (4 - arr.ndim) + arr.shape
    strides = (0,) * (4 - arr.ndim) + arr.strides
    return (base, offset, tuple(reversed(shape)), tuple(reversed(strides)))


# --- ggml's f16 vector primitives (vec.h / vec.cpp, AVX2 build) --------------------------------


def dot_f16(x: np.ndarray, y: np.ndarray) -> f32:
    """ggml_vec_dot_f16: 4 x 8 float32 lanes, fma per 32-element step, pairwise reduction, the
    tail in double."""
    n = len(x)
    n_main = n & ~31
    acc = np.zeros((4, 8), f32)
    xs, ys = x.astype(ld), y.astype(ld)
    for i in range(0, n_main, 32):
        acc = (xs[i : i + 32].reshape(4, 8) * ys[i : i + 32].reshape(4, 8) + acc).astype(f32)
    a = (acc[0] + acc[2]) + (acc[1] + acc[3])
    t = a[:4] + a[4:]
    total = f64((t[0] + t[1]) + (t[2] + t[3]))
    for i in range(n_main, n):
        total += f64(f32(x[i]) * f32(y[i]))
    return f32(total)


def mad_f16(y: np.ndarray, x: np.ndarray, v: f32) -> np.ndarray:
    return (x.astype(ld) * ld(v) + y.astype(ld)).astype(f32).astype(f16)


def scale_f16(y: np.ndarray, v: f32) -> np.ndarray:
    return (y.astype(f32) * f32(v)).astype(f16)


def fma(a: f32, b: f32, c: f32) -> f32:
    return f32(ld(a) * ld(b) + ld(c))


# --- FLASH_ATTN_EXT ---------------------------------------------------------------------------


def alibi_slope(h: int, n_head: int, max_bias: float) -> f32:
    if max_bias <= 0:
        return f32(1)
    n_log2 = 1 << int(np.floor(np.log2(n_head)))
    m0 = f32(_libm.powf(2.0, float(f32(-max_bias) / f32(n_log2))))
    m1 = f32(_libm.powf(2.0, float(f32(-max_bias / 2) / f32(n_log2))))
    if h < n_log2:
        return f32(_libm.powf(float(m0), float(h + 1)))
    return f32(_libm.powf(float(m1), float(2 * (h - n_log2) + 1)))


def fa_row_chunk(q16, k, v, mask_row, slope, scale, softcap, c0, c1):
    """One query row over kv positions c0..c1 (ops.cpp one_chunk, f16 V): (M, S, VKQ32)."""
    s_sum, m_max = f32(0), f32(-np.inf)
    acc = np.zeros(v.shape[1], f16)
    for ic in range(c0, c1):
        mv = slope * f32(mask_row[ic]) if mask_row is not None else f32(0)
        if mv == -np.inf:
            continue
        s = f32(dot_f16(k[ic], q16) * scale)
        if softcap != 0:
            s = f32(softcap * tanhf(s))
        s = f32(s + mv)
        ms = vs = f32(1)
        if s > m_max:
            m_old, m_max = m_max, s
            ms = expf(m_old - m_max)
            acc = scale_f16(acc, ms)
        else:
            vs = expf(s - m_max)
        acc = mad_f16(acc, v[ic], vs)
        s_sum = fma(s_sum, ms, vs)
    return m_max, s_sum, acc.astype(f32)


def add_sink(m_max, s_sum, acc, sink):
    ms = vs = f32(1)
    if sink > m_max:
        ms = expf(m_max - sink)
        m_max = sink
        acc = (acc * ms).astype(f32)
    else:
        vs = expf(sink - m_max)
    return m_max, fma(s_sum, ms, vs), acc


def fa_oracle(q, k, v, mask, sinks, scale, max_bias, softcap, threads):
    """q (n3, n_head, n_q, dk) f32; k/v (n3k, n_head_kv, n_kv, d) f16; mask (m3, mh, n_q, >=n_kv)
    f16; out (n3, n_q, n_head, dv) like ggml's permuted dst."""
    n3, n_head, n_q, _ = q.shape
    n_kv, dv = k.shape[2], v.shape[3]
    if softcap != 0:
        scale = f32(f32(scale) / f32(softcap))
    scale, softcap = f32(scale), f32(softcap)
    out = np.zeros((n3, n_q, n_head, dv), f32)
    split = threads > 1 and n_q == 1 and n3 == 1 and n_kv >= 512
    chunk = -(-n_kv // threads) if split else n_kv
    for i3 in range(n3):
        for h in range(n_head):
            kk = k[i3 // (n3 // k.shape[0]), h // (n_head // k.shape[1])]
            vv = v[i3 // (n3 // v.shape[0]), h // (n_head // v.shape[1])]
            slope = alibi_slope(h, n_head, max_bias)
            for i1 in range(n_q):
                q16 = q[i3, h, i1].astype(f16)
                mrow = None
                if mask is not None:
                    mrow = mask[i3 % mask.shape[0], h % mask.shape[1], i1]
                parts = []
                for c0 in range(0, n_kv, chunk):
                    m_max, s_sum, acc = fa_row_chunk(
                        q16, kk, vv, mrow, slope, scale, softcap, c0, min(n_kv, c0 + chunk)
                    )
                    if sinks is not None and c0 == 0:
                        m_max, s_sum, acc = add_sink(m_max, s_sum, acc, f32(sinks[h]))
                    parts.append((m_max, s_sum, acc))
                if split:  # ggml_flash_attn_ext_reduce_partials
                    m_fin, s_fin, res = f32(-np.inf), f32(0), np.zeros(dv, f32)
                    for m_c, s_c, acc in parts:
                        if s_c == 0:
                            continue
                        m_new = max(m_fin, m_c)
                        so, sn = expf(m_fin - m_new), expf(m_c - m_new)
                        res = (res.astype(ld) * ld(so) + (acc * sn).astype(ld)).astype(f32)
                        s_fin = f32(ld(s_fin) * ld(so) + ld(f32(s_c * sn)))
                        m_fin = m_new
                    if s_fin != 0:
                        res = (res * (f32(1) / s_fin)).astype(f32)
                    out[i3, i1, h] = res
                else:
                    (_, s_sum, acc) = parts[0]
                    inv = f32(0) if s_sum == 0 else f32(1) / s_sum
                    out[i3, i1, h] = acc * inv
    return out


def fa_case(rng, *, mask=True, sinks=False, kv_pad=7, kv_dtype=f16, **dims):
    """q, k/v (strided head views of a [n3, kv_size, n_head_kv * d] cache), mask, sinks; of
    FA_DIMS' sizes `dims`."""
    dk, dv, n_q, n_kv, n_head, n_head_kv, n3, mask_heads = fa_dims(**dims)
    q = rng.standard_normal((n3, n_head, n_q, dk)).astype(f32)
    kv_size = n_kv + kv_pad

    def cache(d):
        c = rng.standard_normal((n3, kv_size, n_head_kv, d)).astype(f16).astype(kv_dtype)
        return c, c[:, :n_kv].transpose(0, 2, 1, 3)  # (n3, n_head_kv, n_kv, d) view

    kc, k = cache(dk)
    vc, v = cache(dv)
    m = None
    if mask:
        m = np.zeros((n3, mask_heads, n_q, n_kv + 3), f32)
        for i in range(n_q):
            m[..., i, n_kv - n_q + i + 1 :] = -np.inf
        m[rng.random(m.shape) < 0.15] = -np.inf
        m = m.astype(f16)
    s = rng.standard_normal(n_head).astype(f32) if sinks else None
    return q, (kc, k), (vc, v), m, s


def run_native_fa(q, kv_k, kv_v, m, s, scale, max_bias, softcap, threads):
    kc, k = kv_k
    vc, v = kv_v
    n3, n_head, n_q, _ = q.shape
    out = np.zeros((n3, n_q, n_head, v.shape[3]), f32)
    bases = [np.frombuffer(a, np.uint8) for a in (q, kc, vc, out)]

    q_arg = arg(q, bases[0])
    k_arg = (bases[1], *_rel(k, kc))
    v_arg = (bases[2], *_rel(v, vc))
    m_arg = arg(m, np.frombuffer(m, np.uint8)) if m is not None else None
    s_arg = arg(s, np.frombuffer(s, np.uint8)) if s is not None else None
    out_b = out.view(np.uint8).reshape(-1)
    step = _native.flash_attn_ext_step(
        q_arg,
        k_arg,
        v_arg,
        m_arg,
        s_arg,
        arg(out, out_b),
        scale,
        max_bias,
        softcap,
        threads,
        kv_f32=kc.dtype == f32,
    )
    step()
    return out


def _rel(view: np.ndarray, base: np.ndarray):
    off = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return off, tuple(reversed(view.shape)), tuple(reversed(view.strides))


@pytest.mark.parametrize(
    "case",
    [
        dict(),
        dict(n_q=1, n_kv=33, dk=40, dv=24, n_head=3, n_head_kv=1),  # odd sizes, tails
        dict(n_q=3, n_head=8, n_head_kv=2, sinks=True, n3=2, mask_heads=2),
        dict(n_q=1, n_kv=530, n_head=2, n_head_kv=1),  # split-KV decode path
        dict(n_q=1, n_kv=520, n_head=2, n_head_kv=2, sinks=True, mask=False),
        # split-KV, all heads' walks position by position: GQA pairs, and groups of 3
        dict(n_q=1, n_kv=515, n_head=8, n_head_kv=2, dk=128, dv=128, sinks=True),
        dict(n_q=1, n_kv=512, n_head=6, n_head_kv=2, mask_heads=1),
        dict(n_q=5, mask=False),
    ],
)
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_flash_attn_matches_ggml_oracle(isa, case, threads):
    rng = np.random.default_rng(len(str(case)) * 7 + threads)
    q, k, v, m, s = fa_case(rng, **case)
    for scale, max_bias, softcap in ((0.125, 0.0, 0.0), (0.3, 8.0, 0.0), (0.5, 0.0, 20.0)):
        if max_bias and m is None:
            continue
        ours = run_native_fa(q, k, v, m, s, scale, max_bias, softcap, threads)
        want = fa_oracle(q, k[1], v[1], m, s, scale, max_bias, softcap, threads)
        np.testing.assert_array_equal(ours, want)


def test_flash_attn_fully_masked_row_is_zero(isa):
    rng = np.random.default_rng(5)
    q, k, v, m, s = fa_case(rng, n_q=1)
    m[...] = -np.inf
    out = run_native_fa(q, k, v, m, None, 0.125, 0.0, 0.0, 2)
    assert not out.any()


def test_flash_attn_rejects_out_of_bounds():
    rng = np.random.default_rng(6)
    q, (kc, k), v, m, s = fa_case(rng, n_q=1)
    kb = np.frombuffer(kc, np.uint8)
    off, ne, nb = _rel(k, kc)
    out = np.zeros((1, 1, 4, 64), f32)
    with pytest.raises(ValueError, match="exceeds"):
        _native.flash_attn_ext_step(
            arg(q, np.frombuffer(q, np.uint8)),
            (kb, off + len(kb) // 2, ne, nb),
            (np.frombuffer(v[0], np.uint8), *_rel(v[1], v[0])),
            None,
            None,
            arg(out, out.view(np.uint8).reshape(-1)),
            0.125,
            0.0,
            0.0,
        )


def reference_fa(port, q, k, v, m, s, scale, max_bias, softcap):
    """The same node on a server: K/V as strided views of their caches."""
    g = OpGraph()
    n3, n_head, n_q, dk = q.shape
    qi = g.input(F32, (dk, n_q, n_head, n3), q)
    srcs = [qi]
    for cache, view in (k, v):
        ci = g.input(F32 if cache.dtype == f32 else F16, tuple(reversed(cache.shape)), cache)
        srcs.append(g.view(ci, tuple(reversed(view.shape)), tuple(reversed(view.strides))))
    mask = None if m is None else g.input(F16, tuple(reversed(m.shape)), m)
    sinks = None if s is None else g.input(F32, (n_head, 1, 1, 1), s)
    dv = v[1].shape[3]
    out_ne = (dv, n_head, n_q, n3)
    out = flash_attn_node(g, srcs, mask, sinks, out_ne, scale, max_bias, softcap)
    (raw,) = g.run(port, [out])
    return as_f32(raw, out_ne)


@pytest.mark.parametrize(
    "case",
    [
        dict(n_q=2, n_kv=45, n_head=8, n_head_kv=2, sinks=True),
        dict(n_q=1, n_kv=37, dk=40, dv=24, n_head=3, n_head_kv=1, n3=2),
        dict(n_q=1, n_kv=600, n_head=4, n_head_kv=2),  # split-KV path (2 threads each side)
        dict(n_q=7, n_kv=90, n_head=4, n_head_kv=4, mask_heads=2),
        # >= 64 query rows: ggml's tiled f32 path (KV tail tile, GQA, sinks, odd head sizes)
        dict(n_q=70, n_kv=150, n_head=8, n_head_kv=2, sinks=True),
        dict(n_q=64, n_kv=64, dk=40, dv=24, n_head=3, n_head_kv=1, n3=2, mask_heads=3),
        dict(n_q=130, n_kv=200, n_head=4, n_head_kv=4, mask=False, sinks=True),
        dict(n_q=65, n_kv=70, n_head=4, n_head_kv=2, kv_dtype=f32),
    ],
)
def test_flash_attn_matches_reference_server(reference_v8, rpcnet_v8, isa, case):
    rng = np.random.default_rng(len(str(case)))
    q, k, v, m, s = fa_case(rng, **case)
    for scale, max_bias, softcap in ((0.125, 0.0, 0.0), (0.5, 0.0, 30.0), (0.2, 8.0, 0.0)):
        ref = reference_fa(reference_v8, q, k, v, m, s, scale, max_bias, softcap)
        ours = reference_fa(rpcnet_v8, q, k, v, m, s, scale, max_bias, softcap)
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("kv_dtype", [f16, f32])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_flash_attn_tiled_kernel_matches_reference_server(reference_v8, isa, threads, kv_dtype):
    # the kernel itself (portable build too) on ggml's tiled path: its numbers do not depend on
    # the thread count; an all-masked KV tile in the middle is skipped like ggml skips it
    rng = np.random.default_rng(21)
    case = dict(n_q=100, n_kv=230, n_head=6, n_head_kv=2, dk=48, dv=40, mask_heads=3)
    q, k, v, m, s = fa_case(rng, **case, sinks=True, kv_dtype=kv_dtype)
    m[..., 64:128] = -np.inf
    for scale, max_bias, softcap in ((0.125, 0.0, 0.0), (0.5, 4.0, 30.0)):
        ref = reference_fa(reference_v8, q, k, v, m, s, scale, max_bias, softcap)
        ours = run_native_fa(q, k, v, m, s, scale, max_bias, softcap, threads)
        np.testing.assert_array_equal(ours, ref)


def test_flash_attn_f32_kv_needs_the_tiled_path():
    rng = np.random.default_rng(22)
    q, k, v, m, s = fa_case(rng, n_q=63, kv_dtype=f32)
    with pytest.raises(ValueError, match="64 query rows"):
        run_native_fa(q, k, v, m, s, 0.125, 0.0, 0.0, 1)


def test_flash_attn_parallel_workers_match_oracle(isa):
    # large enough to run on several threads (split-KV chunks spread over workers)
    rng = np.random.default_rng(11)
    q, k, v, m, s = fa_case(rng, n_q=1, n_kv=1100, n_head=4, n_head_kv=2, dk=256, dv=256)
    for threads in (2, 3):
        ours = run_native_fa(q, k, v, m, s, 0.0625, 0.0, 0.0, threads)
        want = fa_oracle(q, k[1], v[1], m, s, 0.0625, 0.0, 0.0, threads)
        np.testing.assert_array_equal(ours, want)


# --- row ops: NumPy oracles from ggml's definitions ---------------------------------------------


def rms_norm_oracle(x: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        row = x[idx]
        total = 0.0
        for v in (row * row).astype(f64):  # ggml: sequential double sum of float squares
            total += v
        mean = f32(total / row.shape[0])
        out[idx] = row * (f32(1) / np.sqrt(mean + f32(eps), dtype=f32))
    return out


def v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf (AVX2) lane by lane; fma via long double (exact products of floats)."""

    def fma_v(a, b, c):
        return (np.asarray(a, ld) * np.asarray(b, ld) + np.asarray(c, ld)).astype(f32)

    def c32(h):
        return f32(float.fromhex(h))

    x = x.astype(f32)
    r = c32("0x1.8p23")
    z = fma_v(x, c32("0x1.715476p+0"), r)
    n = (z - r).astype(f32)
    b = fma_v(-n, c32("0x1.7f7d1cp-20"), fma_v(-n, c32("0x1.62e4p-1"), x))
    e = (z.view(np.uint32) << np.uint32(23)).astype(np.uint32)
    k = (e + np.float32(1).view(np.uint32)).astype(np.uint32).view(f32)
    u = (b * b).astype(f32)
    j = fma_v(
        fma_v(
            fma_v(c32("0x1.0e4020p-7"), b, c32("0x1.573e2ep-5")),
            u,
            fma_v(c32("0x1.555e66p-3"), b, c32("0x1.fffdb6p-2")),
        ),
        u,
        (c32("0x1.ffffecp-1") * b).astype(f32),
    )
    normal = fma_v(j, k, k)
    g = np.where(n <= 0, np.uint32(0x82000000), np.uint32(0)).astype(np.uint32)
    s1 = (g + np.uint32(0x7F000000)).astype(np.uint32).view(f32)
    s2 = (e - g).astype(np.uint32).view(f32)
    big = np.abs(n) > 126
    huge = np.abs(n) > 192
    scaled = (fma_v(s2, j, s2) * s1).astype(f32)
    return np.where(huge, (s1 * s1).astype(f32), np.where(big, scaled, normal))


def swiglu_oracle(x: np.ndarray, g: np.ndarray) -> np.ndarray:
    n = x.shape[-1]
    n_main = n & ~7
    e = np.empty_like(x)
    e[..., :n_main] = v_expf(f32(0) - x[..., :n_main])
    e[..., n_main:] = (
        [[expf(-v) for v in row] for row in x[..., n_main:].reshape(-1, n - n_main)]
        if n > n_main
        else e[..., n_main:]
    )
    return ((x / (f32(1) + e)).astype(f32) * g).astype(f32)


def rope_oracle(x, pos, n_dims, neox, freq_base, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0):
    """x (n3, n_pos, n_head, ne0) f32; ggml_rope_cache_init + rotate_pairs, no YaRN ramp unless
    ext_factor (ramp over corr dims of n_ctx_orig 4096, beta 32/1)."""
    out = x.copy()
    theta_scale = f32(np.power(f64(f32(freq_base)), f64(f32(-2.0) / f32(n_dims))))
    half = n_dims // 2
    mscale = f32(attn_factor)
    for i2, p in enumerate(pos):
        theta = f32(p)
        cache = []
        for _ in range(half):
            t = f32(f32(freq_scale) * theta)
            # ggml calls the C library's cosf/sinf (glibc's are not correctly rounded)
            cache.append((f32(_libm.cosf(float(t))) * mscale, f32(_libm.sinf(float(t))) * mscale))
            theta = f32(theta * theta_scale)
        for i, (c, s) in enumerate(cache):
            a, b = (i, i + half) if neox else (2 * i, 2 * i + 1)
            x0, x1 = x[:, i2, :, a], x[:, i2, :, b]
            out[:, i2, :, a] = (x0.astype(ld) * ld(c) - (x1 * s).astype(ld)).astype(f32)
            out[:, i2, :, b] = (x0.astype(ld) * ld(s) + (x1 * c).astype(ld)).astype(f32)
    return out


def _buf(a: np.ndarray) -> np.ndarray:
    return np.frombuffer(a, np.uint8) if a.flags.c_contiguous else a.base.view(np.uint8)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1000), (2, 3, 5, 67), (1, 1, 4, 4096)])
def test_rms_norm_matches_oracle(isa, shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(f32)
    out = np.zeros_like(x)
    ob = out.view(np.uint8).reshape(-1)
    _native.rms_norm_step(arg(x, np.frombuffer(x, np.uint8)), arg(out, ob), 1e-5, 2)()
    np.testing.assert_array_equal(out, rms_norm_oracle(x, 1e-5))


@pytest.mark.parametrize("nc", [8, 13, 1408])
def test_swiglu_matches_oracle(isa, nc):
    rng = np.random.default_rng(nc)
    a = (rng.standard_normal((3, 2 * nc)) * 6).astype(f32)
    a[0, :4] = [-120.0, 95.0, 0.0, -0.0]  # vector expf's overflow/underflow branches
    ab = np.frombuffer(a, np.uint8)
    out = np.zeros((3, nc), f32)
    x, g = a[:, :nc], a[:, nc:]
    step = _native.swiglu_step(
        (ab, 0, (nc, 3, 1, 1), (4, 8 * nc, 24 * nc, 24 * nc)),
        (ab, 4 * nc, (nc, 3, 1, 1), (4, 8 * nc, 24 * nc, 24 * nc)),
        arg(out, out.view(np.uint8).reshape(-1)),
        2,
    )
    with np.errstate(over="ignore"):
        step()
        want = swiglu_oracle(x, g)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("ne0,n_dims", [(64, 64), (80, 32)])
def test_rope_matches_oracle(isa, neox, ne0, n_dims):
    rng = np.random.default_rng(ne0 + n_dims + neox)
    x = (rng.standard_normal((2, 3, 4, ne0)) * 2).astype(f32)
    pos = np.array([0, 7, 1500], np.int32)
    out = np.zeros_like(x)
    params = (n_dims, 2 if neox else 0, 4096, 0, 10000.0, 0.5, 0.0, 1.0, 32.0, 1.0)
    _native.rope_step(
        arg(x, np.frombuffer(x, np.uint8)),
        arg(pos, np.frombuffer(pos, np.uint8)),
        None,
        arg(out, out.view(np.uint8).reshape(-1)),
        params,
        2,
    )()
    want = rope_oracle(x, pos, n_dims, neox, 10000.0, freq_scale=0.5)
    np.testing.assert_array_equal(out, want)


# --- row ops against the reference server (same single-op graph) --------------------------------

RMS_NORM, ROPE, GLU, SET_ROWS, GET_ROWS, CPY, CONT = 25, 48, 100, 42, 40, 34, 35
ADD, MUL = 2, 7
I32, I64 = 26, 27


def both(ref_port, our_port, g, out):
    (r,), (o,) = g.run(ref_port, [out]), g.run(our_port, [out])
    return r, o


def test_rms_norm_mul_add_match_reference(reference_v8, rpcnet_v8, isa):
    rng = np.random.default_rng(1)
    ne = (1000, 3, 2, 1)
    g = OpGraph()
    x = g.input(F32, ne, (rng.standard_normal(ne[::-1]) * 4).astype(f32))
    w = g.input(F32, (1000, 1, 1, 1), rng.standard_normal(1000).astype(f32))
    res = g.input(F32, ne, rng.standard_normal(ne[::-1]).astype(f32))
    n = g.op(RMS_NORM, F32, ne, (x,), params=pack_params(1e-6))
    m = g.op(MUL, F32, ne, (n, w))
    out = g.op(ADD, F32, ne, (m, res))
    r, o = both(reference_v8, rpcnet_v8, g, out)
    np.testing.assert_array_equal(as_f32(o, ne), as_f32(r, ne))


@pytest.mark.parametrize("nc,swapped,fused", [(1408, 0, False), (37, 1, False), (100, 0, True)])
def test_swiglu_matches_reference(reference_v8, rpcnet_v8, isa, nc, swapped, fused):
    rng = np.random.default_rng(nc)
    g = OpGraph()
    if fused:
        a = g.input(F32, (nc, 3, 1, 1), (rng.standard_normal((3, nc)) * 5).astype(f32))
        b = g.input(F32, (nc, 3, 1, 1), rng.standard_normal((3, nc)).astype(f32))
        srcs = (a, b)
    else:
        srcs = (
            g.input(F32, (2 * nc, 3, 1, 1), (rng.standard_normal((3, 2 * nc)) * 5).astype(f32)),
        )
    out = g.op(GLU, F32, (nc, 3, 1, 1), srcs, params=pack_params(2, swapped))
    r, o = both(reference_v8, rpcnet_v8, g, out)
    np.testing.assert_array_equal(as_f32(o, (nc, 3)), as_f32(r, (nc, 3)))


@pytest.mark.parametrize("mode", [0, 2])
@pytest.mark.parametrize("ext_factor", [0.0, 1.0])
def test_rope_matches_reference(reference_v8, rpcnet_v8, isa, mode, ext_factor):
    rng = np.random.default_rng(mode + int(ext_factor))
    ne = (128, 4, 3, 1)
    g = OpGraph()
    x = g.input(F32, ne, (rng.standard_normal(ne[::-1]) * 2).astype(f32))
    pos = g.input(I32, (3, 1, 1, 1), np.array([5, 900, 4000], np.int32))
    params = pack_params(
        0, 96, mode, 0, 2048, 10000.0, 0.25, ext_factor, 1.0, 32.0, 1.0, 0, 0, 0, 0, 0
    )
    out = g.op(ROPE, F32, ne, (x, pos), params=params)
    r, o = both(reference_v8, rpcnet_v8, g, out)
    np.testing.assert_array_equal(as_f32(o, ne), as_f32(r, ne))


@pytest.mark.parametrize("dst_type,idx_type", [(F16, I64), (F32, I32)])
def test_set_get_rows_and_copy_match_reference(reference_v8, rpcnet_v8, isa, dst_type, idx_type):
    rng = np.random.default_rng(dst_type)
    g = OpGraph()
    ne0, n_rows, n_dst = 70, 3, 9
    rows = g.input(
        F32, (ne0, n_rows, 2, 1), (rng.standard_normal((2, n_rows, ne0)) * 3).astype(f32)
    )
    ids = np.array([[7, 0, 4], [2, 8, 5]], np.int64 if idx_type == I64 else np.int32)
    idx = g.input(idx_type, (n_rows, 2, 1, 1), ids)
    dst0 = rng.standard_normal((2, n_dst, ne0)).astype(f32)
    dst = g.input(dst_type, (ne0, n_dst, 2, 1), dst0.astype(f16) if dst_type == F16 else dst0)
    setr = g.op(SET_ROWS, dst_type, (ne0, n_dst, 2, 1), (rows, idx, dst), inplace_of=dst)
    gidx = g.input(I32, (4, 2, 1, 1), np.array([[1, 7, 7, 0], [8, 5, 2, 3]], np.int32))
    got = g.op(GET_ROWS, F32, (ne0, 4, 2, 1), (setr, gidx))
    # a transposed view copied to f16 and back (CPY into a strided view, CONT of it)
    tview = g.view(got, (4, ne0, 2, 1), (ne0 * 4, 4, ne0 * 16, ne0 * 32))
    half = g.op(CONT, F16, (4, ne0, 2, 1), (tview,))
    back = g.op(
        CPY, F32, (4, ne0, 2, 1), (half, g.input(F32, (4, ne0, 2, 1), np.zeros(8 * ne0, f32)))
    )
    for node, shape in ((got, (ne0, 4, 2)), (back, (4, ne0, 2))):
        r, o = both(reference_v8, rpcnet_v8, g, node)
        np.testing.assert_array_equal(as_f32(o, shape), as_f32(r, shape))


@pytest.mark.parametrize("dst_type", [F32, F16])
def test_cont_of_permuted_heads_into_rows_matches_reference(reference_v8, rpcnet_v8, isa, dst_type):
    """The attention merge: CONT of a (dim, token, head) result permuted to (dim, head, token)
    into packed rows of dim * heads (ggml_cont_2d), a shape other than the source's."""
    rng = np.random.default_rng(11 + dst_type)
    d, tokens, heads = 24, 3, 5
    src = rng.standard_normal((heads, tokens, d)).astype(f32)
    g = OpGraph()
    x = g.input(F32, (d, tokens, heads, 1), src)
    perm = g.view(x, (d, heads, tokens, 1), (4, 4 * d * tokens, 4 * d, 4 * d * tokens * heads))
    out = g.op(CONT, dst_type, (d * heads, tokens, 1, 1), (perm,))
    r, o = both(reference_v8, rpcnet_v8, g, out)
    dtype = f16 if dst_type == F16 else f32
    want = src.transpose(1, 0, 2).reshape(tokens, d * heads).astype(dtype)
    for raw in (r, o):
        np.testing.assert_array_equal(np.frombuffer(raw, dtype).reshape(tokens, d * heads), want)
    # and it is the native copy that ran (a padded destination is left to NumPy)
    elem = 2 if dst_type == F16 else 4
    src_t = _tensor(F32, (d, heads, tokens, 1), (4, 4 * d * tokens, 4 * d, 4 * src.nbytes))
    for pad, name in ((0, "copy_native"), (8, "copy")):
        row = elem * d * heads + pad
        nb = (elem, row, row * tokens, row * tokens)
        node = _tensor(dst_type, (d * heads, tokens, 1, 1), nb, CONT, (src_t,))
        assert select(node).name == name


def _tensor(type_id, ne, nb, op=0, src=(), params=b""):
    return Tensor(
        id=0,
        type=type_id,
        ne=tuple(ne),
        nb=tuple(nb),
        op=op,
        op_params=params,
        flags=0,
        name="",
        src=tuple(src),
        buffer=object(),  # distinct buffers: no overlap
        offset=0,
    )


SOFT_MAX = 46


@pytest.mark.parametrize(
    "mask_type,sinks,max_bias",
    [(None, False, 0.0), (F16, True, 0.0), (F32, False, 8.0), (F16, True, 4.0)],
)
def test_soft_max_matches_reference(reference_v8, rpcnet_v8, isa, mask_type, sinks, max_bias):
    rng = np.random.default_rng(3 + int(max_bias))
    ne = (77, 5, 6, 1)  # rows not a multiple of 8: vector chunks plus a tail
    g = OpGraph()
    x = g.input(F32, ne, (rng.standard_normal(ne[::-1]) * 3).astype(f32))
    srcs = [x]
    if mask_type is not None:
        m = rng.standard_normal((1, 2, 8, 77)).astype(f32)
        m[rng.random(m.shape) < 0.2] = -np.inf
        srcs.append(g.input(mask_type, (77, 8, 2, 1), m.astype(f16) if mask_type == F16 else m))
    elif sinks:
        srcs.append(0)
    if sinks:
        srcs.append(g.input(F32, (6, 1, 1, 1), rng.standard_normal(6).astype(f32)))
    out = g.op(SOFT_MAX, F32, ne, srcs, params=pack_params(0.3, float(max_bias)))
    r, o = both(reference_v8, rpcnet_v8, g, out)
    np.testing.assert_array_equal(as_f32(o, ne), as_f32(r, ne))


# --- element-wise maps: SCALE, TANH, GELU, GEGLU (gemma2's soft-capping and GEGLU) -------------

UNARY, SCALE = 91, 32
TANH, GELU = 4, 8
GEGLU = 1


def _map_inputs(rng, ne):
    x = (rng.standard_normal(ne[::-1]) * 6).astype(f32)
    x.reshape(-1)[:6] = [-10.0, 10.0, -11.5, 12.0, 0.0, np.nan]  # GELU's clamps and edges
    return x


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit (the sign of a zero included); NaN where the other is NaN."""
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


def test_softcap_chain_and_scale_bias_match_reference(reference_v8, rpcnet_v8):
    """SCALE(1/c), TANH, SCALE(c) as llama.cpp soft-caps logits, and SCALE with a bias (one
    FMA), bit for bit against the reference; the native kernels are the ones that run."""
    rng = np.random.default_rng(5)
    ne = (32000, 2, 1, 1)
    g = OpGraph()
    x = g.input(F32, ne, (rng.standard_normal(ne[::-1]) * 40).astype(f32))
    down = g.op(SCALE, F32, ne, (x,), params=pack_params(1.0 / 30.0, 0.0))
    t = g.op(UNARY, F32, ne, (down,), params=pack_params(TANH))
    up = g.op(SCALE, F32, ne, (t,), params=pack_params(30.0, 0.0))
    biased = g.op(SCALE, F32, ne, (x,), params=pack_params(0.3, -1.7))
    (r_up, r_b), (o_up, o_b) = g.run(reference_v8, [up, biased]), g.run(rpcnet_v8, [up, biased])
    np.testing.assert_array_equal(as_f32(o_up, ne), as_f32(r_up, ne))
    np.testing.assert_array_equal(as_f32(o_b, ne), as_f32(r_b, ne))
    src = _tensor(F32, ne, (4, 4 * ne[0], 8 * ne[0], 8 * ne[0]))
    node = _tensor(F32, ne, src.nb, UNARY, (src,), pack_params(TANH))
    assert select(node).name == "unary_native"
    node = _tensor(F32, ne, src.nb, SCALE, (src,))
    assert select(node).name == "scale_native"


def test_tanh_is_correctly_rounded():
    """The reference's tanhf (glibc 2.41, CORE-MATH) is correctly rounded: the double rounded
    once, not the host C library's float tanhf."""
    rng = np.random.default_rng(9)
    x = np.concatenate([rng.standard_normal(20000) * 3, rng.uniform(-0.5, 0.5, 20000)]).astype(f32)
    out = np.zeros_like(x)
    ob = out.view(np.uint8)
    _native.tanh_step(arg(x, np.frombuffer(x, np.uint8)), arg(out, ob), 2)()
    np.testing.assert_array_equal(out, np.tanh(x.astype(f64)).astype(f32))


@pytest.mark.parametrize("ne", [(1000, 3, 2, 1), (77, 5, 1, 1)])
def test_gelu_matches_reference(reference_v8, rpcnet_v8, ne):
    rng = np.random.default_rng(ne[0])
    g = OpGraph()
    x = g.input(F32, ne, _map_inputs(rng, ne))
    out = g.op(UNARY, F32, ne, (x,), params=pack_params(GELU))
    r, o = both(reference_v8, rpcnet_v8, g, out)
    _same_bits(as_f32(o, ne), as_f32(r, ne))


@pytest.mark.parametrize("nc,swapped,fused", [(2816, 0, False), (37, 1, False), (100, 0, True)])
def test_geglu_matches_reference(reference_v8, rpcnet_v8, nc, swapped, fused):
    rng = np.random.default_rng(nc + swapped)
    g = OpGraph()
    if fused:
        a = g.input(F32, (nc, 3, 1, 1), _map_inputs(rng, (nc, 3, 1, 1)))
        b = g.input(F32, (nc, 3, 1, 1), rng.standard_normal((3, nc)).astype(f32))
        srcs = (a, b)
    else:
        srcs = (g.input(F32, (2 * nc, 3, 1, 1), _map_inputs(rng, (2 * nc, 3, 1, 1))),)
    out = g.op(GLU, F32, (nc, 3, 1, 1), srcs, params=pack_params(GEGLU, swapped))
    r, o = both(reference_v8, rpcnet_v8, g, out)
    _same_bits(as_f32(o, (nc, 3)), as_f32(r, (nc, 3)))
