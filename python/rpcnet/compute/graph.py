"""Rebuild a client's graph from GRAPH_COMPUTE (spec §8.3) and compile it into a plan."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rpcnet import _native
from rpcnet.compute import (
    kernels,  # noqa: F401 - registers the kernels
    profile,
    scratch,
)
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.kernels import kernel_table
from rpcnet.compute.ops import VIEW_OPS, Op, op_name
from rpcnet.compute.plan_run import plan_run
from rpcnet.compute.shared_decode import JointForm, WeightSite
from rpcnet.compute.tensor import FLAG_OUTPUT, Tensor

# (wire tensor) -> (buffer or None, byte offset in it); raises for invalid tensors.
Locator = Callable[[_native.RpcTensor], tuple[Any | None, int]]


def build_nodes(
    graph: _native.Graph,
    locate: Locator,
    regions: dict[int, tuple[int, int]],
    check_empty: bool,
) -> list[Tensor]:
    """The graph's nodes, each linked to its sources. Every tensor the nodes reach is checked
    natively (ids, cycles, types, bounds against `regions`), but only nodes and their direct
    sources become Tensors: a client's reduction graph is one ADD carrying its whole ancestry.
    The first tensor sent with an id wins."""
    try:
        refs = graph.walk(regions, check_empty)
    except _native.GraphError as exc:
        raise ComputeError(exc.reason) from exc
    wires = graph.tensors
    made: dict[int, Tensor] = {}

    def make(index: int) -> Tensor:
        t = made.get(index)
        if t is None:
            wire = wires[index]
            buffer, offset = locate(wire)
            t = made[index] = Tensor.from_wire(wire, buffer, offset)
        return t

    nodes = []
    for index, srcs in refs:
        node = make(index)
        node.src = tuple(None if s is None else make(s) for s in srcs)
        nodes.append(node)
    return nodes


_PLAN_UIDS = itertools.count(1)


@dataclass
class Plan:
    """A graph compiled once into kernel closures; re-running it does no decoding."""

    steps: list[Callable[[], None]]
    buffers: frozenset[int] = field(default_factory=frozenset)  # handles it touches
    n_nodes: int = 0
    written: tuple[Any, ...] = ()  # buffers its nodes write into
    touched: tuple[Any, ...] = ()  # every buffer it reads or writes (a GPU stages their inputs)
    scratch: Any = None  # rpcnet.compute.scratch.ScratchLease, released when the plan is dropped
    footprint: int = 0  # estimated bytes the plan itself holds (views, closures), for caches
    uid: int = field(default_factory=lambda: next(_PLAN_UIDS))  # a key that is never reused
    last_seconds: float | None = None  # how long the last run took (None: never run)
    fastest_seconds: float | None = None  # its fastest run: a decode step even on a busy host
    joint: JointForm | None = None  # running with other clients' plans: compute/shared_decode.py
    # one step per node (native runs not folded; timed ones under a profile): a long plan runs
    # in slices of these between other clients' steps (compute/plan_run.PlanCursor); None: whole
    node_steps: list[Callable[[], None]] | None = None

    def release(self) -> None:
        """Return the plan's scratch reservation and footprint to the device now."""
        if self.scratch is not None:
            self.scratch.release()

    def run(self) -> None:
        with plan_run((self,)):
            if profile.enabled():
                profile.timed_plan(self.steps)
            else:
                for step in self.steps:
                    step()

    def __call__(self) -> None:
        self.run()

    def short(self, limit: float) -> bool:
        """Whether its last run took at most `limit` seconds (a decode step, not a prefill)."""
        return self.last_seconds is not None and self.last_seconds <= limit


def needs_compute(node: Tensor) -> bool:
    return node.is_computed and node.op not in VIEW_OPS and node.nelements > 0


def compile_plan(nodes: list[Tensor], device: str = "cpu", budget: Any = None) -> Plan:
    """Compile nodes into a plan; with a ScratchBudget, refuse plans whose scratch exceeds it."""
    with kernel_table.planning() as state:
        context = kernel_table.BuildContext.for_plan(nodes, device, budget, state)
        return _compile(nodes, device, budget, context)


def _compile(
    nodes: list[Tensor], device: str, budget: Any, context: kernel_table.BuildContext
) -> Plan:
    state = context.plan
    computed = [n for n in nodes if needs_compute(n)]
    written = {id(n.buffer): n.buffer for n in computed if n.buffer is not None}
    groups = _node_groups(computed, nodes, device)
    fused = _fused_pairs(computed, nodes, device, set(groups.member_of))
    steps = []
    touched: dict[int, Any] = {}  # id(buffer) -> every buffer the plan reads or writes
    need, needy = 0, None  # largest per-node scratch bound, and that node
    sites: list[WeightSite] = []  # single-row products over weights this plan never writes
    for node in nodes:
        for t in (node, *node.src):
            if t is not None and t.buffer is not None:
                touched[id(t.buffer)] = t.buffer
                # Only data no node of this plan writes may be cached in derived form.
                t.stable = id(t.buffer) not in written
        if not needs_compute(node) or id(node) in fused.skipped:
            continue
        if node.buffer is None:
            raise ComputeError(f"node {node.describe()} has no storage on this server")
        group = groups.member_of.get(id(node))
        if group is not None:  # several nodes as one step, at the first member's place
            if group.members[0] is node:
                steps.append(group.build())
                state.written.extend(group.members)
            continue
        pair = fused.pairs.get(id(node))
        if pair is not None:  # this node and its only consumer, next in line, as one kernel
            steps.append(pair[0].build(node, pair[1]))
            state.written.append(pair[1])
            continue
        kernel = kernel_table.select(node, device)
        # The bounds are the CPU kernels' temporaries; GPU plans share one scratch per device
        # (compute/cuda/kernels/) instead.
        counted = budget is not None and device == "cpu"
        bound = kernel_table.scratch_bytes(node, kernel, budget.limit) if counted else 0
        if bound > need:
            # Checked before build: builders may already allocate index arrays per shape.
            budget.check(bound, kernel_table.describe_node(node))
            need, needy = bound, node
        step = kernel.build(node, context)
        if profile.enabled():
            base = f"{op_name(node.op)} {'/'.join(kernel_table.types_of(node))}"
            shapes = [tuple(s.ne) for s in node.src if s is not None]
            # on a GPU each kernel is waited for: its time, not its launch's (and no capture)
            backend = context.backend
            sync = None if device == "cpu" or backend is None else backend.synchronize
            step = profile.timed(profile.label(base, kernel.name, shapes), step, sync)
            if sync is not None:
                step.capturable = False  # type: ignore[attr-defined]
        if not kernel.captures(node):
            step.capturable = False  # type: ignore[attr-defined]  # read by the GPU's runner
        steps.append(step)
        state.written.append(node)
        site = weight_site(node, step, len(steps) - 1)
        if site is not None:
            sites.append(site)
    joint, node_steps = None, steps
    if not profile.enabled():  # a profile times every node on its own
        joint = joint_form(steps, sites)
        steps = batch_native_steps(steps)
    plan = Plan(
        steps,
        frozenset(b.handle for b in touched.values()),
        len(nodes),
        tuple(written.values()),
        tuple(touched.values()),
        joint=joint,
    )
    plan.node_steps = node_steps
    plan.footprint = scratch.plan_footprint(nodes)
    if budget is not None:
        what = kernel_table.describe_node(needy) if needy is not None else "no node"
        plan.scratch = budget.admit(need, plan.footprint, what)
        plan.scratch.bind(plan)
    return plan


@dataclass
class _Groups:
    member_of: dict[int, kernel_table.NodeGroup]  # id(node) -> its group


def _node_groups(computed: list[Tensor], nodes: list[Tensor], device: str) -> _Groups:
    """The device's node groups (GPU plans only; a profile times every node on its own)."""
    groups = _Groups({})
    if device == "cpu" or profile.enabled():
        return groups
    for find in kernel_table.group_finders(device):
        free = [n for n in computed if id(n) not in groups.member_of]
        for group in find(free, nodes):
            for member in group.members:
                groups.member_of[id(member)] = group
    return groups


@dataclass
class _Fused:
    pairs: dict[int, tuple[kernel_table.Fusion, Tensor]]  # id(first) -> (fusion, second)
    skipped: set[int]  # id(second) of each pair


def _fused_pairs(
    computed: list[Tensor], nodes: list[Tensor], device: str, grouped: set[int] | None = None
) -> _Fused:
    """Consecutive computed nodes a, b with a registered fusion, where b is a's only reader in
    the graph and the client cannot read a (not an output): a is never materialized. Members
    of a node group (`grouped`) take part in none: the group moves them."""
    fused = _Fused({}, set())
    if device == "cpu" or profile.enabled():  # a profile times every node on its own
        return fused
    readers: dict[int, int] = {}
    for n in nodes:
        for s in n.src:
            if s is not None:
                readers[s.id] = readers.get(s.id, 0) + 1
    i = 0
    while i + 1 < len(computed):
        a, b = computed[i], computed[i + 1]
        entry = None
        # b reads a itself, or a view of a that nothing else reads (a permuted product)
        feeds = any(
            s is a
            or (
                s is not None
                and s.op in VIEW_OPS
                and len(s.src) > 0
                and s.src[0] is a
                and readers.get(s.id, 0) == 1
            )
            for s in b.src
        )
        free = grouped is None or (id(a) not in grouped and id(b) not in grouped)
        if free and feeds and readers.get(a.id, 0) == 1 and not a.flags & FLAG_OUTPUT:
            entry = kernel_table.select_fusion(a, b, device)
        if entry is not None:
            fused.pairs[id(a)] = (entry, b)
            fused.skipped.add(id(b))
            i += 2
        else:
            i += 1
    return fused


def weight_site(node: Tensor, step: Callable[[], None], index: int) -> WeightSite | None:
    """Where a native decode-shaped MUL_MAT at `index` reads weights no node of its plan writes
    (a product another client's plan may share; the native side checks the shapes again)."""
    w, x = node.src[0], node.src[1] if len(node.src) > 1 else None
    if node.op != Op.MUL_MAT or not isinstance(step, _native.NativeStep):
        return None
    if w is None or x is None or w.buffer is None or not w.stable:
        return None
    if w.ne[2] * w.ne[3] != 1 or x.ne[1] * x.ne[2] * x.ne[3] != 1:
        return None
    return WeightSite(index, w.buffer, w.offset, w.nbytes)


def joint_form(steps: list[Callable[[], None]], sites: list[WeightSite]) -> JointForm | None:
    """The plan's form for joint runs: only plans of native steps with some product to share."""
    if not sites or not all(isinstance(step, _native.NativeStep) for step in steps):
        return None
    return JointForm(list(steps), tuple(sites))


def batch_native_steps(steps: list[Callable[[], None]]) -> list[Callable[[], None]]:
    """Fold each run of consecutive native steps into one `_native.run_steps` call: the run
    executes detached from the interpreter, with no Python between its nodes."""
    out: list[Callable[[], None]] = []
    run: list[Any] = []

    def flush() -> None:
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append(functools.partial(_native.run_steps, list(run)))
        run.clear()

    for step in steps:
        if isinstance(step, _native.NativeStep):
            run.append(step)
        else:
            flush()
            out.append(step)
    flush()
    return out
