"""The kernel table: (op, types, device) -> a builder that compiles one node into a callable.

Each op family's module declares the whole op in one `OpFamily`: its kernels per backend (each
with the shapes and types it supports and, on the CPU, the scratch its run may allocate) and
where its CUDA builders live. `declare` enters a family into the table; the CUDA modules
register their entries with `kernel`.

A builder runs once per graph (plan time) with the node and a `BuildContext` (device kind,
backend, threads, scratch limit, plan state): it resolves array views and returns a closure
that does only the arithmetic, so GRAPH_RECOMPUTE re-runs closures without any decoding.

Of the kernels of one op that support a node, the one of highest priority runs: native fast
paths (narrow cases, Rust) come before the generic xp kernels, whatever the import order.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from rpcnet.compute import scratch
from rpcnet.compute.backend import Backend
from rpcnet.compute.errors import UnsupportedOp
from rpcnet.compute.ops import op_name
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import type_name

Step = Callable[[], None]
Builder = Callable[[Tensor], Step]  # the CUDA modules' builders: the node alone
Predicate = Callable[[Tensor], bool]
#: bytes of temporaries one run of a node's kernel may allocate, given the device's
#: --max-scratch (None: no limit known)
ScratchRule = Callable[[Tensor, int | None], int]

GENERIC = 0  # xp (NumPy/CuPy) kernels that handle every supported layout of their op
NATIVE = 10  # native fast paths for a narrow case, tried before the generic kernel
PREFILL = 20  # compute-bound shapes where a GEMM beats the native row kernels
HINT = 30  # op_params that make ggml run another algorithm (e.g. MUL_MAT's Hadamard hint)


@dataclass
class PlanState:
    """What the builders of one plan may know of the nodes built before theirs, in plan order:
    e.g. that a GPU scratch still holds an activation an earlier node quantized."""

    written: list[Tensor] = field(default_factory=list)  # outputs of the steps built so far
    shared: dict[str, Any] = field(default_factory=dict)  # builders' own notes, by topic

    def written_since(self, mark: int, t: Tensor) -> bool:
        """Whether a step built after `mark` (a len(written)) writes bytes `t` reads."""
        if t.buffer is None:
            return True
        lo, hi = t.offset, t.offset + t.nbytes
        return any(
            w.buffer is t.buffer and w.offset < hi and lo < w.offset + w.nbytes
            for w in self.written[mark:]
        )


@dataclass(frozen=True)
class BuildContext:
    """Everything a builder may know besides its node, handed to it rather than looked up
    through the node's buffer and device."""

    device: str = "cpu"  # the table's device key
    backend: Backend | None = None  # the device's memory operations (None: no device)
    threads: int = 1  # native kernels' worker threads
    max_scratch: int | None = None  # the device's --max-scratch (sizes MUL_MAT's weight chunks)
    plan: PlanState = field(default_factory=PlanState)  # the plan being compiled

    @classmethod
    def for_plan(
        cls, nodes: list[Tensor], device: str, budget: Any, plan: PlanState
    ) -> BuildContext:
        """The context of a plan over `nodes` on `device`: threads, backend and scratch limit of
        the device holding its outputs; `budget` (a ScratchBudget) names the limit if given."""
        written = [n.buffer for n in nodes if n.buffer is not None and n.is_computed]
        placed = written or [n.buffer for n in nodes if n.buffer is not None]
        holder = placed[0].device if placed else None
        if budget is None:
            budget = getattr(holder, "scratch", None)
        return cls(
            device,
            holder.backend if holder is not None else None,
            max(1, int(getattr(holder, "threads", 1) or 1)),
            getattr(budget, "limit", None),
            plan,
        )


ContextBuilder = Callable[[Tensor, BuildContext], Step]


@dataclass(frozen=True)
class Kernel:
    op: int
    name: str
    device: str
    supports: Predicate
    build: ContextBuilder
    types: str  # human-readable (op, types) summary for `rpcnet ops`
    priority: int
    #: whether a GPU may record the node's step into a CUDA graph: a step that allocates,
    #: synchronizes or calls cuBLAS through CuPy while it runs may not
    capturable: Predicate | bool = True
    #: the CPU temporaries of one run, where they differ from the op's (`OpFamily.scratch`)
    scratch: ScratchRule | None = None

    def captures(self, node: Tensor) -> bool:
        return self.capturable if isinstance(self.capturable, bool) else self.capturable(node)


@dataclass
class OpFamily:
    """One ggml op family, declared whole by its module: the kernels on the CPU (each with the
    shapes and types it supports, declared on its builder with `kernel`), the scratch its
    generic CPU kernels allocate per op (`scratch_rule`; ops without one: the default bound of
    compute/scratch.py), and the modules of its CUDA builders (which register themselves,
    without CuPy). `declare` enters it into the table."""

    name: str
    cuda: tuple[str, ...] = ()
    kernels: list[Kernel] = field(default_factory=list)
    scratch: dict[int, ScratchRule] = field(default_factory=dict)

    def kernel(
        self,
        ops: int | tuple[int, ...],
        types: str,
        supports: Predicate,
        priority: int = GENERIC,
        scratch: ScratchRule | None = None,
        enabled: bool = True,
    ) -> Callable[[ContextBuilder], ContextBuilder]:
        """Declare the decorated builder as a CPU kernel of `ops` (named after the builder);
        `scratch`: its own temporaries where they differ from the op's; not `enabled`: left out
        (a fast path switched off)."""

        def add(build: ContextBuilder) -> ContextBuilder:
            for op in ops if isinstance(ops, tuple) else (ops,):
                entry = Kernel(op, build.__name__, "cpu", supports, build, types, priority)
                if enabled:
                    self.kernels.append(dataclasses.replace(entry, scratch=scratch))
            return build

        return add

    def scratch_rule(self, *ops: int) -> Callable[[ScratchRule], ScratchRule]:
        """Declare the decorated function as the scratch bound of `ops`' generic kernels."""

        def add(rule: ScratchRule) -> ScratchRule:
            self.scratch.update(dict.fromkeys(ops, rule))
            return rule

        return add

    @property
    def ops(self) -> frozenset[int]:
        return frozenset(k.op for k in self.kernels)


_KERNELS: dict[tuple[int, str], list[Kernel]] = {}
_OP_SCRATCH: dict[int, ScratchRule] = {}
FAMILIES: dict[str, OpFamily] = {}


def _add(entry: Kernel) -> None:
    entries = _KERNELS.setdefault((entry.op, entry.device), [])
    if any(k.name == entry.name and k.priority == entry.priority for k in entries):
        return  # the same declaration again
    clash = [k.name for k in entries if k.priority == entry.priority]
    if clash:
        raise ValueError(
            f"kernel {entry.name} for {op_name(entry.op)} on {entry.device}: priority "
            f"{entry.priority} is taken by {clash[0]}"
        )
    entries.append(entry)
    entries.sort(key=lambda k: -k.priority)


def declare(family: OpFamily) -> OpFamily:
    """Enter an op family's kernels and scratch rules into the table."""
    FAMILIES[family.name] = family
    for entry in family.kernels:
        _add(entry)
    _OP_SCRATCH.update(family.scratch)
    return family


def scratch_bytes(node: Tensor, kernel: Kernel | None = None, limit: int | None = None) -> int:
    """Upper bound of the temporaries one run of the node's CPU `kernel` allocates (None: its
    op's generic kernel); `limit` is the device's --max-scratch."""
    rule = kernel.scratch if kernel is not None else None
    if rule is None:
        rule = _OP_SCRATCH.get(node.op, scratch.default_bound)
    return rule(node, limit) + scratch.overlap_charge(node)


def kernel(
    op: int,
    types: str,
    supports: Predicate,
    priority: int = GENERIC,
    device: str = "cpu",
    capturable: Predicate | bool = True,
) -> Callable[[Builder], Builder]:
    """Register a builder of the node alone (the CUDA modules' form) for `op` on `device`;
    higher `priority` is tried first. `capturable` (a flag or a predicate of the node) says
    whether a GPU may put its step into a CUDA graph.

    Two kernels of one op and device may not share a priority: which one runs must never
    depend on the order their modules were imported in.
    """

    def register(build: Builder) -> Builder:
        @functools.wraps(build)
        def with_context(node: Tensor, context: BuildContext) -> Step:
            return build(node)

        name = build.__name__
        _add(Kernel(op, name, device, supports, with_context, types, priority, capturable))
        return build

    return register


@dataclass(frozen=True)
class Fusion:
    """Two consecutive nodes run as one kernel: `first`'s result feeds only `second`, so it is
    never written (a GPU saves a launch and a round trip through memory)."""

    first: int
    second: int
    name: str
    device: str
    supports: Callable[[Tensor, Tensor], bool]
    build: Callable[[Tensor, Tensor], Step]


_FUSIONS: dict[tuple[int, int, str], list[Fusion]] = {}


def fusion(
    first: int, second: int, supports: Callable[[Tensor, Tensor], bool], device: str
) -> Callable[[Callable[[Tensor, Tensor], Step]], Callable[[Tensor, Tensor], Step]]:
    """Register a builder for the pair (`first` op, then `second` op consuming it) on `device`."""

    def register(build: Callable[[Tensor, Tensor], Step]) -> Callable[[Tensor, Tensor], Step]:
        entries = _FUSIONS.setdefault((first, second, device), [])
        if not any(f.build is build for f in entries):
            entries.append(Fusion(first, second, build.__name__, device, supports, build))
        return build

    return register


def select_fusion(first: Tensor, second: Tensor, device: str) -> Fusion | None:
    """The fusion that runs `first` and `second` (its only consumer) as one step, if any."""
    for entry in _FUSIONS.get((first.op, second.op, device), ()):
        if entry.supports(first, second):
            return entry
    return None


@dataclass(frozen=True)
class NodeGroup:
    """Several nodes of a plan run as one step, at the position of `members[0]` (a GPU's
    products that share an input, or a product with the ops that consume it): the finder has
    checked that running each member there reads and writes what it would in its own place."""

    members: tuple[Tensor, ...]
    build: Callable[[], Step]


#: per device: functions that find node groups in a plan's computed nodes (in order), given
#: every node of the graph (to count readers)
GroupFinder = Callable[[list[Tensor], list[Tensor]], list[NodeGroup]]
_GROUP_FINDERS: dict[str, list[GroupFinder]] = {}


def group_finder(device: str) -> Callable[[GroupFinder], GroupFinder]:
    """Register a finder of node groups for `device` (tried in registration order; a node
    joins the first group found for it)."""

    def register(find: GroupFinder) -> GroupFinder:
        finders = _GROUP_FINDERS.setdefault(device, [])
        if find not in finders:
            finders.append(find)
        return find

    return register


def group_finders(device: str) -> list[GroupFinder]:
    return list(_GROUP_FINDERS.get(device, ()))


_PLAN_STATE: ContextVar[PlanState | None] = ContextVar("rpcnet_plan_state", default=None)


@contextmanager
def planning() -> Iterator[PlanState]:
    """The state builders see (`plan_state()`) while one plan is compiled."""
    state = PlanState()
    token = _PLAN_STATE.set(state)
    try:
        yield state
    finally:
        _PLAN_STATE.reset(token)


def plan_state() -> PlanState:
    """The plan being compiled (outside `planning()`: a fresh state of one node)."""
    state = _PLAN_STATE.get()
    return state if state is not None else PlanState()


def describe_node(node: Tensor) -> str:
    srcs = ", ".join(s.describe() for s in node.src if s is not None)
    return f"op {op_name(node.op)} -> {node.describe()} from ({srcs})"


def select(node: Tensor, device: str = "cpu") -> Kernel:
    for entry in _KERNELS.get((node.op, device), ()):
        if entry.supports(node):
            return entry
    raise UnsupportedOp(f"unsupported {describe_node(node)} on {device}")


def table(device: str = "cpu") -> list[Kernel]:
    rows = [k for (_, dev), ks in _KERNELS.items() if dev == device for k in ks]
    return sorted(rows, key=lambda k: (k.op, k.types))


def types_of(node: Tensor) -> tuple[str, ...]:
    return tuple(type_name(s.type) for s in node.src if s is not None) + (type_name(node.type),)
