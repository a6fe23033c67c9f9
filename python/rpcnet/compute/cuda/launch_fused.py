"""Host-side launchers of the fused decode kernels: a norm that also quantizes what it writes
(norm.cu), products that share an input in one launch, and the gate/up products with the GLU
after them (matvec_group.cu). Conventions as in launch.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rpcnet.compute.cuda import sources
from rpcnet.compute.cuda.device import CudaBackend
from rpcnet.compute.cuda.launch import (
    MV_MAXCOLS,
    MV_WARPS,
    NULL,
    Q8_1_BYTES,
    _activations,
    _aligned_row_bytes,
    _at,
    _cdiv,
    _launch,
    f32,
    i32,
    i64,
    split_rows,
)

#: products one group launch takes (attention's Q, K and V)
GROUP_MAX = 3


@dataclass(frozen=True)
class RopeArgs:
    """RoPE of whole heads (n_dims == head_dim), NORMAL (0) or NEOX (2), as launch.rope takes
    it: positions (int32, one per column), YaRN, frequency factors (f32 [head_dim / 2])."""

    pos: Any
    head_dim: int
    mode: int
    freq_base: float
    freq_scale: float = 1.0
    ext_factor: float = 0.0
    mscale: float = 1.0
    corr: tuple[float, float] = (0.0, 0.0)
    freq_factors: Any | None = None


@dataclass(frozen=True)
class RowStore:
    """A SET_ROWS done by the product that makes its source: value L (column * m + row) of the
    product is element L % s0 of source row L // s0, written to row ids[L // s0] of `dst`
    (raw bytes of `rows` rows, `row_bytes` apart) as `dtype` (F32, F16 or BF16)."""

    dst: Any
    ids: Any
    dtype: str
    s0: int
    row_bytes: int
    rows: int

    def args(self) -> tuple:
        dtype = {"F32": 0, "F16": 1, "BF16": 2}[self.dtype]
        ids_i64 = int(self.ids.dtype.itemsize == 8)
        return (
            self.dst,
            self.ids,
            i32(ids_i64),
            i32(dtype),
            i64(self.s0),
            i64(self.row_bytes),
            i64(self.rows),
        )


_NO_STORE = (NULL, NULL, i32(0), i32(0), i64(1), i64(0), i64(0))


def rms_norm_mul_q8(
    be: CudaBackend, x: Any, dst: Any, eps: float, weight: Any, q: Any, block: int
) -> None:
    """launch.rms_norm with its weight, each row also quantized into `q` (q8_1 blocks; q8_K
    held in them when `block` is 256): what quantize_q8_1 of dst would write."""
    rows, n = x.shape
    if block not in (32, 256) or n % block:
        raise ValueError(f"a norm quantizes rows of a multiple of {block}, not {n}")
    strides = (i64(n), i64(n * rows), i64(n * rows))
    common = (i32(n), i32(rows), i32(1), *strides, *strides)
    wargs = (i32(n), i32(1), i32(1), i32(1), i64(n), i64(n), i64(n))
    fn = be.kernels.function("norm", "rpc_rms_norm_mul_q8_f32")
    args = (x, weight, dst, *common, *wargs, f32(eps), q, i32(block == 256))
    _launch(be, fn, (rows,), (256,), args)


def _group_kernel(type_name: str, glu: bool, split: bool) -> str:
    kind = "glu" if glu else "group"
    return f"rpc_mv_{kind}{'_split' if split else ''}_{sources.WEIGHT_TYPES[type_name]}"


def matvec_group(
    be: CudaBackend,
    type_name: str,
    weights: Sequence[Any],
    y: Any,
    dsts: Sequence[Any],
    k: int,
    rows: Sequence[int],
    ncols: int,
    yq: Any | None = None,
    quantized: bool = False,
) -> None:
    """dsts[i][c, :rows[i]] = weights[i] @ y[c, :k] for up to GROUP_MAX weights of one type and
    row length, c < ncols (<= MV_MAXCOLS), in one launch; y contiguous [ncols, k] f32."""
    n = len(weights)
    if not 1 <= n <= GROUP_MAX or len(dsts) != n or len(rows) != n:
        raise ValueError(f"a group takes 1..{GROUP_MAX} products")
    if not 1 <= ncols <= MV_MAXCOLS:
        raise ValueError(f"a group takes 1..{MV_MAXCOLS} columns, not {ncols}")
    rb = _aligned_row_bytes(type_name, weights[0], k)
    for w in weights[1:]:
        _aligned_row_bytes(type_name, w, k)
    src, y_col, _ = _activations(be, type_name, y, k, ncols, yq, quantized)
    split = split_rows(type_name, k)
    per_block = 1 if split else MV_WARPS
    ws = [*weights, *[NULL] * (GROUP_MAX - n)]
    ds = [*dsts, *[NULL] * (GROUP_MAX - n)]
    ms = [*rows, *[0] * (GROUP_MAX - n)]
    grid = (sum(_cdiv(m, per_block) for m in ms),)
    fn = be.kernels.function("matvec_group", _group_kernel(type_name, False, split))
    args = (*ws, *ds, *(i32(m) for m in ms), src, i32(k), i32(ncols), i64(rb), i64(y_col))
    _launch(be, fn, grid, (32, MV_WARPS), args)


def matvec_glu(
    be: CudaBackend,
    type_name: str,
    gate: Any,
    up: Any,
    y: Any,
    dst: Any,
    k: int,
    m: int,
    ncols: int,
    op: int,
    alpha: float,
    limit: float,
    yq: Any | None = None,
    quantized: bool = False,
    q8: tuple[Any, int, Any] | None = None,
) -> None:
    """dst[c, :m] = glu_op(gate @ y[c], up @ y[c]) for c < ncols (<= 32, launches of up to
    MV_MAXCOLS columns): the products are never written. `q8` (blocks, block size 32 or 256,
    zeroed uint32 counters, one per group of each column): dst also quantized there."""
    if q8 is not None and (q8[1] not in (32, 256) or m % q8[1]):
        raise ValueError(f"{m} rows do not quantize in blocks of {q8[1]}")
    if not 1 <= ncols <= 4 * MV_MAXCOLS:
        raise ValueError(f"a GLU product takes 1..{4 * MV_MAXCOLS} columns, not {ncols}")
    rb = _aligned_row_bytes(type_name, gate, k)
    _aligned_row_bytes(type_name, up, k)
    src, y_col, col_bytes = _activations(be, type_name, y, k, ncols, yq, quantized)
    split = split_rows(type_name, k)
    grid = (m if split else _cdiv(m, MV_WARPS),)
    fn = be.kernels.function("matvec_group", _group_kernel(type_name, True, split))
    for c0 in range(0, ncols, MV_MAXCOLS):  # each launch reads the weights once
        nc = min(MV_MAXCOLS, ncols - c0)
        args = (gate, up, _at(dst, 4 * m * c0), i32(m), _at(src, col_bytes * c0), i32(k))
        tail = (i32(nc), i64(rb), i64(y_col), i32(op), f32(alpha), f32(limit))
        quant = (NULL, i32(0), NULL)
        if q8 is not None:
            blocks, block, counters = q8
            groups = m // block * c0  # the counters of the columns before this launch's
            quant = (_at(blocks, m // 32 * Q8_1_BYTES * c0), i32(block), _at(counters, 4 * groups))
        _launch(be, fn, grid, (32, MV_WARPS), (*args, *tail, *quant))


def matvec_qkv_rope(
    be: CudaBackend,
    type_name: str,
    weights: Sequence[Any],
    y: Any,
    dsts: Sequence[Any],
    k: int,
    rows: Sequence[int],
    ncols: int,
    rope: RopeArgs,
    yq: Any | None = None,
    quantized: bool = False,
    stores: tuple[RowStore | None, RowStore | None] = (None, None),
    v_type: str | None = None,
) -> None:
    """Attention's Q, K and V products (weights and dsts in that order) in one launch, Q and K
    written rotated by `rope` over whole heads (V as it is), c < ncols (<= MV_MAXCOLS); K and
    V go to their `stores` (the KV cache's rows) instead of their dsts where one is given."""
    if len(weights) != 3 or len(dsts) != 3 or len(rows) != 3:
        raise ValueError("the Q/K/V launch takes three products")
    if not 1 <= ncols <= MV_MAXCOLS:
        raise ValueError(f"the Q/K/V launch takes 1..{MV_MAXCOLS} columns, not {ncols}")
    mq, mk, mv = rows
    if rope.head_dim % 2 or mq % rope.head_dim or mk % rope.head_dim or mv % 2:
        raise ValueError(f"rows {tuple(rows)} are not whole heads of {rope.head_dim}")
    v_type = type_name if v_type is None else v_type
    if v_type != type_name and (type_name, v_type) not in sources.QKV_MIXES:
        raise ValueError(f"no Q/K/V launch for {type_name} Q/K with {v_type} V")
    rb = _aligned_row_bytes(type_name, weights[0], k)
    _aligned_row_bytes(type_name, weights[1], k)
    v_rb = _aligned_row_bytes(v_type, weights[2], k)
    src, y_col, _ = _activations(be, type_name, y, k, ncols, yq, quantized)
    split = split_rows(type_name, k)
    pairs = (mq + mk + mv) // 2
    grid = (pairs if split else _cdiv(pairs, MV_WARPS),)
    fn = be.kernels.function("matvec_group", sources.qkv_rope_kernel(type_name, v_type, split))
    ff = NULL if rope.freq_factors is None else rope.freq_factors
    args = (*weights, *dsts, i32(mq), i32(mk), i32(mv), src, i32(k), i32(ncols), i64(rb), i64(v_rb))
    theta_scale = float(np.float32(rope.freq_base) ** np.float32(-2.0 / rope.head_dim))
    freq = (theta_scale, rope.freq_scale, rope.ext_factor, rope.mscale, *rope.corr)
    tail = (rope.pos, ff, i32(rope.head_dim), i32(rope.mode), *(f32(v) for v in freq))
    kv = [_NO_STORE if st is None else st.args() for st in stores]
    _launch(be, fn, grid, (32, MV_WARPS), (*args, i64(y_col), *tail, *kv[0], *kv[1]))
