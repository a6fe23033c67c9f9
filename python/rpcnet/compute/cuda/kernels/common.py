"""What the cuda kernel builders share: the types they take, reaching a node's device memory,
plan scratch."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rpcnet import _native
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.kernels.kernel_table import GENERIC, Builder, Predicate, kernel
from rpcnet.compute.ops import Glu
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import GgmlType, type_name

CUDA = "cuda"
#: the (K, V) types of the flash_attn.cu kernels (rpc_flash_attn_<k>_<v>)
FA_KV_PAIRS = frozenset(
    {("F16", "F16"), ("Q8_0", "Q8_0"), ("F16", "Q8_0"), ("Q8_0", "F16"), ("BF16", "BF16")}
)
XP = -10  # priority of array-code entries: below the CUDA C kernels of the same op
MATVEC_MAX_COLS = 8  # launch.MV_MAXCOLS: activation columns of one matvec launch
# launch.MV_CHUNKED_MAX: up to this many columns a product runs as matvec launches of at most
# MATVEC_MAX_COLS each (weights read once per launch, arithmetic exactly the decode path's);
# more go through cuBLAS
MATVEC_CHUNKED_MAX = 32
_Q8_1_NOTE = "cuda.q8_1"  # PlanState.shared: the Q8Note of what the q8_1 scratch holds


@dataclass
class QuantizeRequest:
    """A producer's offer to quantize what it writes in blocks of any of `blocks`: the first
    product that takes it sets `block` (32: q8_1, 256: q8_K), and the producer's step reads it
    when it runs."""

    blocks: tuple[int, ...] = (32, 256)
    block: int | None = None


@dataclass
class Q8Note:
    """What the plan's q8_1 scratch `yq` holds from step `mark` on: the input `key`, quantized
    in blocks of `block`, or, with a `request`, the blocks its producer writes if asked."""

    key: tuple
    block: int | None
    mark: int
    yq: Any
    request: QuantizeRequest | None = None


def offer_quantized(
    be: Any, out: Tensor, blocks: tuple[int, ...], writes: int, kind: str = "q8_1"
) -> tuple[QuantizeRequest, Any]:
    """A producer's offer, noted for the products built after it, to quantize `out` (every
    element, in its order) as it writes it: the request the producer's step reads, and the
    `kind` scratch its blocks go to. `writes`: nodes the producer's step writes (the note
    holds from after them)."""
    from rpcnet.compute.cuda import launch
    from rpcnet.compute.kernels import kernel_table

    state = kernel_table.plan_state()
    request = QuantizeRequest(blocks)
    yq = _device_scratch(be, kind, launch.q8_1_bytes(out.nelements, 1))
    mark = len(state.written) + writes
    state.shared[_Q8_1_NOTE] = Q8Note(activation_key(out), None, mark, yq, request)
    return request, yq


def activation_key(y_t: Tensor) -> tuple:
    """What identifies a product's input in a Q8Note: its bytes' place and layout (contiguous
    f32 by place alone: a reshape of a producer's output holds the same values in order)."""
    assert y_t.buffer is not None
    if y_t.type == F32 and _contiguous(y_t):
        return (id(y_t.buffer), y_t.offset, y_t.nbytes)
    return (id(y_t.buffer), y_t.offset, y_t.ne, y_t.nb)


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


def _contiguous_f32_srcs(node: Tensor, n: int) -> list[Tensor] | None:
    """The first `n` sources (as _srcs) of a contiguous f32 node, or None."""
    s = _srcs(node, n)
    return s if s is not None and node.type == F32 and _contiguous(node) else None


def on_operands(
    operands: Callable[[Tensor], Sequence[Tensor | None] | None],
) -> Callable[[Callable[..., bool]], Predicate]:
    """Decorator: the node predicate fits(node, *operands(node)), False where operands(node)
    is None."""

    def wrap(fits: Callable[..., bool]) -> Predicate:
        @functools.wraps(fits)
        def ok(node: Tensor) -> bool:
            parts = operands(node)
            return parts is not None and fits(node, *parts)

        return ok

    return wrap


def on_contiguous_f32(n: int) -> Callable[[Callable[..., bool]], Predicate]:
    """`on_operands` of a contiguous f32 node's first `n` sources (all in buffers)."""
    return on_operands(lambda node: _contiguous_f32_srcs(node, n))


def _f32_source(node: Tensor, out_type: GgmlType = GgmlType.F32) -> Tensor | None:
    """The sole source of a node that maps f32 elements one to one onto `out_type` ones of the
    same shape, or None."""
    s = _srcs(node, 1)
    if s is None or s[0].type != F32 or node.type != out_type or s[0].ne != node.ne:
        return None
    return s[0]


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
    return be.view(_storage(t), t.offset, shape, strides, dtype)


def _storage(t: Tensor) -> Any:
    """The array `t` is addressed in at `t.offset`: its buffer's, or the window of the shared
    content it lies in (resolved once, when the plan is built)."""
    assert t.buffer is not None
    return t.buffer.resolve(t.offset, t.nbytes)


def _raw(t: Tensor) -> Any:
    """The tensor's bytes as a uint8 view (weights in block form)."""
    assert t.buffer is not None
    return t.buffer.device.backend.view(
        _storage(t), t.offset, (t.nbytes,), (1,), np.dtype(np.uint8)
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


def _weight_type(t: Tensor) -> str | None:
    from rpcnet.compute.cuda import sources

    name = type_name(t.type).upper()
    return name if name in sources.WEIGHT_TYPES else None


def _row_bytes(t: Tensor) -> int:
    _, block, type_size, _ = _native.type_info(t.type)
    return t.ne[0] // block * type_size


def _other_src(node: Tensor, first: Tensor) -> Tensor | None:
    """The source of a two-source `node` that is not `first` (None unless `first` is one)."""
    s = _srcs(node, 2)
    if s is None:
        return None
    if s[0] is first:
        return s[1]
    return s[0] if s[1] is first else None


def cuda_kernel(
    op: int,
    types: str,
    supports: Predicate,
    priority: int = GENERIC,
    capturable: Predicate | bool = True,
) -> Callable[[Builder], Builder]:
    """`kernel` on the CUDA device."""
    return kernel(op, types, supports, priority, CUDA, capturable)


def uncapturable(
    op: int, types: str, supports: Predicate, priority: int = GENERIC
) -> Callable[[Builder], Builder]:
    """`cuda_kernel` for a builder a CUDA graph cannot record (its CuPy calls allocate
    temporaries or synchronize): a plan with one runs eagerly."""
    return cuda_kernel(op, types, supports, priority, capturable=False)


def xp_fallback(op: int, types: str, supports: Predicate) -> Callable[[Builder], Builder]:
    """`uncapturable` array code below the CUDA C kernels of the same op (priority XP)."""
    return uncapturable(op, types, supports, XP)
