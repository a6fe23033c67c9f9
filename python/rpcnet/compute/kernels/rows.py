"""GET_ROWS (gather rows by I32 ids) and SET_ROWS (scatter converted rows into a destination).

The NumPy kernels take every loadable source and storable destination. SET_ROWS of f32 rows into
an f16 (or f32) KV cache and GET_ROWS of f32/f16 embeddings, once per layer per token, run
natively; f16 results are rounded to nearest even like ggml's conversion.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute import convert
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.kernels.copy import blocks_ok, encode
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import (
    float_rows,
    native_row,
    rows_contiguous,
    tensor_arg,
)
from rpcnet.compute.ops import Op
from rpcnet.compute.scratch import logical_f32
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import PLAIN_DTYPES, bf16_to_f32, plain_view, row_bytes_view
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily(
    "rows",
    cuda=("rpcnet.compute.cuda.kernels.rows", "rpcnet.compute.cuda.kernels.array_code"),
)


def _check_ids(ids: Any, limit: int, what: str) -> None:
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= limit):
        raise ComputeError(f"{what}: row id out of range [0, {limit})")


# --- GET_ROWS --------------------------------------------------------------------------------


def _get_rows_shapes(node: Tensor) -> tuple[Tensor, Tensor] | None:
    """(data, i32 ids) when GET_ROWS's shapes fit, whatever computes it."""
    a, b = node.src[0], node.src[1]
    if a is None or b is None or b.type != GgmlType.I32:
        return None
    fits = tuple(node.ne) == (a.ne[0], b.ne[0], b.ne[1], b.ne[2]) and (
        a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1
    )
    return (a, b) if fits else None


def _get_rows_supported(node: Tensor) -> bool:
    operands = _get_rows_shapes(node)
    if operands is None:
        return False
    a = operands[0]
    if a.type == node.type and a.type in PLAIN_DTYPES:
        return True
    return convert.can_load(a.type) and convert.can_store(node.type) and blocks_ok(a)


@FAMILY.kernel(
    Op.GET_ROWS, "any loadable[rows] x i32 ids -> f32 (i32 for i32 data)", _get_rows_supported
)
def get_rows(node: Tensor, context: BuildContext) -> Step:
    a_t, b_t = node.src[0], node.src[1]
    assert a_t is not None and b_t is not None
    ids_v = plain_view(b_t)[0]  # (a.ne3, a.ne2, n_rows)
    n3, n2 = a_t.ne[3], a_t.ne[2]
    i3 = np.arange(n3).reshape(n3, 1, 1)
    i2 = np.arange(n2).reshape(1, n2, 1)
    limit = a_t.ne[1]

    if a_t.type in PLAIN_DTYPES:
        src = plain_view(a_t)
        if a_t.type == node.type:
            out = plain_view(node)

            def run_same() -> None:
                _check_ids(ids_v, limit, "GET_ROWS")
                out[...] = src[i3, i2, ids_v]

            return run_same

        def run_plain() -> None:
            _check_ids(ids_v, limit, "GET_ROWS")
            rows = src[i3, i2, ids_v]
            if a_t.type == GgmlType.BF16:
                rows = bf16_to_f32(rows)
            convert.store(node, rows.astype(np.float32, copy=False))

        return run_plain

    from rpcnet.compute import quant

    raw = row_bytes_view(a_t)
    ne0 = a_t.ne[0]

    def run_quant() -> None:
        _check_ids(ids_v, limit, "GET_ROWS")
        picked = raw[i3, i2, ids_v]  # only the requested rows are decoded
        flat = picked.reshape(-1, picked.shape[-1])
        values = quant.dequantize(a_t.type, flat, flat.shape[0], ne0)
        convert.store(node, values.reshape(picked.shape[:-1] + (ne0,)))

    return run_quant


# --- SET_ROWS --------------------------------------------------------------------------------


def _set_rows_shapes(node: Tensor) -> tuple[Tensor, Tensor] | None:
    """(rows, i32/i64 ids) when SET_ROWS's shapes fit, whatever computes it."""
    rows, idx = node.src[0], node.src[1]
    if rows is None or idx is None or idx.type not in (GgmlType.I32, GgmlType.I64):
        return None
    if node.ne[0] != rows.ne[0] or node.ne[2] != rows.ne[2] or node.ne[3] != rows.ne[3]:
        return None
    if rows.ne[1] != idx.ne[0] or idx.ne[3] != 1 or idx.ne[1] <= 0 or idx.ne[2] <= 0:
        return None
    if rows.ne[2] % idx.ne[1] or rows.ne[3] % idx.ne[2]:
        return None
    return rows, idx


def _set_rows_supported(node: Tensor) -> bool:
    operands = _set_rows_shapes(node)
    return (
        operands is not None
        and convert.can_load(operands[0].type)
        and convert.can_store(node.type)
        and blocks_ok(node)
    )


@FAMILY.kernel(
    Op.SET_ROWS,
    "f32/f16 rows x i32/i64 ids -> f32/f16/bf16/q8_0/q4_x/q5_x/iq4_nl",
    _set_rows_supported,
)
def set_rows(node: Tensor, context: BuildContext) -> Step:
    rows_t, idx_t = node.src[0], node.src[1]
    assert rows_t is not None and idx_t is not None
    n3, n2 = rows_t.ne[3], rows_t.ne[2]
    # ids broadcast over dims 2, 3 by modulo: ids[i3 % ne12, i2 % ne11, i]
    i3 = np.arange(n3).reshape(n3, 1, 1)
    i2 = np.arange(n2).reshape(1, n2, 1)
    ids_v = plain_view(idx_t)[0]
    m3, m2 = i3 % idx_t.ne[2], i2 % idx_t.ne[1]
    r = np.arange(rows_t.ne[1]).reshape(1, 1, -1)
    limit = node.ne[1]

    def ids() -> Any:
        full = ids_v[m3, m2, r]
        _check_ids(full, limit, "SET_ROWS")
        return full

    if rows_t.type == node.type and node.type in PLAIN_DTYPES:
        src, dst = plain_view(rows_t), plain_view(node)

        def run_same() -> None:
            dst[i3, i2, ids()] = src

        return run_same

    if node.type in PLAIN_DTYPES:
        dst = plain_view(node)

        def run_plain() -> None:
            dst[i3, i2, ids()] = encode(node.type, convert.load_f32(rows_t))

        return run_plain

    dst_raw = row_bytes_view(node)

    def run_quant() -> None:
        values = np.asarray(convert.load_f32(rows_t), dtype=np.float32)
        dst_raw[i3, i2, ids()] = encode(node.type, values)

    return run_quant


# --- native kernels --------------------------------------------------------------------------


def _get_rows_native_supported(node: Tensor) -> bool:
    operands = _get_rows_shapes(node)
    if operands is None or node.type != GgmlType.F32:
        return False
    a, b = operands
    return rows_contiguous(b, 4) and float_rows(a) and float_rows(node)


@native_row(
    FAMILY, Op.GET_ROWS, "f32/f16 rows x i32 ids -> f32 (native)", _get_rows_native_supported
)
def get_rows_native(node: Tensor, context: BuildContext) -> Step:
    a, b = node.first_two_sources()
    return _native.get_rows_step(
        tensor_arg(a), a.type, tensor_arg(b), tensor_arg(node), context.threads
    )


def _set_rows_native_supported(node: Tensor) -> bool:
    operands = _set_rows_shapes(node)
    if operands is None:
        return False
    rows, idx = operands
    if rows.type != GgmlType.F32 or not float_rows(rows) or not float_rows(node):
        return False
    return rows_contiguous(idx, 8 if idx.type == GgmlType.I64 else 4)


@native_row(
    FAMILY, Op.SET_ROWS, "f32 rows x i32/i64 ids -> f32/f16 (native)", _set_rows_native_supported
)
def set_rows_native(node: Tensor, context: BuildContext) -> Step:
    rows, idx = node.first_two_sources()
    return _native.set_rows_step(
        tensor_arg(rows),
        tensor_arg(idx),
        idx.type,
        tensor_arg(node),
        node.type,
        context.threads,
    )


@FAMILY.scratch_rule(Op.GET_ROWS)
def _get_rows_scratch(node: Tensor, limit: int | None) -> int:
    """The gathered rows (raw, then as float32) and NumPy's intp copy of the index arrays."""
    ids = node.src[1]
    n_ids = 0 if ids is None else ids.nelements
    return 3 * logical_f32(node) + 8 * 3 * n_ids


@FAMILY.scratch_rule(Op.SET_ROWS)
def _set_rows_scratch(node: Tensor, limit: int | None) -> int:
    """The rows converted and encoded, the index arrays (intp) and the ids read."""
    rows, ids = node.src[0], node.src[1]
    n_rows = 0 if rows is None else rows.ne[1] * rows.ne[2] * rows.ne[3]
    return 3 * logical_f32(rows) + 8 * 3 * n_rows + logical_f32(ids)
