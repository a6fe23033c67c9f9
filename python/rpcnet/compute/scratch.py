"""Compute scratch: what a node's kernel may allocate beyond its tensors, and the device budget.

Kernels allocate temporaries (f32 conversions, score blocks, NumPy's overlap copies). Their size
must never follow the *logical* size of a client-made view (zero strides, overlap) unchecked, so
every node gets a conservative bound here, computed at plan time from shapes alone:

* each operand the kernel converts or reads whole is charged its logical size in float32 (that
  also covers NumPy's copy of an input that aliases the output);
* an output whose layout overlaps itself (a zero stride, or rows laid over each other) is also
  charged its logical size: NumPy computes into a temporary and copies back;
* ops whose kernels work in bounded blocks (MUL_MAT per batch, GET_ROWS per output row,
  FLASH_ATTN_EXT per score block) charge what one run holds at once.

The device runs one plan at a time, so a plan needs the largest of its nodes' bounds. The
device's `ScratchBudget` admits a plan only if that need is within `--max-scratch`; the memory it
reserves from the device pool is the largest need among live plans (shared, since plans never
run concurrently), and it shrinks again when plans are dropped.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import Counter

from rpcnet import _native
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.tensor import Tensor

F32 = 4
DEFAULT_SCRATCH_CAP = 1 << 30


class ScratchExceeded(ComputeError):
    """A graph needs more compute scratch than the device allows; its connection closes."""


def default_max_scratch(capacity: int) -> int:
    """min(1 GiB, 10 % of the device memory)."""
    return min(DEFAULT_SCRATCH_CAP, capacity // 10)


def logical_f32(t: Tensor | None) -> int:
    """Bytes of the tensor's elements as float32, whatever its strides say."""
    if t is None:
        return 0
    return t.nelements * F32


@functools.cache
def _block(type_id: int) -> tuple[int, int] | None:
    """(elements, bytes) per block, or None for an invalid type."""
    try:
        _, block, size, _ = _native.type_info(type_id)
    except _native.NativeError:
        return None
    return max(block, 1), size


def overlaps_itself(t: Tensor) -> bool:
    """True when the layout maps several logical elements onto the same bytes."""
    ne0, ne1, ne2, ne3 = t.ne
    if ne0 == 0 or ne1 == 0 or ne2 == 0 or ne3 == 0:
        return False
    traits = _block(t.type)
    if traits is None:
        return True
    block, size = traits
    # Dims sorted by stride: each must step past everything the smaller dims cover
    # (dim 0 steps over blocks).
    counts = (ne0 // block, ne1, ne2, ne3)
    dims = sorted((nb, ne) for ne, nb in zip(counts, t.nb, strict=True) if ne > 1)
    covered = size
    for nb, ne in dims:
        if nb < covered:
            return True
        covered = nb * ne
    return False


def overlap_charge(node: Tensor) -> int:
    """An output that overlaps itself makes NumPy compute into a temporary of its logical size.
    (Inputs are charged by each op's bound: copies of them are at most their logical size.)"""
    return logical_f32(node) if overlaps_itself(node) else 0


def used_mask_f32(mask: Tensor | None, ne0: int, ne1: int) -> int:
    """float32 bytes of the part of a mask the kernels convert (softmax.used_mask)."""
    if mask is None:
        return 0
    return min(mask.ne[0], ne0) * min(mask.ne[1], ne1) * mask.ne[2] * mask.ne[3] * F32


def default_bound(node: Tensor, limit: int | None = None) -> int:
    """Elementwise, norm, reduce, shape and rope kernels: a converted copy of every operand and
    one or two temporaries the size of the output."""
    return 2 * (logical_f32(node) + sum(logical_f32(s) for s in node.src if s is not None))


def aliasable(t: Tensor | None, node: Tensor) -> int:
    """An f32 operand read in place costs nothing, unless it shares the output's buffer (NumPy
    then copies it first)."""
    if t is None or (t.buffer is not None and t.buffer is not node.buffer):
        return 0
    return logical_f32(t)


class ScratchLease:
    """A plan's claim on its device's memory: its scratch need (shared, see ScratchBudget) and
    its own footprint. Released when the plan object is dropped."""

    def __init__(self, budget: ScratchBudget, need: int, footprint: int) -> None:
        self.need = need
        self.footprint = footprint
        self._budget = budget
        self._finalizer: weakref.finalize | None = None

    def bind(self, owner: object) -> None:
        self._finalizer = weakref.finalize(
            owner, self._budget._give_back, self.need, self.footprint
        )

    def release(self) -> None:
        """Give the memory back now (idempotent); otherwise it goes when the owner is dropped.
        Explicit release matters where an exception's traceback may keep the plan alive."""
        if self._finalizer is not None:
            self._finalizer()


class ScratchBudget:
    """Per-device bound on compute scratch, reserved from the device's memory pool."""

    def __init__(self, pool, limit: int) -> None:  # pool: rpcnet.compute.device.MemoryPool
        self.pool = pool
        self.limit = limit
        self.reserved = 0  # bytes held in the pool: the largest need among live plans
        self._needs: Counter[int] = Counter()
        self._lock = threading.Lock()

    def check(self, need: int, what: str) -> None:
        if need > self.limit:
            raise ScratchExceeded(
                f"graph needs {need} bytes of compute scratch for {what}; "
                f"the device allows {self.limit} (--max-scratch)"
            )

    def admit(self, need: int, footprint: int, what: str) -> ScratchLease:
        """Reserve scratch for a plan whose largest node needs `need` bytes (and the plan's own
        `footprint`), or refuse."""
        self.check(need, what)
        with self._lock:
            if not self.pool.reserve(footprint):
                raise ScratchExceeded(
                    f"compiled graph would hold {footprint} bytes; device memory is full (--mem)"
                )
            grow = need - self.reserved
            if grow > 0:
                if not self.pool.reserve(grow):
                    self.pool.release(footprint)
                    raise ScratchExceeded(
                        f"graph needs {need} bytes of compute scratch for {what}; "
                        f"device memory is full (--mem)"
                    )
                self.reserved = need
            self._needs[need] += 1
        return ScratchLease(self, need, footprint)

    def _give_back(self, need: int, footprint: int) -> None:
        with self._lock:
            self.pool.release(footprint)
            self._needs[need] -= 1
            if self._needs[need] <= 0:
                del self._needs[need]
            top = max(self._needs, default=0)
            if top < self.reserved:
                self.pool.release(self.reserved - top)
                self.reserved = top


# What a compiled plan holds per graph tensor (Tensor, array views, closure cells): measured
# with tracemalloc at 0.8 KiB (MUL_MAT chains) to 1.5 KiB (elementwise chains) on CPython 3.11.
PLAN_BYTES_PER_TENSOR = 2048


def plan_footprint(nodes: list[Tensor]) -> int:
    """Estimated bytes a cached plan keeps alive: its nodes and the tensors they reference."""
    seen: set[int] = set()
    stack = list(nodes)
    while stack:
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.extend(s for s in t.src if s is not None)
    return len(seen) * PLAN_BYTES_PER_TENSOR
