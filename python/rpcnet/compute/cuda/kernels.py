"""The CUDA kernels in the shared kernel registry, under device "cuda".

Each entry's `supports` is exactly what its launcher (launch.py) handles: the launchers are
written for the layouts llama.cpp's graphs use (contiguous activations, weights in rows of
blocks), so a node outside them is rejected at plan time ("unsupported ... on cuda": the client
is closed), never computed on the host behind its back.

Importing this module registers the entries and imports neither CuPy nor launch.py (which
imports the CuPy backend module, itself CuPy-free): builders run only for nodes in buffers of a
cuda device, whose backend is a `CudaBackend`. Entries whose steps call cuBLAS through CuPy or
allocate CuPy temporaries (prefill, the xp kernels that are not `out=` only) are registered
`capturable=False`: a CUDA graph cannot record them, so a plan with one runs eagerly.

(op, types) the CPU device has and these entries do not cover are listed with the reason in
`NOT_YET_ON_CUDA` (tests/test_cuda_registry.py prints them).
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.kernels import kernel_table as registry
from rpcnet.compute.kernels.kernel_table import GENERIC, NATIVE, Step, fusion, kernel
from rpcnet.compute.kernels.rope import RopeParams, rope_mscale
from rpcnet.compute.kernels.rope import corr_dims as rope_corr_dims
from rpcnet.compute.ops import Glu, Op, Unary
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType, type_name

CUDA = "cuda"
MATVEC_MAX_COLS = 8  # launch.MV_MAXCOLS: activation columns of one matvec launch
# launch.MV_CHUNKED_MAX: up to this many columns a product runs as matvec launches of at most
# MATVEC_MAX_COLS each (weights read once per launch, arithmetic exactly the decode path's);
# more go through cuBLAS
MATVEC_CHUNKED_MAX = 32
_Q8_1_NOTE = "cuda.q8_1"  # PlanState.shared: (input key, written mark, scratch) of the q8_1 blocks

F32, F16, BF16, I32, I64 = GgmlType.F32, GgmlType.F16, GgmlType.BF16, GgmlType.I32, GgmlType.I64
_DTYPES = {F32: np.float32, F16: np.float16, BF16: np.uint16, I32: np.int32, I64: np.int64}
_CPY_TYPES = {F32: "f32", F16: "f16", BF16: "bf16"}
# ggml_glu_op -> the op ids of glu.cu (its own order)
_GLU_IDS = {
    Glu.REGLU: 0,
    Glu.GEGLU: 1,
    Glu.SWIGLU: 2,
    Glu.GEGLU_ERF: 3,
    Glu.GEGLU_QUICK: 4,
    Glu.SWIGLU_OAI: 5,
}
_SET_ROWS_DST = {F32: "F32", F16: "F16", BF16: "BF16", GgmlType.Q8_0: "Q8_0"}

#: (op, what is missing) the CPU device serves that no cuda entry covers yet: documented gaps,
#: not silent fallbacks (a graph with such a node is refused at plan time on cuda).
NOT_YET_ON_CUDA: dict[str, str] = {
    "FLASH_ATTN_EXT": "quantized (q8_0) and bf16 K/V, ALiBi (runs as an xp kernel; the CUDA C "
    "decode kernel takes head-major contiguous K/V, llama.cpp's cache views are strided)",
    "GLU": "the split form (one source, halves) and SWIGLU_CLAMP",
    "SOFT_MAX": "ALiBi (max_bias > 0) and non-contiguous inputs",
    "ROPE": "MROPE/IMROPE/VISION and f16 (kernels exist, builders do not)",
    "NORM": "f16/bf16 (f32 runs as an xp kernel; the CUDA C rpc_norm_f32 has no builder yet)",
    "MUL_MAT": "quantized or bf16 weights in batched (ne2/ne3 > 1) or strided products",
    "CPY": "to and from quantized types and i32",
    "ARGSORT": "f16/bf16 inputs",
    "CLAMP": "f16/bf16",
    "SUM_ROWS": "f16/bf16",
    "PAD": "circular padding, bf16 and integer types",
    **{
        op: "no CUDA kernel yet"
        for op in (
            "ACC ADD1 ADD_ID ARANGE ARGMAX CONCAT COUNT_EQUAL CUMSUM DIAG_MASK_INF "
            "DIAG_MASK_ZERO FILL GROUP_NORM L2_NORM LEAKY_RELU MEAN REPEAT SSM_CONV SUM "
            "TIMESTEP_EMBEDDING TOP_K TRI"
        ).split()
    },
}


# ---------------------------------------------------------------------------------- helpers


def _launch_module() -> Any:
    from rpcnet.compute.cuda import launch  # at build time only

    return launch


def _contiguous(t: Tensor) -> bool:
    _, block, type_size, _ = _native.type_info(t.type)
    expect = type_size
    for i in range(4):
        if t.ne[i] > 1 and t.nb[i] != expect:
            return False
        expect *= t.ne[i] // block if i == 0 else t.ne[i]
    return True


def _srcs(node: Tensor, n: int) -> list[Tensor] | None:
    srcs = [s for s in node.src[:n] if s is not None]
    return srcs if len(srcs) == n and all(s.buffer is not None for s in srcs) else None


def _need(node: Tensor, n: int) -> list[Tensor]:
    """The first `n` sources of a node its `supports` accepted."""
    srcs = _srcs(node, n)
    assert srcs is not None
    return srcs


def _backend(node: Tensor) -> Any:
    assert node.buffer is not None
    return node.buffer.device.backend


def _view(t: Tensor, shape: tuple[int, ...] | None = None) -> Any:
    """A typed CuPy view of a plain tensor: ggml dims reversed, byte strides from nb (or, with
    `shape`, a contiguous reshape of it)."""
    assert t.buffer is not None
    be = t.buffer.device.backend
    dtype = np.dtype(_DTYPES[t.type])
    strides: tuple[int, ...]
    if shape is None:
        shape = (t.ne[3], t.ne[2], t.ne[1], t.ne[0])
        strides = (t.nb[3], t.nb[2], t.nb[1], t.nb[0])
    else:
        strides = tuple(int(np.prod(shape[i + 1 :])) * dtype.itemsize for i in range(len(shape)))
    return be.view(t.buffer.array, t.offset, shape, strides, dtype)


def _raw(t: Tensor) -> Any:
    """The tensor's bytes as a uint8 view (weights in block form)."""
    assert t.buffer is not None
    return t.buffer.device.backend.view(
        t.buffer.array, t.offset, (t.nbytes,), (1,), np.dtype(np.uint8)
    )


def _typed(t: Tensor) -> Any:
    view = _view(t)
    return (view, "bf16") if t.type == BF16 else view


def _rows(t: Tensor) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]


def _device_scratch(be: Any, kind: str, nbytes: int) -> Any:
    """Plan-time device scratch, shared by the nodes and plans of the GPU (nothing is allocated
    while a plan runs): prefill dequantizes into one f16 buffer as large as the biggest weight."""
    mem = be.scratch(kind, nbytes)
    if mem is None:
        raise ComputeError(f"cuda: no room for {nbytes} bytes of plan scratch")
    return mem


# ---------------------------------------------------------------------------------- elementwise

_BINARY = {Op.ADD: "ADD", Op.SUB: "SUB", Op.MUL: "MUL", Op.DIV: "DIV"}


def _binary_ok(node: Tensor) -> bool:
    s = _srcs(node, 2)
    if s is None or any(t.type != F32 for t in (node, *s)):
        return False
    a, b = s
    return a.ne == node.ne and all(b.ne[i] and a.ne[i] % b.ne[i] == 0 for i in range(4))


def _binary(node: Tensor) -> Step:
    a, b = _need(node, 2)
    be, launch, op = _backend(node), _launch_module(), _BINARY[Op(node.op)]
    va, vb, vd = _view(a), _view(b), _view(node)
    return lambda: launch.binary(be, op, va, vb, vd)


for _op in _BINARY:
    kernel(_op, "f32 (src1 repeat-broadcast)", _binary_ok, device=CUDA)(_binary)

_UNARY_OPS = {Op.SQR: "SQR", Op.SQRT: "SQRT", Op.SIN: "SIN", Op.COS: "COS", Op.LOG: "LOG"}


def _unary_ok(node: Tensor) -> bool:
    s = _srcs(node, 1)
    if s is None or s[0].type != F32 or node.type != F32 or s[0].ne != node.ne:
        return False
    return node.op != Op.UNARY or (node.i32(0) in set(Unary) and node.i32(0) != Unary.XIELU)


def _unary(node: Tensor) -> Step:
    (src,) = _need(node, 1)
    be, launch = _backend(node), _launch_module()
    vs, vd = _view(src), _view(node)
    if node.op == Op.UNARY:
        code: int | str = node.i32(0)
        p0, p1 = 1.0, 0.0
    elif node.op == Op.SCALE:
        code, p0, p1 = "SCALE", node.f32(0), node.f32(1)
    else:
        code, p0, p1 = _UNARY_OPS[Op(node.op)], 1.0, 0.0
    return lambda: launch.unary(be, code, vs, vd, p0, p1)


for _op in (*_UNARY_OPS, Op.SCALE):
    kernel(_op, "f32 -> f32", _unary_ok, device=CUDA)(_unary)
kernel(Op.UNARY, "f32 -> f32 (every ggml unary op but XIELU)", _unary_ok, device=CUDA)(_unary)


# ---------------------------------------------------------------------------------- norms


def _rms_norm_ok(node: Tensor) -> bool:
    s = _srcs(node, 1)
    return (
        s is not None
        and s[0].type == F32
        and node.type == F32
        and s[0].ne == node.ne
        and _contiguous(s[0])
        and _contiguous(node)
        and node.f32(0) >= 0.0
    )


@kernel(Op.RMS_NORM, "f32 contiguous", _rms_norm_ok, device=CUDA)
def cuda_rms_norm(node: Tensor) -> Step:
    (src,) = _need(node, 1)
    be, launch = _backend(node), _launch_module()
    shape = (_rows(node), node.ne[0])
    x, dst, eps = _view(src, shape), _view(node, shape), node.f32(0)
    return lambda: launch.rms_norm(be, x, dst, eps)


def _other_src(node: Tensor, first: Tensor) -> Tensor | None:
    """The source of a two-source `node` that is not `first` (None unless `first` is one)."""
    s = _srcs(node, 2)
    if s is None:
        return None
    if s[0] is first:
        return s[1]
    return s[0] if s[1] is first else None


def _rms_norm_mul_ok(norm: Tensor, mul: Tensor) -> bool:
    w = _other_src(mul, norm)
    return (
        w is not None
        and _rms_norm_ok(norm)
        and mul.type == F32
        and _contiguous(mul)
        and mul.ne == norm.ne
        and w.type == F32
        and _contiguous(w)
        and w.ne == (norm.ne[0], 1, 1, 1)
    )


@fusion(Op.RMS_NORM, Op.MUL, _rms_norm_mul_ok, device=CUDA)
def cuda_rms_norm_mul(norm: Tensor, mul: Tensor) -> Step:
    """RMS_NORM, then MUL by the norm's weight vector: one kernel (the normalized rows are
    never written)."""
    (src,) = _need(norm, 1)
    w = _other_src(mul, norm)
    assert w is not None
    be, launch = _backend(norm), _launch_module()
    shape = (_rows(norm), norm.ne[0])
    x, dst, eps, wv = _view(src, shape), _view(mul, shape), norm.f32(0), _view(w, (w.ne[0],))
    return lambda: launch.rms_norm(be, x, dst, eps, wv)


# ---------------------------------------------------------------------------------- copies


def _cpy_ok(node: Tensor) -> bool:
    s = _srcs(node, 1)
    return (
        s is not None
        and s[0].type in _CPY_TYPES
        and node.type in _CPY_TYPES
        and s[0].ne[0] * s[0].ne[1] * s[0].ne[2] * s[0].ne[3] == node.nelements
    )


def _cpy(node: Tensor) -> Step:
    (src,) = _need(node, 1)
    be, launch = _backend(node), _launch_module()
    s, d = _typed(src), _typed(node)
    return lambda: launch.cpy(be, s, d)


for _op in (Op.CPY, Op.DUP, Op.CONT):
    kernel(_op, "f32/f16/bf16 -> f32/f16/bf16, any layout", _cpy_ok, device=CUDA)(_cpy)


# ---------------------------------------------------------------------------------- rows


def _weight_type(t: Tensor) -> str | None:
    from rpcnet.compute.cuda import sources

    name = type_name(t.type).upper()
    return name if name in sources.WEIGHT_TYPES else None


def _row_bytes(t: Tensor) -> int:
    _, block, type_size, _ = _native.type_info(t.type)
    return t.ne[0] // block * type_size


def _get_rows_ok(node: Tensor) -> bool:
    s = _srcs(node, 2)
    if s is None or node.type != F32 or not _contiguous(node):
        return False
    src, ids = s
    return (
        _weight_type(src) is not None
        and src.ne[2] == src.ne[3] == 1
        and src.nb[1] == _row_bytes(src)
        and ids.type == I32
        and ids.ne[1] == ids.ne[2] == ids.ne[3] == 1
        and _contiguous(ids)
        and node.ne == (src.ne[0], ids.ne[0], 1, 1)
    )


@kernel(Op.GET_ROWS, "all 16 weight types x i32 ids -> f32 (2-D)", _get_rows_ok, device=CUDA)
def cuda_get_rows(node: Tensor) -> Step:
    src, ids = _need(node, 2)
    be, launch, wt = _backend(node), _launch_module(), _weight_type(src)
    w, vi, dst, k = _raw(src), _view(ids, (ids.ne[0],)), _view(node), src.ne[0]
    return lambda: launch.get_rows(be, wt, w, vi, dst, k)


def _set_rows_ok(node: Tensor) -> bool:
    s = _srcs(node, 2)
    if s is None or node.type not in _SET_ROWS_DST:
        return False
    src, ids = s
    k = node.ne[0]
    return (
        src.type == F32
        and _contiguous(src)
        and src.ne[0] == k
        and src.ne[2] == src.ne[3] == 1
        and ids.type in (I32, I64)
        and _contiguous(ids)
        and ids.ne[0] == src.ne[1]
        and ids.ne[1] == ids.ne[2] == ids.ne[3] == 1
        and node.ne[2] == node.ne[3] == 1
        and node.nb[1] == _row_bytes(node)
        and (node.type != GgmlType.Q8_0 or k % 32 == 0)
    )


@kernel(Op.SET_ROWS, "f32 x i32|i64 ids -> f32/f16/bf16/q8_0 (2-D)", _set_rows_ok, device=CUDA)
def cuda_set_rows(node: Tensor) -> Step:
    src, ids = _need(node, 2)
    be, launch, dst_type = _backend(node), _launch_module(), _SET_ROWS_DST[GgmlType(node.type)]
    vs = _view(src, (src.ne[1], src.ne[0]))
    vi, dst = _view(ids, (ids.ne[0],)), _raw(node)
    return lambda: launch.set_rows(be, vs, vi, dst, dst_type)


# ---------------------------------------------------------------------------------- matmul


def _mul_mat_ok(node: Tensor) -> bool:
    from rpcnet.compute.cuda import sources

    s = _srcs(node, 2)
    if s is None or node.type != F32 or not _contiguous(node):
        return False
    w, y = s
    wt = _weight_type(w)
    if wt is None or y.type != F32 or not (_contiguous(w) and _contiguous(y)):
        return False
    k = w.ne[0]
    return (
        w.ne[2] == w.ne[3] == y.ne[2] == y.ne[3] == 1
        and y.ne[0] == k
        and node.ne == (w.ne[1], y.ne[1], 1, 1)
        and (wt in sources.FLOAT_TYPES or k % 32 == 0)
        and w.offset % sources.WEIGHT_ALIGN[wt] == 0  # cudaMalloc bases are 256-aligned
        and _row_bytes(w) % sources.WEIGHT_ALIGN[wt] == 0
    )


@kernel(
    Op.MUL_MAT,
    "all 16 weight types x f32 -> f32 (2-D; N<=32 MMVQ launches of up to 8 columns, else cuBLAS)",
    _mul_mat_ok,
    priority=NATIVE,
    device=CUDA,
    capturable=lambda node: node.ne[1] <= MATVEC_CHUNKED_MAX,  # wider products call cuBLAS
)
def cuda_mul_mat(node: Tensor) -> Step:
    return _mul_mat_step(node, node, None)


def _mul_mat_step(node: Tensor, out: Tensor, add_t: Tensor | None) -> Step:
    """MUL_MAT `node` written to `out` (itself, or the ADD fused after it, with `add_t` the
    ADD's other operand)."""
    from rpcnet.compute.cuda import sources

    w_t, y_t = _need(node, 2)
    be, launch, wt = _backend(node), _launch_module(), _weight_type(w_t)
    assert wt is not None
    k, m, n = w_t.ne[0], w_t.ne[1], y_t.ne[1]
    w, y, dst = _raw(w_t), _view(y_t, (n, k)), _view(out, (n, m))
    add = None if add_t is None else _view(add_t, (n, m))
    if n <= MATVEC_CHUNKED_MAX:
        if wt in sources.FLOAT_TYPES:
            return lambda: launch.matvec(be, wt, w, y, dst, k, m, n, add=add)
        # Products of one input (Q, K and V; gate and up) quantize it once: the first leaves its
        # q8_1 blocks in the scratch, and the next ones use them if no step in between wrote
        # that input or quantized another one.
        state = registry.plan_state()
        assert y_t.buffer is not None
        key = (id(y_t.buffer), y_t.offset, y_t.ne, y_t.nb, launch.activation_block(wt))
        note = state.shared.get(_Q8_1_NOTE)
        if note is not None and note[0] == key and not state.written_since(note[1], y_t):
            held = note[2]
            return lambda: launch.matvec(be, wt, w, y, dst, k, m, n, held, quantized=True, add=add)
        yq = _device_scratch(be, "q8_1", launch.q8_1_bytes(k, n))
        state.shared[_Q8_1_NOTE] = (key, len(state.written), yq)
        return lambda: launch.matvec(be, wt, w, y, dst, k, m, n, yq, add=add)
    assert add is None, "only matvec products take a fused ADD"
    w_bytes, y_bytes = launch.prefill_scratch_bytes(wt, k, m, n)
    w16 = _device_scratch(be, "f16", w_bytes) if w_bytes else None
    y16 = _device_scratch(be, "act16", y_bytes) if y_bytes else None
    return lambda: launch.matmul_prefill(be, wt, w, y, dst, k, m, w16, y16)


def _mul_mat_add_ok(mm: Tensor, add: Tensor) -> bool:
    """A decode product whose only reader is an ADD of a same-shaped contiguous f32 operand
    (the residual after the attention output and FFN down projections)."""
    r = _other_src(add, mm)
    return (
        r is not None
        and r is not mm
        and _mul_mat_ok(mm)
        and mm.ne[1] <= MATVEC_CHUNKED_MAX
        and add.type == F32
        and _contiguous(add)
        and add.ne == mm.ne
        and r.type == F32
        and _contiguous(r)
        and r.ne == mm.ne
    )


@fusion(Op.MUL_MAT, Op.ADD, _mul_mat_add_ok, device=CUDA)
def cuda_mul_mat_add(mm: Tensor, add: Tensor) -> Step:
    """A decode product and the residual ADD after it: the product's kernel adds the other
    operand as it writes (one kernel; the product itself is never written)."""
    r = _other_src(add, mm)
    assert r is not None
    return _mul_mat_step(mm, add, r)


def _elsize(t: Tensor) -> int:
    return int(np.dtype(_DTYPES[t.type]).itemsize)


def _strided_matvec_ok(node: Tensor) -> bool:
    """Few columns against float weights in any row and channel layout (a decode step's
    attention products on the cache's views): elements contiguous along K, heads on ne2."""
    s = _srcs(node, 2)
    if s is None or node.type != F32 or not _contiguous(node):
        return False
    w, y = s
    return (
        w.type in (F32, F16, BF16)
        and y.type == F32
        and w.nb[0] == _elsize(w)
        and y.nb[0] == 4
        and y.nb[1] % 4 == 0
        and y.nb[2] % 4 == 0
        and y.ne[0] == w.ne[0]
        and node.ne == (w.ne[1], y.ne[1], y.ne[2], 1)
        and 1 <= y.ne[1] <= MATVEC_MAX_COLS
        and w.ne[3] == y.ne[3] == 1
        and 0 < w.ne[2]
        and y.ne[2] % w.ne[2] == 0
        and y.ne[2] <= 65535  # channels on grid.y
    )


@kernel(
    Op.MUL_MAT,
    "f32|f16|bf16 x f32 -> f32, N<=8, strided rows and heads, ne2 broadcast (attention decode)",
    _strided_matvec_ok,
    priority=NATIVE - 5,  # after the 2-D weight path, before the cuBLAS one
    device=CUDA,
)
def cuda_mul_mat_strided(node: Tensor) -> Step:
    m, ncols = node.ne[0], node.ne[1]
    return _strided_step(node, node, (m, m * ncols))


def _strided_step(node: Tensor, out: Tensor, dst_strides: tuple[int, int]) -> Step:
    """The strided matvec of `node`, its (column, channel) results written to `out` with
    `dst_strides` floats apart."""
    w_t, y_t = _need(node, 2)
    be, launch = _backend(node), _launch_module()
    k, m, ncols, channels = w_t.ne[0], w_t.ne[1], y_t.ne[1], y_t.ne[2]
    w, y, dst = _raw(w_t), _view(y_t), _raw(out)
    strides = (w_t.nb[1], w_t.nb[2], y_t.nb[1] // 4, y_t.nb[2] // 4, *dst_strides)
    wt, ratio = type_name(w_t.type).upper(), channels // w_t.ne[2]
    return lambda: launch.matvec_strided(be, wt, w, y, dst, k, m, ncols, channels, strides, ratio)


def _permuted(cont: Tensor, mm: Tensor) -> Tensor | None:
    """The view of `mm` with its dims 1 and 2 swapped that `cont` copies, if that is what it
    copies (attention's V·KQ, heads brought next to each other for the output projection)."""
    p = cont.src[0] if cont.src else None
    if p is None or p.op not in (Op.PERMUTE, Op.VIEW) or not p.src or p.src[0] is not mm:
        return None
    swapped = p.ne == (mm.ne[0], mm.ne[2], mm.ne[1], 1) and p.nb[:3] == (
        mm.nb[0],
        mm.nb[2],
        mm.nb[1],
    )
    return p if swapped and p.offset == mm.offset else None


def _strided_cont_ok(mm: Tensor, cont: Tensor) -> bool:
    return (
        _strided_matvec_ok(mm)
        and cont.op == Op.CONT
        and cont.type == F32
        and _contiguous(cont)
        and cont.nelements == mm.nelements
        and mm.ne[3] == 1
        and _permuted(cont, mm) is not None
    )


@fusion(Op.MUL_MAT, Op.CONT, _strided_cont_ok, device=CUDA)
def cuda_mul_mat_permuted(mm: Tensor, cont: Tensor) -> Step:
    """V·KQ of a decode step written straight in the order the CONT after its permutation
    wants (heads next to each other): one kernel, no copy."""
    m, channels = mm.ne[0], mm.ne[2]
    return _strided_step(mm, cont, (m * channels, m))  # column (token) stride, channel stride


def _batched_ok(node: Tensor) -> bool:
    s = _srcs(node, 2)
    if s is None or node.type != F32 or not _contiguous(node):
        return False
    a, b = s
    return (
        a.type in (F32, F16)
        and b.type in (F32, F16)
        and b.ne[0] == a.ne[0]
        and node.ne == (a.ne[1], b.ne[1], b.ne[2], b.ne[3])
        and a.ne[2] > 0
        and a.ne[3] > 0
        and b.ne[2] % a.ne[2] == 0
        and b.ne[3] % a.ne[3] == 0
    )


@kernel(
    Op.MUL_MAT,
    "f32|f16 x f32|f16 -> f32, any strides, ne2/ne3 broadcast (CuPy matmul: attention)",
    _batched_ok,
    priority=GENERIC,
    device=CUDA,
    capturable=False,
)
def cuda_mul_mat_batched(node: Tensor) -> Step:
    """The attention products (K*Q, V*KQ: strided cache views, heads broadcast for GQA) as one
    cuBLAS batched matmul; src0 matrix i02 serves src1 matrices i02*r2 .. i02*r2+r2-1."""
    a_t, b_t = _need(node, 2)
    be = _backend(node)
    a, b, dst = _view(a_t), _view(b_t), _view(node)
    r2, r3 = b_t.ne[2] // a_t.ne[2], b_t.ne[3] // a_t.ne[3]

    half = a_t.type == F16  # the CPU's f16 dot product rounds the other side to f16 first

    def run() -> None:
        cp = be.cp
        with be.device, be.stream:
            w = a.astype(cp.float32)
            if r2 > 1:
                w = cp.repeat(w, r2, axis=1)
            if r3 > 1:
                w = cp.repeat(w, r3, axis=0)
            x = b.astype(cp.float16).astype(cp.float32) if half else b.astype(cp.float32)
            dst[...] = cp.matmul(x, w.swapaxes(-1, -2))

    return run


def _mul_mat_id_ok(node: Tensor) -> bool:
    from rpcnet.compute.cuda import sources

    s = _srcs(node, 3)
    if s is None or node.type != F32 or not _contiguous(node):
        return False
    w, y, ids = s
    wt = _weight_type(w)
    k = w.ne[0]
    return (
        wt is not None
        and y.type == F32
        and ids.type == I32
        and _contiguous(w)
        and _contiguous(y)
        and ids.nb[0] == 4
        and ids.nb[1] % 4 == 0  # rows may be apart: top-k ids are a view of argsort's rows
        and w.ne[3] == y.ne[3] == ids.ne[2] == ids.ne[3] == 1
        and y.ne[0] == k
        and ids.ne[1] == y.ne[2]
        and node.ne == (w.ne[1], ids.ne[0], y.ne[2], 1)
        and (wt in sources.FLOAT_TYPES or k % 32 == 0)
        and w.offset % sources.WEIGHT_ALIGN[wt] == 0
        and _row_bytes(w) % sources.WEIGHT_ALIGN[wt] == 0
    )


@kernel(Op.MUL_MAT_ID, "all 16 weight types x f32, i32 ids -> f32", _mul_mat_id_ok, device=CUDA)
def cuda_mul_mat_id(node: Tensor) -> Step:
    from rpcnet.compute.cuda import sources

    w_t, y_t, ids_t = _need(node, 3)
    be, launch, wt = _backend(node), _launch_module(), _weight_type(w_t)
    assert wt is not None
    k, m = w_t.ne[0], w_t.ne[1]
    n_tokens, ne11, n_slots = y_t.ne[2], y_t.ne[1], ids_t.ne[0]
    w, y = _raw(w_t), _view(y_t, (n_tokens, ne11, k))
    assert ids_t.buffer is not None
    ids = be.view(ids_t.buffer.array, ids_t.offset, (n_tokens, n_slots), (ids_t.nb[1], 4), "int32")
    dst, ids_tok = _view(node, (n_tokens, n_slots, m)), ids_t.nb[1] // 4
    yq = None
    if wt not in sources.FLOAT_TYPES:
        yq = _device_scratch(be, "q8_1", launch.q8_1_bytes(k, n_tokens * ne11))
        registry.plan_state().shared[_Q8_1_NOTE] = None  # the q8_1 scratch now holds this input
    return lambda: launch.matvec_id(be, wt, w, y, ids, dst, k, m, yq, ids_tok)


# ---------------------------------------------------------------------------------- attention


def _soft_max_ok(node: Tensor) -> bool:
    s = _srcs(node, 1)
    if s is None or node.type != F32 or s[0].type != F32 or s[0].ne != node.ne:
        return False
    x = s[0]
    mask = node.src[1] if len(node.src) > 1 else None
    sinks = node.src[2] if len(node.src) > 2 else None
    n, rows, heads = x.ne[0], x.ne[1], x.ne[2]
    if x.ne[3] != 1 or not (_contiguous(x) and _contiguous(node)) or node.f32(1) != 0.0:
        return False
    if mask is not None and not (
        mask.buffer is not None
        and mask.type in (F32, F16)
        and mask.ne[0] == n
        and mask.ne[1] >= rows
        and mask.ne[2] == mask.ne[3] == 1
        and _contiguous(mask)
    ):
        return False
    return sinks is None or (
        sinks.buffer is not None and sinks.type == F32 and sinks.ne[0] == heads
    )


@kernel(
    Op.SOFT_MAX, "f32 [n, rows, heads], f32|f16 mask, sinks (no ALiBi)", _soft_max_ok, device=CUDA
)
def cuda_soft_max(node: Tensor) -> Step:
    x_t = node.src[0]
    assert x_t is not None
    mask_t = node.src[1] if len(node.src) > 1 else None
    sinks_t = node.src[2] if len(node.src) > 2 else None
    be, launch = _backend(node), _launch_module()
    shape = (node.ne[2], node.ne[1], node.ne[0])
    x, dst, scale = _view(x_t, shape), _view(node, shape), node.f32(0)
    mask = None if mask_t is None else _view(mask_t, (mask_t.ne[1], mask_t.ne[0]))
    sinks = None if sinks_t is None else _view(sinks_t, (sinks_t.ne[0],))
    return lambda: launch.soft_max(be, x, dst, scale, mask, sinks)


_ROPE_NORMAL, _ROPE_NEOX = 0, 2


def _rope_ok(node: Tensor) -> bool:
    s = _srcs(node, 2)
    if s is None or node.type != F32:
        return False
    x, pos = s
    freq = node.src[2] if len(node.src) > 2 else None
    p = RopeParams(node)
    return (
        x.type == F32
        and x.ne == node.ne
        and x.ne[3] == 1
        and _contiguous(x)
        and _contiguous(node)
        and pos.type == I32
        and pos.ne[0] == x.ne[2]
        and p.mode in (_ROPE_NORMAL, _ROPE_NEOX)
        and p.n_offs == 0
        and 0 < p.n_dims <= x.ne[0]  # the pairs past n_dims are copied
        and p.n_dims % 2 == 0
        and x.ne[0] % 2 == 0
        and (
            freq is None or (freq.type == F32 and _contiguous(freq) and freq.ne[0] >= p.n_dims // 2)
        )
    )


@kernel(
    Op.ROPE, "f32 NORMAL/NEOX, YaRN, frequency factors, partial rotation", _rope_ok, device=CUDA
)
def cuda_rope(node: Tensor) -> Step:
    x_t, pos_t = _need(node, 2)
    freq_t = node.src[2] if len(node.src) > 2 else None
    be, launch = _backend(node), _launch_module()
    shape = (node.ne[2], node.ne[1], node.ne[0])
    x, dst, pos = _view(x_t, shape), _view(node, shape), _view(pos_t, (pos_t.ne[0],))
    ff = None if freq_t is None else _view(freq_t, (freq_t.ne[0],))
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
    s = _srcs(node, 2)
    if s is None or node.i32(0) not in _GLU_IDS or node.i32(1) != 0:
        return False
    a, b = s
    return all(t.type == F32 and t.ne == node.ne and _contiguous(t) for t in (a, b, node))


@kernel(Op.GLU, "f32 fused (two sources): REGLU, GEGLU*, SWIGLU, SWIGLU_OAI", _glu_ok, device=CUDA)
def cuda_glu(node: Tensor) -> Step:
    a_t, b_t = _need(node, 2)
    be, launch = _backend(node), _launch_module()
    shape = (_rows(node), node.ne[0])
    a, b, dst = _view(a_t, shape), _view(b_t, shape), _view(node, shape)
    op = _GLU_IDS[Glu(node.i32(0))]
    alpha, limit = (node.f32(2), node.f32(3)) if node.i32(0) == Glu.SWIGLU_OAI else (1.702, 7.0)
    return lambda: launch.glu(be, a, b, dst, op, alpha, limit)


# ---------------------------------------------------------------------------------- xp kernels
# Small ops of the MoE router and of encoders, written against the backend's array module
# (`be.cp`: CuPy on a GPU; NumPy in the host tests, which compare them with the CPU kernels).
# Those that write through `out=` views only allocate nothing while they run; the others
# (NORM, SUM_ROWS, ARGSORT, the 3-D GET_ROWS) are registered uncapturable.

XP = -10  # below the CUDA C kernels of the same op


def _f32_unary_ok(node: Tensor) -> bool:
    s = _srcs(node, 1)
    return s is not None and s[0].type == F32 and node.type == F32


@kernel(
    Op.NORM,
    "f32 (xp)",
    lambda n: _f32_unary_ok(n) and n.src[0].ne == n.ne,  # type: ignore[union-attr]
    device=CUDA,
    capturable=False,  # the mean and variance are CuPy temporaries
)
def cuda_norm(node: Tensor) -> Step:
    (src,) = _need(node, 1)
    be = _backend(node)
    x, dst, eps = _view(src), _view(node), node.f32(0)

    def run() -> None:
        xp = be.cp
        with be.device, be.stream:
            d = x - x.mean(axis=-1, keepdims=True, dtype=xp.float32)
            var = (d * d).mean(axis=-1, keepdims=True, dtype=xp.float32)
            xp.multiply(d, 1.0 / xp.sqrt(var + xp.float32(eps)), out=dst)

    return run


def _sum_rows_ok(node: Tensor) -> bool:
    s = _srcs(node, 1)
    return _f32_unary_ok(node) and s is not None and node.ne == (1, *s[0].ne[1:])


@kernel(Op.SUM_ROWS, "f32 (xp)", _sum_rows_ok, device=CUDA, capturable=False)  # a reduction
def cuda_sum_rows(node: Tensor) -> Step:
    (src,) = _need(node, 1)
    be = _backend(node)
    x, dst = _view(src), _view(node)

    def run() -> None:
        with be.device, be.stream:
            x.sum(axis=-1, keepdims=True, out=dst)

    return run


@kernel(Op.CLAMP, "f32 (xp)", lambda n: _f32_unary_ok(n) and n.src[0].ne == n.ne, device=CUDA)  # type: ignore[union-attr]
def cuda_clamp(node: Tensor) -> Step:
    (src,) = _need(node, 1)
    be = _backend(node)
    x, dst, lo, hi = _view(src), _view(node), node.f32(0), node.f32(1)

    def run() -> None:
        xp = be.cp
        with be.device, be.stream:
            xp.minimum(x, xp.float32(hi), out=dst)
            xp.maximum(dst, xp.float32(lo), out=dst)

    return run


def _argsort_ok(node: Tensor) -> bool:
    s = _srcs(node, 1)
    return (
        s is not None
        and s[0].type == F32
        and node.type == I32
        and s[0].ne == node.ne
        and node.i32(0) in (0, 1)
    )


@kernel(
    Op.ARGSORT, "f32 -> i32 (xp; p0: 0 asc, 1 desc)", _argsort_ok, device=CUDA, capturable=False
)
def cuda_argsort(node: Tensor) -> Step:
    (src,) = _need(node, 1)
    be = _backend(node)
    x, dst, desc = _view(src), _view(node), node.i32(0) == 1

    def run() -> None:
        xp = be.cp
        with be.device, be.stream:
            # stable, largest first for desc (ties keep index order, like the CPU kernel)
            order = xp.argsort(-x if desc else x, axis=-1, kind="stable")
            dst[...] = order.astype(xp.int32)

    return run


def _get_rows_f32_ok(node: Tensor) -> bool:
    s = _srcs(node, 2)
    if s is None or node.type != F32:
        return False
    src, ids = s
    return (
        src.type == F32
        and ids.type == I32
        and src.ne[2] == ids.ne[1]
        and src.ne[3] == ids.ne[2]
        and ids.ne[3] == 1
        and node.ne == (src.ne[0], ids.ne[0], ids.ne[1], ids.ne[2])
    )


@kernel(
    Op.GET_ROWS,
    "f32 x i32 ids, 3-D batches (xp: the MoE weights)",
    _get_rows_f32_ok,
    priority=XP,
    device=CUDA,
    capturable=False,
)
def cuda_get_rows_batched(node: Tensor) -> Step:
    src, ids = _need(node, 2)
    be = _backend(node)
    x, idx, dst = _view(src), _view(ids), _view(node)

    def run() -> None:
        xp = be.cp
        with be.device, be.stream:
            rows = idx[0].astype(xp.int64)[..., None]  # (ne12, ne11, n, 1)
            dst[...] = xp.take_along_axis(x, rows, axis=2)  # (ne12, ne11, n, ne0)

    return run


def _pad_ok(node: Tensor) -> bool:
    s = _srcs(node, 1)
    if s is None or s[0].type != node.type or node.type not in (F32, F16) or node.i32(8):
        return False
    a = s[0]
    pads = [node.i32(i) for i in range(8)]
    return all(
        pads[2 * d] >= 0
        and pads[2 * d + 1] >= 0
        and a.ne[d] > 0
        and node.ne[d] == a.ne[d] + pads[2 * d] + pads[2 * d + 1]
        for d in range(4)
    )


@kernel(Op.PAD, "f32|f16 zero padding (xp; p0..p7 lp/rp per dim)", _pad_ok, device=CUDA)
def cuda_pad(node: Tensor) -> Step:
    (src,) = _need(node, 1)
    be = _backend(node)
    a, dst = _view(src), _view(node)
    inner = tuple(slice(node.i32(2 * d), node.i32(2 * d) + src.ne[d]) for d in (3, 2, 1, 0))

    def run() -> None:
        with be.device, be.stream:
            dst.fill(0)
            dst[inner] = a

    return run


def _fa_srcs(node: Tensor) -> tuple[Tensor | None, ...]:
    return (tuple(node.src) + (None,) * 5)[:5]


def _fa_operands(
    node: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None] | None:
    """(q, k, v, mask, sinks) of an f32 FLASH_ATTN_EXT whose operands all live in buffers."""
    q, k, v, mask, sinks = _fa_srcs(node)
    if q is None or k is None or v is None or node.type != F32 or q.type != F32:
        return None
    if any(t is not None and t.buffer is None for t in (q, k, v, mask, sinks)):
        return None
    return q, k, v, mask, sinks


def _fa_ok(node: Tensor) -> bool:
    parts = _fa_operands(node)
    if parts is None:
        return False
    q, k, v, mask, sinks = parts
    dk, n_q, n_head, n3 = q.ne
    n_kv = k.ne[1]
    return (
        k.type in (F32, F16)
        and v.type in (F32, F16)
        and n3 == k.ne[3] == v.ne[3] == 1
        and k.ne[0] == dk
        and v.ne[1] == n_kv
        and node.ne == (v.ne[0], n_head, n_q, 1)
        and 0 < k.ne[2] == v.ne[2]
        and n_head % k.ne[2] == 0
        and _contiguous(node)
        and node.f32(1) == 0.0  # no ALiBi
        and (
            mask is None
            or (
                mask.type in (F16, F32)
                and mask.ne[0] >= n_kv
                and mask.ne[1] >= n_q
                and mask.ne[2] == mask.ne[3] == 1
            )
        )
        and (sinks is None or (sinks.type == F32 and _contiguous(sinks) and sinks.ne[0] >= n_head))
    )


_FA_KV = {F16: "F16", GgmlType.Q8_0: "Q8_0"}
FA_DECODE_MAX_Q = 32  # query rows per head for the CUDA C kernel (one block each)
FA_MAX_HEAD = 512  # 32 lanes x RPC_FA_PER_LANE in flash_attn.cu


def _fa_decode_ok(node: Tensor) -> bool:
    """The CUDA C decode kernel: f16 or q8_0 K/V views as the cache lays them out, f16 mask."""
    parts = _fa_operands(node)
    if parts is None:
        return False
    q, k, v, mask, sinks = parts
    d, n_q, n_head, batches = q.ne
    return (
        k.type in _FA_KV
        and v.type in _FA_KV
        and q.nb[0] == 4
        and all(q.nb[i] % 4 == 0 for i in (1, 2, 3))
        and k.nb[0] == _native.type_info(k.type)[2]  # blocks (or halves) contiguous along D
        and v.nb[0] == _native.type_info(v.type)[2]
        and d % _native.type_info(k.type)[1] == 0
        and v.ne[0] % _native.type_info(v.type)[1] == 0
        and 1 <= n_q <= FA_DECODE_MAX_Q
        and d <= FA_MAX_HEAD
        and v.ne[0] <= FA_MAX_HEAD
        and k.ne[0] == d
        and v.ne[1] == k.ne[1]
        and 0 < k.ne[2] == v.ne[2]
        and n_head % k.ne[2] == 0
        and k.ne[3] == v.ne[3] == batches
        and batches <= 65535
        and node.ne == (v.ne[0], n_head, n_q, batches)
        and _contiguous(node)
        and (
            mask is None
            or (
                mask.type == F16
                and mask.nb[0] == 2
                and all(mask.nb[i] % 2 == 0 for i in (1, 2, 3))
                and mask.ne[0] >= k.ne[1]
                and mask.ne[1] >= n_q
                and mask.ne[2] > 0
                and mask.ne[3] > 0
            )
        )
        and (sinks is None or (sinks.type == F32 and _contiguous(sinks) and sinks.ne[0] >= n_head))
    )


@kernel(
    Op.FLASH_ATTN_EXT,
    "f32 q x f16|q8_0 k, v views, n_q<=8 (+f16 mask, ALiBi, softcap, sinks, GQA; CUDA C)",
    _fa_decode_ok,
    priority=NATIVE,
    device=CUDA,
)
def cuda_flash_attn_decode(node: Tensor) -> Step:
    q_t, k_t, v_t, mask_t, sinks_t = _fa_srcs(node)
    assert q_t is not None and k_t is not None and v_t is not None
    be, launch = _backend(node), _launch_module()
    d, n_q, n_head, batches = q_t.ne
    kv_types = (_FA_KV[GgmlType(k_t.type)], _FA_KV[GgmlType(v_t.type)])
    ptrs = (
        _view(q_t),
        _raw(k_t),
        _raw(v_t),
        None if mask_t is None else _raw(mask_t),
        None if sinks_t is None else _view(sinks_t),
        _view(node),
    )
    dims = (d, v_t.ne[0], n_q, k_t.ne[1], n_head, k_t.ne[2], batches)
    strides = (
        *(q_t.nb[i] // 4 for i in (1, 2, 3)),
        *(k_t.nb[i] for i in (1, 2, 3)),
        *(v_t.nb[i] for i in (1, 2, 3)),
        *((0, 0, 0) if mask_t is None else (mask_t.nb[i] // 2 for i in (1, 2, 3))),
    )
    bcast = (1, 1) if mask_t is None else (mask_t.ne[2], mask_t.ne[3])
    scale, max_bias, softcap = node.f32(0), node.f32(1), node.f32(2)
    return lambda: launch.flash_attn_views(
        be, kv_types, ptrs, dims, strides, bcast, scale, max_bias, softcap
    )


@kernel(
    Op.FLASH_ATTN_EXT,
    "f32 q x f32/f16 k, v (+mask, softcap, sinks, GQA; xp: batched matmuls)",
    _fa_ok,
    priority=XP,
    device=CUDA,
    capturable=False,
)
def cuda_flash_attn_xp(node: Tensor) -> Step:
    """softmax(scale·Q·Kᵀ (softcapped) + mask)·V with the array module, on the cache's own
    strided views (no contiguous K/V needed): three batched products, f32 accumulation."""
    q_t, k_t, v_t, mask_t, sinks_t = _fa_srcs(node)
    assert q_t is not None and k_t is not None and v_t is not None
    be = _backend(node)
    dk, n_q, n_head, _ = q_t.ne
    n_kv = k_t.ne[1]
    scale, softcap = node.f32(0), node.f32(2)
    if softcap != 0:
        scale /= softcap
    q, k, v = _view(q_t)[0], _view(k_t)[0], _view(v_t)[0]  # (heads, rows, d)
    mask = None if mask_t is None else _view(mask_t)[0, 0, :n_q, :n_kv]
    sinks = None if sinks_t is None else _view(sinks_t, (sinks_t.ne[0],))[:n_head]
    out = _view(node)[0]  # (n_q, n_head, dv)
    rep = n_head // k_t.ne[2]
    half_k = k_t.type == F16

    def run() -> None:
        xp = be.cp
        f32 = xp.float32
        quiet = getattr(xp, "errstate", None)
        with be.device, be.stream, quiet(all="ignore") if quiet else contextlib.nullcontext():
            kf, vf = k.astype(f32), v.astype(f32)
            if rep > 1:
                kf, vf = xp.repeat(kf, rep, axis=0), xp.repeat(vf, rep, axis=0)
            # f16 K: Q rounded to f16 first, as ggml's CPU kernel converts it for its dot
            qf = q.astype(xp.float16).astype(f32) if half_k else q.astype(f32)
            s = xp.matmul(qf, kf.swapaxes(-1, -2)) * f32(scale)
            if softcap != 0:
                s = xp.tanh(s) * f32(softcap)
            if mask is not None:
                s = s + mask.astype(f32)[None]
            mx = s.max(axis=-1, keepdims=True)
            sk = None if sinks is None else sinks.astype(f32).reshape(n_head, 1, 1)
            if sk is not None:
                mx = xp.maximum(mx, sk)
            mx = xp.where(mx == -xp.inf, f32(0), mx)  # fully masked rows give zeros
            p = xp.exp(s - mx)
            total = p.sum(axis=-1, keepdims=True)
            if sk is not None:
                total = total + xp.exp(sk - mx)
            res = xp.matmul(p, vf)
            res = xp.where(total == 0, f32(0), res / total)
            out[...] = res.transpose(1, 0, 2)

    return run
