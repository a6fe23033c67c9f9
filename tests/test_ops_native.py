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
from support.opgraph import OpGraph, as_f32, pack_params

F32, F16 = 0, 1
FLASH_ATTN_EXT = 74
f32, f16, f64 = np.float32, np.float16, np.float64
ld = np.longdouble

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
for _name in ("expf", "tanhf", "powf"):
    getattr(_libm, _name).restype = ctypes.c_float
_libm.expf.argtypes = [ctypes.c_float]
_libm.tanhf.argtypes = [ctypes.c_float]
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


def fa_case(
    rng,
    *,
    dk=64,
    dv=64,
    n_q=2,
    n_kv=40,
    n_head=4,
    n_head_kv=2,
    n3=1,
    mask=True,
    mask_heads=1,
    sinks=False,
    kv_pad=7,
):
    """q, k/v (strided head views of a [n3, kv_size, n_head_kv * d] cache), mask, sinks."""
    q = rng.standard_normal((n3, n_head, n_q, dk)).astype(f32)
    kv_size = n_kv + kv_pad

    def cache(d):
        c = rng.standard_normal((n3, kv_size, n_head_kv, d)).astype(f16)
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
    step = _native.flash_attn_ext_f16_step(
        q_arg, k_arg, v_arg, m_arg, s_arg, arg(out, out_b), scale, max_bias, softcap, threads
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
        _native.flash_attn_ext_f16_step(
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
        ci = g.input(F16, tuple(reversed(cache.shape)), cache)
        srcs.append(g.view(ci, tuple(reversed(view.shape)), tuple(reversed(view.strides))))
    if m is not None:
        srcs.append(g.input(F16, tuple(reversed(m.shape)), m))
    elif s is not None:
        srcs.append(0)
    if s is not None:
        srcs.append(g.input(F32, (n_head, 1, 1, 1), s))
    dv = v[1].shape[3]
    out_ne = (dv, n_head, n_q, n3)
    out = g.op(
        FLASH_ATTN_EXT,
        F32,
        out_ne,
        srcs,
        params=pack_params(float(scale), float(max_bias), float(softcap), 10),
    )
    (raw,) = g.run(port, [out])
    return as_f32(raw, out_ne)


@pytest.mark.parametrize(
    "case",
    [
        dict(n_q=2, n_kv=45, n_head=8, n_head_kv=2, sinks=True),
        dict(n_q=1, n_kv=37, dk=40, dv=24, n_head=3, n_head_kv=1, n3=2),
        dict(n_q=1, n_kv=600, n_head=4, n_head_kv=2),  # split-KV path (2 threads each side)
        dict(n_q=7, n_kv=90, n_head=4, n_head_kv=4, mask_heads=2),
    ],
)
def test_flash_attn_matches_reference_server(reference_v8, rpcnet_v8, isa, case):
    rng = np.random.default_rng(len(str(case)))
    q, k, v, m, s = fa_case(rng, **case)
    for scale, max_bias, softcap in ((0.125, 0.0, 0.0), (0.5, 0.0, 30.0), (0.2, 8.0, 0.0)):
        ref = reference_fa(reference_v8, q, k, v, m, s, scale, max_bias, softcap)
        ours = reference_fa(rpcnet_v8, q, k, v, m, s, scale, max_bias, softcap)
        np.testing.assert_array_equal(ours, ref)
