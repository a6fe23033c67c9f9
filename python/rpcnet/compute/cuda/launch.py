"""Host-side launchers of the CUDA kernels (src/*.cu): grid shapes and argument packing.

Arguments are packed as NumPy scalars of the exact C types the kernels declare (int ->
int32, long long -> int64, float -> float32); pointers are CuPy arrays, or `NULL` for absent
optional operands. All launches go to the backend's stream.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import numpy as np

from rpcnet.compute.cuda import sources
from rpcnet.compute.cuda.device import CudaBackend
from rpcnet.compute.cuda.kernel_launch import (  # noqa: F401 - the launchers' names for them
    MAX_BLOCK_THREADS,
    MAX_GRID_X,
    MAX_GRID_YZ,
    LaunchLimitError,
    check_launch,
    launch_count,
)
from rpcnet.compute.cuda.kernel_launch import launch as _launch

NULL = np.uint64(0)
MV_WARPS = 4  # RPC_MV_WARPS in matvec.cu
MV_MAXCOLS = 8  # RPC_MV_MAXCOLS
Q8_1_BYTES = 36

i32, i64, f32 = np.int32, np.int64, np.float32


def rows_grid(rows: int) -> int:
    """grid.y for kernels that walk rows with RPC_FOR_ROWS_Y (common.cuh)."""
    return max(1, min(rows, MAX_GRID_YZ))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def row_bytes(type_name: str, k: int) -> int:
    from rpcnet.compute import quant

    return quant.row_bytes(sources.TYPE_IDS[type_name], k)


def q8_1_bytes(k: int, ncols: int) -> int:
    return k // 32 * Q8_1_BYTES * ncols


def quantize_q8_1(
    be: CudaBackend, x: Any, out: Any, k: int, ncols: int, x_col: int, as_q8_k: bool = False
) -> None:
    """Activation columns to q8_1 blocks for the MMVQ kernels; `as_q8_k`: holding ggml's q8_K
    quantization (blocks of 256), as the CPU quantizes activations for K-quant weights."""
    if as_q8_k:
        fn = be.kernels.function("quantize", "rpc_quantize_q8_1_as_q8_k")
        _launch(be, fn, (k // 256, ncols), (32, 8), (x, out, i32(k), i64(x_col)))
        return
    fn = be.kernels.function("quantize", "rpc_quantize_q8_1")
    _launch(be, fn, (_cdiv(k // 32, 8), ncols), (32, 8), (x, out, i32(k), i64(x_col)))


#: work items per row (32-groups, or 16-byte vectors of float weights) from which a block's
#: warps split each row instead of a warp taking a whole row
SPLIT_MIN_ITEMS = 64


def split_rows(type_name: str, k: int) -> bool:
    """Whether the matvec of K-element rows of `type_name` uses the row-splitting kernels."""
    if type_name in sources.FLOAT_TYPES:
        return row_bytes(type_name, k) // 16 >= SPLIT_MIN_ITEMS
    return k // 32 >= SPLIT_MIN_ITEMS


def _aligned_row_bytes(type_name: str, w: Any, k: int) -> int:
    """Bytes per weight row, after checking the rows start as aligned as the kernels load them."""
    rb = row_bytes(type_name, k)
    align = sources.WEIGHT_ALIGN[type_name]
    if int(w.data.ptr) % align or rb % align:
        raise ValueError(f"{type_name} weights must start {align}-byte aligned for matvec")
    return rb


def _matvec_grid(split: bool, m: int, channels: int) -> tuple[int, int]:
    return (m, channels) if split else (_cdiv(m, MV_WARPS), channels)


#: activation columns one matvec call takes: up to MV_MAXCOLS per launch, in chunks past that
MV_CHUNKED_MAX = 32


def _nbytes(a: Any) -> int:
    return int(a.size) * int(a.dtype.itemsize)


def _at(a: Any, byte_offset: int) -> Any:
    """A device pointer `byte_offset` bytes into array `a`, as a kernel argument."""
    return a if byte_offset == 0 else np.uint64(int(a.data.ptr) + byte_offset)


def _activations(
    be: CudaBackend, type_name: str, y: Any, k: int, ncols: int, yq: Any | None, quantized: bool
) -> tuple[Any, int, int]:
    """The products' input, a column's stride in its elements and in bytes: f32 for float
    weights (a float each), else q8_1 blocks in `yq` (a byte each), quantized here unless
    `quantized` says they are there already."""
    if type_name in sources.FLOAT_TYPES:
        return y, k, 4 * k
    assert yq is not None, "quantized products need a q8_1 scratch"
    if not quantized:
        quantize_q8_1(be, y, yq, k, ncols, k, activation_block(type_name) == 256)
    col_bytes = k // 32 * Q8_1_BYTES
    return yq, col_bytes, col_bytes


def matvec(
    be: CudaBackend,
    type_name: str,
    w: Any,
    y: Any,
    dst: Any,
    k: int,
    m: int,
    ncols: int,
    yq_scratch: Any | None = None,
    split: bool | None = None,
    quantized: bool = False,
    add: Any | None = None,
) -> None:
    """dst[c, :m] = W[m, k] @ y[c, :k] for c < ncols (<= MV_CHUNKED_MAX; launches of up to
    MV_MAXCOLS columns); contiguous y and dst, one channel.

    Quantized W: y is quantized to q8_1 into `yq_scratch` (q8_1_bytes(k, ncols) bytes) first.
    `split`: the row-splitting kernel or not (None: by `split_rows`); `quantized`: the scratch
    already holds y's q8_1 blocks (an earlier product of the plan quantized the same input);
    `add` ([ncols, m] f32, may be dst): dst = W y + add (a residual ADD fused in)."""
    if not 1 <= ncols <= MV_CHUNKED_MAX:
        raise ValueError(f"matvec takes 1..{MV_CHUNKED_MAX} columns, not {ncols}")
    rb = _aligned_row_bytes(type_name, w, k)
    split = split_rows(type_name, k) if split is None else split
    grid, block = _matvec_grid(split, m, 1), (32, MV_WARPS)
    fn = be.kernels.function("matvec", sources.matvec_kernel(type_name, split))
    tail = (i64(rb), i64(rb * m))
    src, y_col, col_bytes = _activations(be, type_name, y, k, ncols, yq_scratch, quantized)
    for c0 in range(0, ncols, MV_MAXCOLS):  # each launch reads the weights once
        nc = min(MV_MAXCOLS, ncols - c0)
        out = (_at(dst, 4 * m * c0), NULL if add is None else _at(add, 4 * m * c0))
        args = (w, _at(src, col_bytes * c0), *out, i32(k), i32(m), i32(nc), *tail)
        _launch(
            be, fn, grid, block, (*args, i64(y_col), i64(y_col * nc), i64(m), i64(m * nc), i32(1))
        )


def matvec_strided(
    be: CudaBackend,
    type_name: str,
    w: Any,
    y: Any,
    dst: Any,
    k: int,
    m: int,
    ncols: int,
    channels: int,
    strides: tuple[int, int, int, int, int, int],
    ratio: int,
) -> None:
    """Float weights (F32/F16/BF16) in any row and channel layout: the attention products of a
    decode step on the cache's strided views. For channel c < `channels` and column j < ncols,
    dst[c, j, :m] = W[c // ratio] @ y[c, j, :k]. `strides`: weight row and channel in bytes,
    y column and channel in floats, dst column and channel in floats."""
    if type_name not in sources.FLOAT_TYPES or not 1 <= ncols <= MV_MAXCOLS:
        raise ValueError(f"strided matvec takes float weights and 1..{MV_MAXCOLS} columns")
    split = split_rows(type_name, k)
    fn = be.kernels.function("matvec", sources.matvec_kernel(type_name, split))
    args = (w, y, dst, NULL, i32(k), i32(m), i32(ncols), *(i64(s) for s in strides), i32(ratio))
    _launch(be, fn, _matvec_grid(split, m, channels), (32, MV_WARPS), args)


def matvec_id(
    be: CudaBackend,
    type_name: str,
    w: Any,
    y: Any,
    ids: Any,
    dst: Any,
    k: int,
    m: int,
    yq_scratch: Any | None = None,
    ids_tok: int | None = None,
) -> None:
    """MUL_MAT_ID decode: w [n_expert, m, k] in block form, y [n_tokens, ne11, k] f32, ids
    int32 [n_tokens, n_slots] (a token's ids `ids_tok` elements apart: default n_slots; ggml's
    top-k ids are a view of the argsort rows), dst [n_tokens, n_slots, m] f32
    = W[ids] @ y[slot % ne11]."""
    n_tokens, ne11 = int(y.shape[0]), int(y.shape[1])
    n_slots = int(ids.shape[1])
    rb = _aligned_row_bytes(type_name, w, k)
    fn = be.kernels.function("matvec", sources.matvec_id_kernel(type_name))
    yarg, y_col, _ = _activations(be, type_name, y, k, n_tokens * ne11, yq_scratch, False)
    y_tok = y_col * ne11
    args = (
        w,
        yarg,
        ids,
        dst,
        i32(k),
        i32(m),
        i64(rb),
        i64(rb * m),
        i32(ne11),
        i64(y_col),
        i64(y_tok),
        i64(1),
        i64(n_slots if ids_tok is None else ids_tok),
        i64(m),
        i64(m * n_slots),
        i32(_nbytes(w) // (rb * m)),  # experts an id may name
    )
    _launch(be, fn, (_cdiv(m, MV_WARPS), n_slots, n_tokens), (32, MV_WARPS), args)


def dequantize(
    be: CudaBackend, type_name: str, w: Any, out: Any, k: int, rows: int, out_type: str = "f16"
) -> None:
    fn = be.kernels.function("dequantize", sources.dequantize_kernel(type_name, out_type))
    _launch(
        be,
        fn,
        (_cdiv(k, 256), rows_grid(rows)),
        (256,),
        (w, out, i32(k), i64(row_bytes(type_name, k)), i64(rows)),
    )


@functools.cache
def activation_block(type_name: str) -> int:
    """Elements per block of the activation quantization ggml's CPU dot product uses with this
    weight type (1: none): the Rust kernel table's."""
    from rpcnet import _native

    block = _native.matmul_activation_block(sources.TYPE_IDS[type_name])
    if block is None:
        raise ValueError(f"no CPU dot product for {type_name}")
    return block


def round_activations(be: CudaBackend, y: Any, out: Any, k: int, rows: int, block: int) -> None:
    """y [rows, k] f32 -> out [rows, k] f16: the values ggml's CPU dot product multiplies after
    quantizing the activations in blocks of `block` (32: q8_0/q8_1, 256: q8_K)."""
    if block == 32:
        fn = be.kernels.function("quantize", "rpc_act_round_q8_32")
        grid, blk = (_cdiv(k // 32, 8), rows_grid(rows)), (32, 8)
    elif block == 256:
        fn = be.kernels.function("quantize", "rpc_act_round_q8_k")
        grid, blk = (k // 256, rows_grid(rows)), (32, 8)
    else:
        raise ValueError(f"no activation rounding in blocks of {block}")
    _launch(be, fn, grid, blk, (y, out, i32(k), i64(rows)))


# cuBLAS / CUDA enum values (stable across CUDA releases)
_CUDA_R_32F, _CUDA_R_16F = 0, 2
_CUBLAS_OP_N, _CUBLAS_OP_T = 0, 1
_CUBLAS_COMPUTE_32F = 68  # f32 accumulation; no TF32
_CUBLAS_GEMM_DEFAULT = -1
_ONE, _ZERO = np.ones(1, np.float32), np.zeros(1, np.float32)  # host alpha and beta


def _cublas(cp: Any) -> Any:
    """CuPy's cuBLAS binding (`cupy_backends.cuda.libs.cublas`; older CuPy: `cupy.cuda.cublas`),
    or None."""
    for name in ("cupy_backends.cuda.libs.cublas", f"{cp.__name__}.cuda.cublas"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return getattr(getattr(cp, "cuda", None), "cublas", None)


def _matmul_rows(
    be: CudaBackend, w: Any, w_type: int, y: Any, out: Any, n: int, k: int, m: int
) -> None:
    """gemm_rows through CuPy's matmul (its result in the operands' type, then f32)."""
    cp = be.cp
    dtype = cp.float16 if w_type == _CUDA_R_16F else cp.float32
    with be.device, be.stream:
        wv = w.view(dtype)[: m * k].reshape(m, k)
        yv = y.view(dtype)[: n * k].reshape(n, k)
        out[...] = cp.matmul(yv, wv.T).astype(cp.float32)


def gemm_rows(
    be: CudaBackend, w: Any, w_type: int, y: Any, y_type: int, out: Any, n: int, k: int, m: int
) -> None:
    """out [n, m] f32 = y [n, k] @ w [m, k]^T, row-major operands of CUDA type `w_type` and
    `y_type` (f16 or f32), accumulated in f32 and written in f32 (no rounding of the result to
    f16), on the backend's stream. Without a usable GemmEx binding: CuPy's matmul."""
    cp = be.cp
    cublas = _cublas(cp)
    if cublas is None or not hasattr(cublas, "gemmEx"):
        _matmul_rows(be, w, w_type, y, out, n, k, m)
        return
    with be.device, be.stream:  # gemmEx runs on the current stream
        handle = cp.cuda.device.get_cublas_handle()
        # Row-major out[n, m] is column-major out^T (m x n) = W (k x m col-major, transposed)
        # times y^T (k x n col-major).
        args = (
            handle,
            _CUBLAS_OP_T,
            _CUBLAS_OP_N,
            m,
            n,
            k,
            _ONE.ctypes.data,
            int(w.data.ptr),
            w_type,
            k,
            int(y.data.ptr),
            y_type,
            k,
            _ZERO.ctypes.data,
            int(out.data.ptr),
            _CUDA_R_32F,
            m,
            _CUBLAS_COMPUTE_32F,
            _CUBLAS_GEMM_DEFAULT,
        )
        try:
            cublas.gemmEx(*args)
        except TypeError:  # another binding signature: nothing reached the GPU
            _matmul_rows(be, w, w_type, y, out, n, k, m)


def prefill_scratch_bytes(type_name: str, k: int, m: int, n: int) -> tuple[int, int]:
    """(f16 weight copy, f16 activations) bytes `matmul_prefill` needs for this product."""
    if type_name == "F32":
        return 0, 0
    return (0 if type_name == "F16" else 2 * m * k), 2 * n * k


def matmul_prefill(
    be: CudaBackend,
    type_name: str,
    w: Any,
    y: Any,
    out: Any,
    k: int,
    m: int,
    scratch_w16: Any | None,
    scratch_y16: Any | None,
) -> None:
    """out [n, m] f32 = y [n, k] f32 @ W^T with cuBLAS, f32 accumulation and result: F32 W as
    it is (y in f32), F16 W as it is (y rounded to f16, as the CPU's f16 dot product does),
    other types through an f16 copy in `scratch_w16` with y rounded as ggml's CPU dot product
    quantizes it for that type (`scratch_y16`: n * k halves)."""
    cp = be.cp
    n = int(y.shape[0])
    if type_name == "F32":
        gemm_rows(be, w, _CUDA_R_32F, y, _CUDA_R_32F, out, n, k, m)
        return
    assert scratch_y16 is not None
    y16 = scratch_y16[: 2 * n * k].view(cp.float16).reshape(n, k)  # scratches are bytes
    block = activation_block(type_name)
    if block == 1:
        cpy(be, y, y16)
    else:
        round_activations(be, y, y16, k, n, block)
    if type_name == "F16":
        w16 = w
    else:
        assert scratch_w16 is not None
        dequantize(be, type_name, w, scratch_w16, k, m, "f16")
        w16 = scratch_w16
    gemm_rows(be, w16, _CUDA_R_16F, y16, _CUDA_R_16F, out, n, k, m)


def rms_norm(be: CudaBackend, x: Any, dst: Any, eps: float, weight: Any | None = None) -> None:
    """Contiguous [rows, n] f32; optional weight [n] fused as ggml's RMS_NORM + MUL."""
    rows, n = x.shape
    common = (
        i32(n),
        i32(rows),
        i32(1),
        i64(n),
        i64(n * rows),
        i64(n * rows),
        i64(n),
        i64(n * rows),
        i64(n * rows),
    )
    if weight is None:
        fn = be.kernels.function("norm", "rpc_rms_norm_f32")
        _launch(be, fn, (rows,), (256,), (x, dst, *common, f32(eps)))
    else:
        fn = be.kernels.function("norm", "rpc_rms_norm_mul_f32")
        wargs = (i32(n), i32(1), i32(1), i32(1), i64(n), i64(n), i64(n))
        _launch(be, fn, (rows,), (256,), (x, weight, dst, *common, *wargs, f32(eps)))


def rope_neox_or_normal(
    be: CudaBackend, x: Any, pos: Any, dst: Any, n_dims: int, mode: int, freq_base: float
) -> None:
    """x [tokens, heads, d] f32 contiguous, plain RoPE (no YaRN, no freq factors)."""
    rope(be, x, pos, dst, n_dims, mode, freq_base)


def rope(
    be: CudaBackend,
    x: Any,
    pos: Any,
    dst: Any,
    n_dims: int,
    mode: int,
    freq_base: float,
    freq_scale: float = 1.0,
    ext_factor: float = 0.0,
    mscale: float = 1.0,
    corr: tuple[float, float] = (0.0, 0.0),
    freq_factors: Any | None = None,
) -> None:
    """x [tokens, heads, d] f32 contiguous, NORMAL or NEOX RoPE of the first `n_dims` (the rest
    copied), ggml's YaRN (`ext_factor`, `corr` dims, `mscale` = attn_factor with YaRN's
    correction) and per-pair frequency divisors (`freq_factors`, f32 [>= n_dims/2])."""
    tokens, heads, d = x.shape
    fn = be.kernels.function("rope", "rpc_rope_f32")
    theta_scale = float(np.float32(freq_base) ** np.float32(-2.0 / n_dims))
    strides = (i64(d), i64(d * heads), i64(d * heads * tokens))
    args = (
        x,
        pos,
        NULL if freq_factors is None else freq_factors,
        dst,
        i32(d),
        i32(heads),
        i32(tokens),
        *strides,
        *strides,
        i32(n_dims),
        i32(mode),
        i32(0),
        i32(0),
        i32(0),
        i32(0),
        f32(theta_scale),
        f32(freq_scale),
        f32(ext_factor),
        f32(mscale),
        f32(corr[0]),
        f32(corr[1]),
        i64(heads * tokens),
    )
    _launch(be, fn, (_cdiv(d // 2, 256), rows_grid(heads * tokens)), (256,), args)


def glu(
    be: CudaBackend, a: Any, b: Any, dst: Any, op: int, alpha: float = 1.702, limit: float = 7.0
) -> None:
    rows, n = a.shape
    fn = be.kernels.function("glu", "rpc_glu_f32")
    s = (i64(n), i64(n * rows), i64(n * rows))
    args = (a, b, dst, i32(n), i32(rows), i32(1), *s, *s, *s, i32(op), f32(alpha), f32(limit))
    _launch(be, fn, (_cdiv(n, 256), rows_grid(rows)), (256,), (*args, i64(rows)))


def get_rows(be: CudaBackend, type_name: str, src: Any, ids: Any, dst: Any, k: int) -> None:
    """src: rows of k elements of `type_name`; ids int32 [n]; dst f32 [n, k]."""
    n = int(ids.size)
    rb = row_bytes(type_name, k)
    fn = be.kernels.function("rows", f"rpc_get_rows_{sources.WEIGHT_TYPES[type_name]}")
    args = (
        src,
        ids,
        dst,
        i32(k),
        i32(1),
        i64(rb),
        i64(0),
        i64(0),
        i64(4),
        i64(0),
        i64(0),
        i64(4 * k),
        i64(0),
        i64(0),
        i64(n),
        i64(_nbytes(src) // rb),  # rows an id may name
    )
    _launch(be, fn, (_cdiv(k, 256), rows_grid(n), 1), (256,), args)


BINARY_OPS = {"ADD": 0, "SUB": 1, "MUL": 2, "DIV": 3}
#: rpcnet ids of the standalone unary-like ops (elementwise.cu); UNARY uses ggml_unary_op ids
UNARY_EXTRA = {"SQR": 100, "SQRT": 101, "SIN": 102, "COS": 103, "LOG": 104, "SCALE": 105}


def _shape4(a: Any) -> tuple[list[int], list[int]]:
    """ggml (ne, nb) of a C-ordered array: ne0 is the last axis."""
    shape = list(a.shape)[::-1] + [1] * (4 - len(a.shape))
    strides = list(a.strides)[::-1] + [0] * (4 - len(a.shape))
    return shape, strides


def _elementwise_grid(n: int) -> tuple[int]:
    return (max(1, min(_cdiv(n, 256), 65535)),)


def binary(be: CudaBackend, op: str, a: Any, b: Any, dst: Any) -> None:
    """dst = a (op) b, f32, b broadcast by repetition like ggml (its extents divide dst's)."""
    ne, anb = _shape4(a)
    bne, bnb = _shape4(b)
    _, dnb = _shape4(dst)
    fn = be.kernels.function("elementwise", "rpc_binary_f32")
    args = (
        i32(BINARY_OPS[op]),
        a,
        b,
        dst,
        *map(i64, ne),
        *map(i64, anb),
        *map(i64, bne),
        *map(i64, bnb),
        *map(i64, dnb),
    )
    _launch(be, fn, _elementwise_grid(int(np.prod(ne))), (256,), args)


def unary(
    be: CudaBackend, op: int | str, src: Any, dst: Any, p0: float = 1.0, p1: float = 0.0
) -> None:
    """dst = f(src), f32; `op` a ggml_unary_op id or one of UNARY_EXTRA's names."""
    code = UNARY_EXTRA[op] if isinstance(op, str) else int(op)
    ne, snb = _shape4(src)
    _, dnb = _shape4(dst)
    fn = be.kernels.function("elementwise", "rpc_unary_f32")
    args = (i32(code), src, dst, *map(i64, ne), *map(i64, snb), *map(i64, dnb), f32(p0), f32(p1))
    _launch(be, fn, _elementwise_grid(int(np.prod(ne))), (256,), args)


def set_rows(be: CudaBackend, src: Any, ids: Any, dst: Any, dst_type: str) -> None:
    """dst rows ids[i] = src rows i: src f32 [n, k], ids int64 or int32 [n], dst [rows, k] of
    `dst_type` (F32, F16, BF16 or Q8_0) given as its raw bytes, rows contiguous."""
    n, k = int(src.shape[0]), int(src.shape[1])
    rb = row_bytes(dst_type, k)
    ids_i64 = ids.dtype.itemsize == 8
    suffix = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0"}[dst_type]
    fn = be.kernels.function("rows", f"rpc_set_rows_{suffix}")
    args = (
        src,
        ids,
        i32(ids_i64),
        dst,
        i32(k),
        i32(1),
        i32(1),
        i32(1),
        i64(4 * k),
        i64(0),
        i64(0),
        i64(ids.dtype.itemsize),
        i64(0),
        i64(0),
        i64(rb),
        i64(0),
        i64(0),
        i64(n),
        i64(_nbytes(dst) // rb),  # rows an id may name
    )
    if dst_type == "Q8_0":
        _launch(be, fn, (_cdiv(k // 32, 8), rows_grid(n), 1), (32, 8), args)
    else:
        _launch(be, fn, (_cdiv(k, 256), rows_grid(n), 1), (256,), args)


def cpy(be: CudaBackend, src: Any, dst: Any) -> None:
    """Element-wise copy/convert between f32, f16 and bf16 arrays of equal size, any strides
    (each side walked in its own logical order). CuPy has no bf16 dtype: pass a bf16 operand
    as (uint16 array, "bf16")."""
    (s, st), (d, dt) = (_typed(src), _typed(dst))
    sne, snb = _shape4(s)
    dne, dnb = _shape4(d)
    n = int(np.prod(sne))
    fn = be.kernels.function("cpy", f"rpc_cpy_{st}_{dt}")
    args = (s, d, i64(n), *map(i64, sne[:3]), *map(i64, snb), *map(i64, dne[:3]), *map(i64, dnb))
    _launch(be, fn, _elementwise_grid(n), (256,), args)


def _typed(a: Any) -> tuple[Any, str]:
    if isinstance(a, tuple):
        return a
    return a, {4: "f32", 2: "f16"}[a.dtype.itemsize]
