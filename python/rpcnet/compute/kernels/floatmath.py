"""float32 math as ggml's CPU backend computes it, shared by the element-wise kernels.

* GELU and GELU_QUICK on f32/f16 inputs go through ggml's fp16 lookup tables (argument rounded to
  f16, result is the f16 table entry); the same tables are rebuilt here, so results are exact;
* libm functions (expf, logf, sinf, ...) are evaluated in float64 and rounded once, and the host
  libm decides the arguments whose double result lies near a float32 rounding midpoint (glibc's
  *f functions are not correctly rounded there), which reproduces the reference's per-element
  libm calls on the same host; tanhf and expm1f are correctly rounded in the reference's C
  library (glibc 2.41 takes them from CORE-MATH; 2.36 differs from that on 23% / 9% of random
  arguments), so they are the float64 value rounded once, whatever the host's libm;
* where ggml's x86 AVX2 code uses its own vector exp (``ggml_v_expf``: SiLU/SwiGLU on f32 rows,
  SOFT_MAX), the first ``n - n % 8`` elements of a row go through ``v_expf``, a replay of that
  approximation operation by operation, and the rest through expf, as the reference does;
* `a*b + c` that the reference computes with an FMA is rounded once (`fma`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from rpcnet.compute.kernels.common import F32, quiet


def round_f16(x: Any) -> Any:
    """Round float32 values to the nearest f16 (ties to even) and widen back."""
    return x.astype(np.float16).astype(F32)


_ERF_STEP = 1.0 / 1024  # table spacing (a power of two: exact scaling)
_ERF_LIMIT = 6.0  # erf(6) == 1 in float64
_ERF_TABLES: list[Any] = []


def _erf_tables() -> tuple[Any, Any]:
    """erf and its derivative (times the step) on the grid k*_ERF_STEP, 0 <= k*step <= 6."""
    if not _ERF_TABLES:
        grid = [k * _ERF_STEP for k in range(int(_ERF_LIMIT / _ERF_STEP) + 2)]
        values = np.array([math.erf(z) for z in grid])
        slopes = 2.0 / math.sqrt(math.pi) * np.exp(-np.square(np.array(grid))) * _ERF_STEP
        _ERF_TABLES[:] = [values, slopes]
    return _ERF_TABLES[0], _ERF_TABLES[1]


def erf(x: Any) -> Any:
    """erf of a float array as float32 (NumPy has none): cubic Hermite interpolation of an exact
    float64 table (error < 1e-13), so the float32 result is the correctly rounded erf."""
    values, slopes = _erf_tables()
    u = np.fmin(np.abs(x.astype(np.float64)), _ERF_LIMIT) / _ERF_STEP  # NaN -> limit
    k = np.minimum(np.floor(u), len(values) - 2).astype(np.intp)
    t = u - k
    s = 1.0 - t
    f0, f1 = np.take(values, k), np.take(values, k + 1)
    d0, d1 = np.take(slopes, k), np.take(slopes, k + 1)
    y = s * s * ((1.0 + 2.0 * t) * f0 + t * d0) + t * t * ((3.0 - 2.0 * t) * f1 - s * d1)
    return np.where(np.isnan(x), x, np.copysign(y, x).astype(F32))


def _libm_float_fn(name: str) -> Callable[[float], float] | None:
    """The host C library's float function ``name`` (e.g. ``cosf``), or None without one."""
    path = ctypes.util.find_library("m")
    try:
        lib = ctypes.CDLL(path) if path else ctypes.CDLL("libm.so.6")
        fn = getattr(lib, name)
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_float
    fn.argtypes = [ctypes.c_float]
    return fn


def _precise(fn: Callable[[Any], Any], c_name: str, window: float) -> Callable[[Any], Any]:
    """A float32 libm function as the reference computes it: evaluated in float64 and rounded
    once, and, where that double lies within ``window`` float32 ulps of a rounding midpoint, the
    host libm's own result (the reference calls libm per element on the same host; glibc's *f
    functions are not correctly rounded: measured on 1e5 random arguments, expf and the double
    differ only within 0.002 ulp of a midpoint, sinf/cosf within 0.07, logf 0.17).

    NumPy's float32 SIMD versions are a few ulps off (tanh saturates at 1 - 2^-24, which
    `1 + tanh` in GELU turns into a different result).
    """
    libm = _libm_float_fn(c_name)

    def f32_fn(x: Any) -> Any:
        x = np.asarray(x, F32)
        with quiet():
            wide = fn(x.astype(np.float64))
            out = np.asarray(wide.astype(F32))
            if libm is None or out.size == 0:
                return out
            ulp = np.spacing(np.abs(out)).astype(np.float64)
            frac = np.abs(wide - out.astype(np.float64)) / ulp
        near = np.flatnonzero(np.isfinite(frac) & (frac >= 0.5 - window))
        if near.size:
            flat_out, flat_x = out.reshape(-1), x.reshape(-1)
            flat_out[near] = [libm(float(v)) for v in flat_x[near]]
        return out

    return f32_fn


def _correctly_rounded(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A float32 function that the reference's C library rounds correctly: evaluated in float64
    and rounded once (a double within a float64 ulp of a float32 midpoint is ~2^-28 rare)."""

    def f32_fn(x: Any) -> Any:
        with quiet():
            return np.asarray(fn(np.asarray(x, F32).astype(np.float64)).astype(F32))

    return f32_fn


exp, log = _precise(np.exp, "expf", 0.005), _precise(np.log, "logf", 0.2)
tanh, expm1 = _correctly_rounded(np.tanh), _correctly_rounded(np.expm1)
sin, cos = _precise(np.sin, "sinf", 0.08), _precise(np.cos, "cosf", 0.08)
# The SiLU family is a hot path and the reference itself uses a SIMD exp approximation there.
exp_fast = np.exp

GELU_COEF_A = F32(0.044715)
GELU_QUICK_COEF = F32(-1.702)
SQRT_2_OVER_PI = F32(0.79788456080286535587989211986876)
SQRT_2_INV = F32(0.70710678118654752440084436210484)
ONE, HALF, ZERO = F32(1.0), F32(0.5), F32(0.0)


def gelu_exact(x: Any) -> Any:
    """ggml_gelu_f32: the tanh approximation in float32."""
    # the build contracts 1.0f + GELU_COEF_A*x*x into fma(GELU_COEF_A*x, x, 1.0f)
    return HALF * x * (ONE + tanh(SQRT_2_OVER_PI * x * fma(GELU_COEF_A * x, x, ONE)))


def gelu_quick_exact(x: Any) -> Any:
    return x * (ONE / (ONE + exp(GELU_QUICK_COEF * x)))


def gelu_erf(x: Any) -> Any:
    return HALF * x * (ONE + erf(x * SQRT_2_INV))


def silu(x: Any) -> Any:
    """ggml_silu_f32 per element (f16/bf16 rows and the tails of f32 rows): libm expf."""
    return x / (ONE + exp(-x))


def silu_rows(x: Any) -> Any:
    """ggml_vec_silu_f32 along the last axis: ggml_v_silu on 8-lane chunks, then the scalar."""
    return simd_then_scalar(x, lambda v: v / (ONE + v_expf(-v)), silu)


def simd_then_scalar(x: Any, vector: Callable[[Any], Any], scalar: Callable[[Any], Any]) -> Any:
    """``vector`` on the first ``n - n % 8`` elements of each row (AVX2 lanes), ``scalar`` on
    the rest."""
    n = x.shape[-1]
    cut = n - n % AVX2_LANES
    if cut == n:
        return vector(x)
    if cut == 0:
        return scalar(x)
    return np.concatenate([vector(x[..., :cut]), scalar(x[..., cut:])], axis=-1)


AVX2_LANES = 8
_H = float.fromhex
_EXP_R = F32(_H("0x1.8p23"))
_EXP_LOG2E = F32(_H("0x1.715476p+0"))
_EXP_LN2_HI, _EXP_LN2_LO = F32(_H("0x1.62e4p-1")), F32(_H("0x1.7f7d1cp-20"))
_EXP_C = [F32(_H(c)) for c in ("0x1.ffffecp-1", "0x1.fffdb6p-2", "0x1.555e66p-3",
                              "0x1.573e2ep-5", "0x1.0e4020p-7")]  # fmt: skip
_U32 = np.uint32


def v_expf(x: Any) -> Any:
    """ggml_v_expf (vec.h, AVX2+FMA branch), lane by lane: exp with ~1.5 ulp error, the same bits
    as the reference (flush to 0 below -103.97, inf above 88.38)."""
    x = np.asarray(x, F32)
    c0, c1, c2, c3, c4 = _EXP_C
    with quiet():
        z = fma(x, _EXP_LOG2E, _EXP_R)
        n = z - _EXP_R
        b = fma(-n, _EXP_LN2_LO, fma(-n, _EXP_LN2_HI, x))
        e = z.view(_U32) << _U32(23)
        k = (e + ONE.view(_U32)).view(F32)
        u = b * b
        j = fma(fma(fma(c4, b, c3), u, fma(c2, b, c1)), u, c0 * b)
        out = fma(k, j, k)
        big = np.abs(n) > F32(126)
        if not big.any():
            return out
        g = np.where(n <= ZERO, _U32(0x82000000), _U32(0))
        s1 = (g + _U32(0x7F000000)).view(F32)
        s2 = (e - g).view(F32)
        scaled = fma(s2, j, s2) * s1
        return np.where(np.abs(n) > F32(192), s1 * s1, np.where(big, scaled, out))


_TABLES: dict[str, Any] = {}


def _f16_table(name: str) -> Any:
    """ggml_table_gelu_f16 / ggml_table_gelu_quick_f16 (as float32), built on first use."""
    table = _TABLES.get(name)
    if table is None:
        arg = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(F32)
        with quiet():
            values = gelu_exact(arg) if name == "gelu" else gelu_quick_exact(arg)
        table = _TABLES[name] = round_f16(values)
    return table


def _lookup(name: str, x: Any) -> Any:
    return np.take(_f16_table(name), x.astype(np.float16).view(np.uint16))


def gelu_f16_table() -> Any:
    """ggml_table_gelu_f16 as the bytes of contiguous float32 values, indexed by f16 bits (what
    the native GELU kernels read)."""
    return np.ascontiguousarray(_f16_table("gelu")).view(np.uint8)


def gelu_table(x: Any) -> Any:
    """ggml_table_gelu_f16[f16(x)]: GELU of the f16-rounded argument, rounded to f16."""
    return _lookup("gelu", x)


def gelu_quick_table(x: Any) -> Any:
    return _lookup("gelu_quick", x)


def gelu_f32_path(x: Any) -> Any:
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: table lookup, exact outside [-10, 10]."""
    return np.where(x <= -10.0, ZERO, np.where(x >= 10.0, x, gelu_table(x)))


def fma(a: Any, b: Any, c: Any) -> Any:
    """a*b + c rounded once to float32 (the product is exact in float64), like the reference's
    explicit or compiler-contracted FMAs."""
    return (np.asarray(a, np.float64) * b + c).astype(F32)
