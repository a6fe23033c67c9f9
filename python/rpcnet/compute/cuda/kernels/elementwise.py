"""cuda builders of element-wise ops: binary and unary maps, RMS_NORM (with its weight
fused), ROPE and GLU."""

from __future__ import annotations

from rpcnet.compute.cuda.kernels import common
from rpcnet.compute.kernels.kernel_table import Step, fusion
from rpcnet.compute.kernels.rope import RopeParams, rope_mscale
from rpcnet.compute.kernels.rope import corr_dims as rope_corr_dims
from rpcnet.compute.ops import Glu, Op, Unary
from rpcnet.compute.tensor import Tensor

# ---------------------------------------------------------------------------------- elementwise

_BINARY = {Op.ADD: "ADD", Op.SUB: "SUB", Op.MUL: "MUL", Op.DIV: "DIV"}


def _binary_ok(node: Tensor) -> bool:
    s = common._srcs(node, 2)
    if s is None or any(t.type != common.F32 for t in (node, *s)):
        return False
    a, b = s
    return a.ne == node.ne and all(b.ne[i] and a.ne[i] % b.ne[i] == 0 for i in range(4))


def _binary(node: Tensor) -> Step:
    a, b = common._need(node, 2)
    be, launch, op = common._backend(node), common._launch_module(), _BINARY[Op(node.op)]
    va, vb, vd = common._view(a), common._view(b), common._view(node)
    return lambda: launch.binary(be, op, va, vb, vd)


for _op in _BINARY:
    common.cuda_kernel(_op, "f32 (src1 repeat-broadcast)", _binary_ok)(_binary)

_UNARY_OPS = {Op.SQR: "SQR", Op.SQRT: "SQRT", Op.SIN: "SIN", Op.COS: "COS", Op.LOG: "LOG"}


def _unary_ok(node: Tensor) -> bool:
    if common._f32_source(node) is None:
        return False
    return node.op != Op.UNARY or (node.i32(0) in set(Unary) and node.i32(0) != Unary.XIELU)


def _unary(node: Tensor) -> Step:
    (src,) = common._need(node, 1)
    be, launch = common._backend(node), common._launch_module()
    vs, vd = common._view(src), common._view(node)
    if node.op == Op.UNARY:
        code: int | str = node.i32(0)
        p0, p1 = 1.0, 0.0
    elif node.op == Op.SCALE:
        code, p0, p1 = "SCALE", node.f32(0), node.f32(1)
    else:
        code, p0, p1 = _UNARY_OPS[Op(node.op)], 1.0, 0.0
    return lambda: launch.unary(be, code, vs, vd, p0, p1)


for _op in (*_UNARY_OPS, Op.SCALE):
    common.cuda_kernel(_op, "f32 -> f32", _unary_ok)(_unary)
common.cuda_kernel(Op.UNARY, "f32 -> f32 (every ggml unary op but XIELU)", _unary_ok)(_unary)


# ---------------------------------------------------------------------------------- norms


def _rms_norm_ok(node: Tensor) -> bool:
    src = common._f32_source(node)
    return (
        src is not None
        and common._contiguous(src)
        and common._contiguous(node)
        and node.f32(0) >= 0.0
    )


@common.cuda_kernel(Op.RMS_NORM, "f32 contiguous", _rms_norm_ok)
def cuda_rms_norm(node: Tensor) -> Step:
    (src,) = common._need(node, 1)
    be, launch = common._backend(node), common._launch_module()
    shape = (common._rows(node), node.ne[0])
    x, dst, eps = common._view(src, shape), common._view(node, shape), node.f32(0)
    return lambda: launch.rms_norm(be, x, dst, eps)


def _rms_norm_mul_ok(norm: Tensor, mul: Tensor) -> bool:
    w = common._other_src(mul, norm)
    return (
        w is not None
        and _rms_norm_ok(norm)
        and mul.type == common.F32
        and common._contiguous(mul)
        and mul.ne == norm.ne
        and w.type == common.F32
        and common._contiguous(w)
        and w.ne == (norm.ne[0], 1, 1, 1)
    )


@fusion(Op.RMS_NORM, Op.MUL, _rms_norm_mul_ok, device=common.CUDA)
def cuda_rms_norm_mul(norm: Tensor, mul: Tensor) -> Step:
    """RMS_NORM, then MUL by the norm's weight vector: one kernel (the normalized rows are
    never written)."""
    (src,) = common._need(norm, 1)
    w = common._other_src(mul, norm)
    assert w is not None
    be, launch = common._backend(norm), common._launch_module()
    shape = (common._rows(norm), norm.ne[0])
    x, dst, eps, wv = (
        common._view(src, shape),
        common._view(mul, shape),
        norm.f32(0),
        common._view(w, (w.ne[0],)),
    )
    n, rows = shape[1], shape[0]
    if n % 32 or rows > common.MATVEC_MAX_COLS:
        return lambda: launch.rms_norm(be, x, dst, eps, wv)
    # Decode rows feed products (Q, K, V; gate, up) that quantize them: offer to do it here.
    from rpcnet.compute.cuda import launch_fused

    request, yq = common.offer_quantized(be, mul, (32, 256) if n % 256 == 0 else (32,), writes=1)

    def run() -> None:
        if request.block is None:
            launch.rms_norm(be, x, dst, eps, wv)
        else:
            launch_fused.rms_norm_mul_q8(be, x, dst, eps, wv, yq, request.block)

    return run


_ROPE_NORMAL, _ROPE_NEOX = 0, 2


def _rope_ok(node: Tensor) -> bool:
    s = common._srcs(node, 2)
    if s is None or node.type != common.F32:
        return False
    x, pos = s
    freq = node.src[2] if len(node.src) > 2 else None
    p = RopeParams(node)
    return (
        x.type == common.F32
        and x.ne == node.ne
        and x.ne[3] == 1
        and common._contiguous(x)
        and common._contiguous(node)
        and pos.type == common.I32
        and pos.ne[0] == x.ne[2]
        and p.mode in (_ROPE_NORMAL, _ROPE_NEOX)
        and p.n_offs == 0
        and 0 < p.n_dims <= x.ne[0]  # the pairs past n_dims are copied
        and p.n_dims % 2 == 0
        and x.ne[0] % 2 == 0
        and (
            freq is None
            or (
                freq.type == common.F32 and common._contiguous(freq) and freq.ne[0] >= p.n_dims // 2
            )
        )
    )


@common.cuda_kernel(Op.ROPE, "f32 NORMAL/NEOX, YaRN, frequency factors, partial rotation", _rope_ok)
def cuda_rope(node: Tensor) -> Step:
    x_t, pos_t = common._need(node, 2)
    freq_t = node.src[2] if len(node.src) > 2 else None
    be, launch = common._backend(node), common._launch_module()
    shape = (node.ne[2], node.ne[1], node.ne[0])
    x, dst, pos = (
        common._view(x_t, shape),
        common._view(node, shape),
        common._view(pos_t, (pos_t.ne[0],)),
    )
    ff = None if freq_t is None else common._view(freq_t, (freq_t.ne[0],))
    p = RopeParams(node)
    lo, hi = rope_corr_dims(p.n_dims, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow)
    corr, mscale = (float(lo), float(hi)), float(rope_mscale(p))

    def run() -> None:
        launch.rope(
            be,
            x,
            pos,
            dst,
            p.n_dims,
            p.mode,
            p.freq_base,
            p.freq_scale,
            p.ext_factor,
            mscale,
            corr,
            ff,
        )

    return run


def _glu_ok(node: Tensor) -> bool:
    s = common._srcs(node, 2)
    if s is None or node.i32(0) not in common._GLU_IDS or node.i32(1) != 0:
        return False
    a, b = s
    return all(
        t.type == common.F32 and t.ne == node.ne and common._contiguous(t) for t in (a, b, node)
    )


@common.cuda_kernel(Op.GLU, "f32 fused (two sources): REGLU, GEGLU*, SWIGLU, SWIGLU_OAI", _glu_ok)
def cuda_glu(node: Tensor) -> Step:
    a_t, b_t = common._need(node, 2)
    be, launch = common._backend(node), common._launch_module()
    shape = (common._rows(node), node.ne[0])
    a, b, dst = common._view(a_t, shape), common._view(b_t, shape), common._view(node, shape)
    op = common._GLU_IDS[Glu(node.i32(0))]
    alpha, limit = (node.f32(2), node.f32(3)) if node.i32(0) == Glu.SWIGLU_OAI else (1.702, 7.0)
    return lambda: launch.glu(be, a, b, dst, op, alpha, limit)
