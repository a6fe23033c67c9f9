"""ROPE: rotary position embedding, modes NORMAL, NEOX, MROPE, VISION and IMROPE, with YaRN.

Matches ggml's CPU kernel closely: each rotation angle is built exactly as ggml builds it
(theta = p, then theta *= theta_scale once per pair, in float32), because for large positions a
single-ulp difference in the angle is visible in the output. Transcendentals are evaluated in
float64 and rounded, like glibc's correctly rounded float functions. Normal and neox modes of
f32 tensors also run natively (the same angle recurrence, YaRN ramp and fused rotation).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute import convert
from rpcnet.compute.kernels.floatmath import cos as libm_cos
from rpcnet.compute.kernels.floatmath import sin as libm_sin
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import (
    disjoint,
    native_row,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.ops import Op
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import plain_view
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily("rope", cuda=("rpcnet.compute.cuda.kernels.elementwise",))

NORMAL, NEOX, MROPE, VISION, IMROPE = 0, 2, 8, 24, 40
MODES = (NORMAL, NEOX, MROPE, VISION, IMROPE)

f32 = np.float32


def _f(x: float) -> np.float32:
    """A float64 result rounded to float32 (what a correctly rounded libm float function gives)."""
    return f32(x)


def corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float, beta_slow: float):
    """ggml_rope_yarn_corr_dims, in float32 like ggml."""

    def corr_dim(n_rot: float) -> np.float32:
        denom = f32(f32(f32(n_rot) * f32(2)) * f32(math.pi))
        inner = f32(f32(n_ctx_orig) / denom)
        num = f32(f32(n_dims) * _f(math.log(inner)))
        return f32(num / f32(f32(2) * _f(math.log(f32(freq_base)))))

    start = math.floor(corr_dim(beta_fast))
    end = math.ceil(corr_dim(beta_slow))
    return f32(max(0.0, start)), f32(min(n_dims - 1.0, end))


class RopeParams:
    def __init__(self, node: Tensor) -> None:
        x = node.src[0]
        assert x is not None
        self.n_dims = node.i32(1)
        self.mode = node.i32(2)
        self.n_ctx_orig = node.i32(4)
        self.freq_base = node.f32(5)
        self.freq_scale = node.f32(6)
        self.ext_factor = node.f32(7)
        self.attn_factor = node.f32(8)
        self.beta_fast = node.f32(9)
        self.beta_slow = node.f32(10)
        self.sections = [node.i32(11 + i) for i in range(4)]
        self.n_offs = node.i32(15)
        self.ne0 = x.ne[0]
        self.mrope = bool(self.mode & MROPE)
        self.vision = self.mode == VISION
        # number of rotated pairs (cache entries used)
        self.n_rot = self.n_dims if self.vision else self.n_dims // 2

    def valid(self, node: Tensor) -> bool:
        n_dims, n_offs = self.n_dims, self.n_offs
        if self.mode not in MODES or n_dims <= 0 or n_dims % 2 or n_offs < 0 or n_offs % 2:
            return False
        if n_offs + n_dims > self.ne0:
            return False
        if self.mrope:
            secs = self.sections
            if min(secs) < 0 or not any(s > 0 for s in secs[:3]) or sum(secs) > self.ne0:
                return False
        if self.vision and (2 * n_dims != self.ne0 or n_offs != 0):
            return False
        return True


def _supported(node: Tensor) -> bool:
    x, pos, ff = node.src[0], node.src[1], node.src[2] if len(node.src) > 2 else None
    if x is None or pos is None or pos.type != GgmlType.I32:
        return False
    if (
        x.type not in (GgmlType.F32, GgmlType.F16)
        or node.type != x.type
        or tuple(node.ne) != tuple(x.ne)
    ):
        return False
    p = RopeParams(node)
    if not p.valid(node):
        return False
    if pos.nelements != (4 if p.mrope else 1) * x.ne[2]:
        return False
    if ff is not None and (ff.type != GgmlType.F32 or ff.ne[0] < p.n_rot):
        return False
    return True


def rope_mscale(p: RopeParams) -> np.float32:
    """The cos/sin scale: attn_factor, with YaRN's 1 + 0.1·ln(1/freq_scale), in float32."""
    mscale = f32(p.attn_factor)
    if p.ext_factor != 0.0:
        mscale = f32(
            mscale * f32(f32(1) + f32(f32(0.1) * _f(math.log(f32(1) / f32(p.freq_scale)))))
        )
    return mscale


def _plan_constants(p: RopeParams):
    """Per-pair constants that do not depend on data: ramp mix, stream selection, resets."""
    k = np.arange(p.n_rot)
    ts = _f(float(f32(p.freq_base)) ** float(f32(-2.0) / f32(p.n_dims)))  # powf
    lo, hi = corr_dims(p.n_dims, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow)
    y = (k.astype(f32) - lo) / f32(max(f32(0.001), f32(hi - lo)))
    ramp = (f32(1) - np.minimum(f32(1), np.maximum(f32(0), y))).astype(f32)
    ramp_mix = (ramp * f32(p.ext_factor)).astype(f32)
    mscale = rope_mscale(p)

    # which position stream (t, h, w, e) each pair uses, and where a stream restarts (vision)
    sel = np.zeros(p.n_rot, dtype=np.intp)
    resets: list[list[int]] = [[] for _ in range(p.n_rot)]
    if p.mrope:
        s0, s1, s2, s3 = p.sections
        sect_dims = s0 + s1 + s2 + s3
        sec_w = s0 + s1
        sec_e = sec_w + s2
        for i in range(p.n_rot):
            sector = i % sect_dims
            if p.vision:
                for stream, start in enumerate((0, s0, sec_w, sec_e)):
                    if sector == start:
                        resets[i].append(stream)
            if p.mode == IMROPE:
                if sector % 3 == 1 and sector < 3 * s1:
                    sel[i] = 1
                elif sector % 3 == 2 and sector < 3 * s2:
                    sel[i] = 2
                elif sector % 3 == 0 and sector < 3 * s0:
                    sel[i] = 0
                else:
                    sel[i] = 3
            else:
                if s0 <= sector < sec_w:
                    sel[i] = 1
                elif sec_w <= sector < sec_w + s2:
                    sel[i] = 2
                elif sector >= sec_w + s2:
                    sel[i] = 3
    return ts, ramp_mix, mscale, sel, resets


def rope_angles(p: RopeParams, positions: Any, consts, freq_factors: Any | None):
    """cos, sin (already scaled by mscale) of shape (n_pos, n_rot), float32."""
    ts, ramp_mix, mscale, sel, resets = consts
    n_streams = 4 if p.mrope else 1
    base = positions.reshape(n_streams, -1).astype(f32)
    theta = base.copy()
    angles = np.empty((base.shape[1], p.n_rot), dtype=f32)
    for i in range(p.n_rot):  # ggml's running product: theta_i = (theta_{i-1} * ts) in float32
        for stream in resets[i]:
            theta[stream] = base[stream]
        angles[:, i] = theta[sel[i]]
        theta *= ts
    if freq_factors is not None:
        angles /= freq_factors[: p.n_rot]
    interp = angles * f32(p.freq_scale)
    if p.ext_factor != 0.0:
        # ggml's build contracts this to fma(interp, 1 - mix, extrap * mix); emulated in float64
        mixed = angles * ramp_mix
        interp = (interp.astype(np.float64) * (f32(1) - ramp_mix) + mixed).astype(f32)
    return libm_cos(interp) * mscale, libm_sin(interp) * mscale  # cosf, sinf


@FAMILY.kernel(Op.ROPE, "f32/f16 x i32 positions (+f32 freq factors), all rope modes", _supported)
def rope(node: Tensor, context: BuildContext) -> Step:
    x_t, pos_t = node.src[0], node.src[1]
    ff_t = node.src[2] if len(node.src) > 2 else None
    assert x_t is not None and pos_t is not None
    p = RopeParams(node)
    consts = _plan_constants(p)
    xv, out = plain_view(x_t), plain_view(node)
    pos_v = plain_view(pos_t)
    off, n_dims, half = p.n_offs, p.n_dims, p.n_dims // 2
    if p.mode == NORMAL:
        i0 = slice(off, off + n_dims, 2)
        i1 = slice(off + 1, off + n_dims, 2)
    elif p.vision:
        i0, i1 = slice(0, n_dims), slice(n_dims, 2 * n_dims)
    else:
        i0, i1 = slice(off, off + half), slice(off + half, off + n_dims)
    passthrough = [s for s in (slice(0, off), slice(off + n_dims, p.ne0)) if s.stop > s.start]
    if p.vision:
        passthrough = []
    aliased = node.buffer is x_t.buffer and node.offset == x_t.offset and node.nb == x_t.nb
    half_precision = x_t.type == GgmlType.F16

    def run() -> None:
        ff = convert.load_f32(ff_t).reshape(-1) if ff_t is not None else None
        cos, sin = rope_angles(p, pos_v.reshape(-1), consts, ff)
        cos = cos[None, :, None, :]  # (1, n_pos = ne2, 1, n_rot)
        sin = sin[None, :, None, :]
        x0 = xv[..., i0]
        x1 = xv[..., i1]
        if half_precision:
            x0, x1 = x0.astype(f32), x1.astype(f32)
        # ggml's build contracts these to fma(x0, cos, -(x1 * sin)) and fma(x0, sin, x1 * cos);
        # a float64 product plus a rounded float32 term reproduces that.
        x0d = x0.astype(np.float64)
        r0 = (x0d * cos - x1 * sin).astype(f32)
        r1 = (x0d * sin + x1 * cos).astype(f32)
        if not aliased:
            for s in passthrough:
                out[..., s] = xv[..., s]
        out[..., i0] = r0
        out[..., i1] = r1

    return run


def _native_supported(node: Tensor) -> bool:
    x, pos = node.src[0], node.src[1]
    ff = node.src[2] if len(node.src) > 2 else None
    if x is None or pos is None or pos.type != GgmlType.I32 or not rows_contiguous(pos, 4):
        return False
    if x.type != GgmlType.F32 or node.type != GgmlType.F32 or tuple(node.ne) != tuple(x.ne):
        return False
    if not (rows_contiguous(x, 4) and rows_contiguous(node, 4)):
        return False
    p = RopeParams(node)
    if p.mode not in (NORMAL, NEOX) or not p.valid(node) or pos.nelements != x.ne[2]:
        return False
    if ff is not None and (ff.type != GgmlType.F32 or ff.ne[0] < p.n_rot or ff.nb[0] != 4):
        return False
    # an in-place rope whose views do not coincide exactly would read rotated values
    if node.buffer is not x.buffer or disjoint(node, x):
        return True
    return node.offset == x.offset and tuple(node.nb) == tuple(x.nb)


@native_row(
    FAMILY,
    Op.ROPE,
    "f32 x i32 positions (+f32 freq factors), normal/neox (native)",
    _native_supported,
)
def rope_native(node: Tensor, context: BuildContext) -> Step:
    x, pos = node.src[0], node.src[1]
    ff = node.src[2] if len(node.src) > 2 else None
    assert x is not None and pos is not None
    p = RopeParams(node)
    params = (
        p.n_dims,
        p.mode,
        p.n_ctx_orig,
        p.n_offs,
        p.freq_base,
        p.freq_scale,
        p.ext_factor,
        p.attn_factor,
        p.beta_fast,
        p.beta_slow,
    )
    return _native.rope_step(
        tensor_arg(x),
        tensor_arg(pos),
        tensor_arg(ff) if ff is not None else None,
        tensor_arg(node),
        params,
        context.threads,
    )
