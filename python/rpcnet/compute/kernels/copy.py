"""CPY, DUP, CONT: element copies in the source's logical row-major order, converting types.

ggml copies element i of src0 (counting ne0 fastest, then ne1, ...) to element i of the
destination, whatever either layout is; the shapes only need the same element count. Same-type
copies move whole blocks (so quantized tensors copy bit-exactly); other pairs go through float32.
Copies between f32 and f16 of the same shape (or into a packed destination of another shape, the
CONT of a permuted view) run natively.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute import convert
from rpcnet.compute.kernels.kernel_table import BuildContext, OpFamily, Step
from rpcnet.compute.kernels.native_args import (
    ELEM,
    TensorArg,
    disjoint,
    float_rows,
    native_row,
    tensor_arg,
)
from rpcnet.compute.ops import Op
from rpcnet.compute.scratch import logical_f32
from rpcnet.compute.tensor import Tensor
from rpcnet.compute.views import PLAIN_DTYPES, f32_to_bf16, plain_view, shape_of, storage
from rpcnet.ggml_types import GgmlType

FAMILY = OpFamily("copy", cuda=("rpcnet.compute.cuda.kernels.rows",))


def block_traits(type_id: int) -> tuple[int, int]:
    """(elements per block, bytes per block)."""
    _, block, size, _ = _native.type_info(type_id)
    return block, size


def block_view(t: Tensor) -> Any:
    """Raw blocks of any tensor as uint8 (ne3, ne2, ne1, ne0 / block, block bytes), strided."""
    block, size = block_traits(t.type)
    shp = (t.ne[3], t.ne[2], t.ne[1], t.ne[0] // block, size)
    strides = (t.nb[3], t.nb[2], t.nb[1], t.nb[0], 1)
    return np.ndarray(shp, dtype=np.uint8, buffer=storage(t), offset=t.offset, strides=strides)


def encode(type_id: int, values: Any) -> Any:
    """float32 values (..., ne0) in the storage form of `type_id`: a plain dtype array, or uint8
    rows (..., row bytes) of quantized blocks (bit-exact with ggml's reference quantizers)."""
    if type_id == GgmlType.F32:
        return values
    if type_id == GgmlType.BF16:
        return f32_to_bf16(values).reshape(values.shape)
    dtype = PLAIN_DTYPES.get(type_id)
    if dtype is not None:
        return values.astype(dtype)
    from rpcnet.compute import quant

    flat = np.ascontiguousarray(values, dtype=np.float32).reshape(-1, values.shape[-1])
    packed = quant.quantize_cpu(type_id, flat)
    return packed.reshape(values.shape[:-1] + (packed.shape[-1],))


def blocks_ok(t: Tensor) -> bool:
    """ne0 holds whole blocks and blocks are adjacent (what row/block views need)."""
    block, size = block_traits(t.type)
    return block > 0 and t.ne[0] % block == 0 and (block == 1 or t.nb[0] == size)


def _supported(node: Tensor) -> bool:
    src = node.src[0]
    if src is None or src.nelements != node.nelements:
        return False
    if src.type == node.type:
        return blocks_ok(src) and blocks_ok(node)
    return (
        convert.can_load(src.type)
        and convert.can_store(node.type)
        and blocks_ok(src)
        and blocks_ok(node)
    )


@FAMILY.kernel(
    (Op.CPY, Op.DUP, Op.CONT),
    "f32/f16/bf16/i32/quantized -> f32/f16/bf16/i32/q8_0/q4_x/q5_x/iq4_nl",
    _supported,
)
def copy(node: Tensor, context: BuildContext) -> Step:
    src = node.src[0]
    assert src is not None
    dst_shape = shape_of(node)
    types = (src.type, node.type)

    if src.type == node.type:
        s, d = block_view(src), block_view(node)
        same = s.shape == d.shape

        def run_same() -> None:
            d[...] = s if same else s.reshape(d.shape)

        return run_same

    if src.type in PLAIN_DTYPES and node.type in PLAIN_DTYPES and GgmlType.BF16 not in types:
        sv, dv = plain_view(src), plain_view(node)
        same = sv.shape == dv.shape

        def run_plain() -> None:
            # NumPy's casts match ggml's: f32->f16 rounds to nearest even, f32->i32 truncates.
            with np.errstate(invalid="ignore", over="ignore"):
                dv[...] = sv if same else sv.reshape(dv.shape)

        return run_plain

    def run_convert() -> None:
        values = convert.load_f32(src)
        if values.shape != dst_shape:
            values = values.reshape(dst_shape)
        convert.store(node, values)

    return run_convert


def _native_supported(node: Tensor) -> bool:
    a = node.src[0] if node.src else None
    if a is None or not (float_rows(a) and float_rows(node)):
        return False
    if tuple(a.ne) != tuple(node.ne) and not _reshaped_contiguous(node, a):
        return False
    # overlapping source and destination (other than exactly in place) need the NumPy copy
    same = node.buffer is a.buffer
    return not same or disjoint(node, a)


def _contiguous_nb(ne: tuple[int, ...], elem: int) -> tuple[int, ...]:
    nb = [elem]
    for n in ne[:-1]:
        nb.append(nb[-1] * n)
    return tuple(nb)


def _reshaped_contiguous(node: Tensor, a: Tensor) -> bool:
    """A contiguous destination of another shape (CONT_2D of a permuted view): its elements in
    order are the source's in logical row-major order, so it is the source's shape, packed."""
    return node.nelements == a.nelements and tuple(node.nb) == _contiguous_nb(
        tuple(node.ne), ELEM[node.type]
    )


def _dest_arg(node: Tensor, a: Tensor) -> TensorArg:
    if tuple(a.ne) == tuple(node.ne):
        return tensor_arg(node)
    ne = tuple(a.ne)
    return (storage(node), node.offset, ne, _contiguous_nb(ne, ELEM[node.type]))


@native_row(FAMILY, Op.CPY, "f32/f16 -> f32/f16, same shape (native)", _native_supported)
@native_row(FAMILY, Op.DUP, "f32/f16 -> f32/f16, same shape (native)", _native_supported)
@native_row(FAMILY, Op.CONT, "f32/f16 -> f32/f16, same shape or packed (native)", _native_supported)
def copy_native(node: Tensor, context: BuildContext) -> Step:
    a = node.src[0]
    assert a is not None
    return _native.copy_step(tensor_arg(a), a.type, _dest_arg(node, a), node.type, context.threads)


@FAMILY.scratch_rule(Op.CPY, Op.DUP, Op.CONT)
def _scratch(node: Tensor, limit: int | None) -> int:
    """The source as float32 (and reshaped), the converted result."""
    return 2 * logical_f32(node.src[0]) + logical_f32(node)
