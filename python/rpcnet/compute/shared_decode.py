"""Decode steps of several clients that loaded the same model, run as one pass over the weights.

Decode is bound by memory bandwidth: each step reads every weight byte once to multiply it by
one activation row. When clients holding identical weights (the same GGUF, each in its own
buffers) have decode steps queued together, their plans run side by side (`_native.run_joint`):
each single-row MUL_MAT at the same position of every plan becomes one product whose weights
are read once, and every other step runs per plan, in each plan's order. Each client's results
keep their bits (the product keeps each row's vec_dot order; tested natively and end to end).

Weights count as identical only after their bytes were compared (`_native.same_weights`); the
verdicts are kept per pair of weight regions and dropped when either buffer is written again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rpcnet import _native
from rpcnet.compute.plan_run import plan_run

if TYPE_CHECKING:
    from rpcnet.compute.buffer import DeviceBuffer


class Plan(Protocol):
    """What sharing a decode step needs of a compiled plan (`compute.graph.Plan`)."""

    uid: int

    @property
    def joint(self) -> JointForm | None: ...


# Verdicts kept per device before the oldest are dropped (a few per weight matrix and client).
MAX_VERDICTS = 1 << 16
# Plan pairs whose joint positions are kept (clients × graphs each; rebuilt from verdicts).
MAX_PAIRS = 256


@dataclass(frozen=True)
class WeightSite:
    """A single-row MUL_MAT at `index` of a plan's native steps and where its weights live."""

    index: int
    buffer: DeviceBuffer
    offset: int
    nbytes: int


@dataclass
class JointForm:
    """What a plan offers to joint runs: all its steps native, and its candidate products."""

    steps: list[Any]  # the plan's NativeSteps, in order
    sites: tuple[WeightSite, ...]

    def __post_init__(self) -> None:
        self.positions = tuple(site.index for site in self.sites)
        # the distinct buffers of the sites (one or two per model): their generations key the
        # plan's cached verdicts, checked at every decode step
        self.buffers = tuple({id(site.buffer): site.buffer for site in self.sites}.values())

    def generations(self) -> tuple[int, ...]:
        return tuple(buf.generation for buf in self.buffers)


class JointIndex:
    """Per device: which positions two plans may run as one product, from compared bytes.
    Used by the device's worker thread only."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple[object, ...], bool] = {}
        self._pairs: dict[tuple[int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def shared(self, a: Plan, b: Plan, compare: bool = True) -> tuple[int, ...]:
        """Positions where plans `a` and `b` multiply by equal weights (empty: none, or the
        plans differ in form). Without `compare`, bytes never compared count as different."""
        forms = _comparable(a, b)
        if forms is None:
            return ()
        fa, fb = forms
        gens = fa.generations() + fb.generations()
        key = (a.uid, b.uid)
        hit = self._pairs.get(key)
        if hit is not None and hit[0] == gens:
            return hit[1]
        if not compare and self._uncompared(fa, fb):
            return ()
        pairs = zip(fa.sites, fb.sites, strict=True)
        shared = tuple(sa.index for sa, sb in pairs if self._same(fa, sa, fb, sb))
        if len(self._pairs) >= MAX_PAIRS:
            self._pairs.clear()
        self._pairs[key] = (gens, shared)
        return shared

    def pending(self, a: Plan, b: Plan) -> bool:
        """Whether `shared(a, b)` would have to compare weight bytes not compared yet (the first
        time two clients' models meet: a read of both, 0.1-0.3 s for a few hundred MB)."""
        forms = _comparable(a, b)
        if forms is None:
            return False
        fa, fb = forms
        hit = self._pairs.get((a.uid, b.uid))
        if hit is not None and hit[0] == fa.generations() + fb.generations():
            return False
        return self._uncompared(fa, fb)

    def _uncompared(self, fa: JointForm, fb: JointForm) -> bool:
        """Whether some pair of the forms' weight regions has no verdict yet."""
        verdicts = self._verdicts
        pairs = zip(fa.sites, fb.sites, strict=True)
        return any(sa.nbytes == sb.nbytes and _key(sa, sb) not in verdicts for sa, sb in pairs)

    def _same(self, fa: JointForm, sa: WeightSite, fb: JointForm, sb: WeightSite) -> bool:
        if sa.nbytes != sb.nbytes:
            return False
        key = _key(sa, sb)
        verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = _native.same_weights(fa.steps[sa.index], fb.steps[sb.index])
            if len(self._verdicts) >= MAX_VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict


def _comparable(a: Plan, b: Plan) -> tuple[JointForm, JointForm] | None:
    """The two plans' joint forms if they have the same steps and candidate positions."""
    fa, fb = a.joint, b.joint
    if fa is None or fb is None or len(fa.steps) != len(fb.steps):
        return None
    return (fa, fb) if fa.positions == fb.positions else None


def _key(sa: WeightSite, sb: WeightSite) -> tuple[object, ...]:
    """The verdict key of two weight regions (either order; a write to either changes it)."""
    ka = (sa.buffer.serial, sa.buffer.generation, sa.offset)
    kb = (sb.buffer.serial, sb.buffer.generation, sb.offset)
    return (*min(ka, kb), *max(ka, kb), sa.nbytes)


def joint_positions(plans: Sequence[Plan], index: JointIndex) -> tuple[int, ...]:
    """Positions where every plan multiplies by the first one's weights."""
    head, rest = plans[0], plans[1:]
    common: set[int] | None = None
    for other in rest:
        shared = set(index.shared(head, other))
        common = shared if common is None else common & shared
    return tuple(sorted(common or ()))


def run_together(plans: Sequence[Plan], joint: tuple[int, ...]) -> list[bool]:
    """Run `plans` (each with a JointForm of one length) side by side, sharing the products at
    `joint`; per plan, whether it ran to the end."""
    forms = [plan.joint for plan in plans]
    assert all(form is not None for form in forms)
    with plan_run(plans):
        return _native.run_joint([form.steps for form in forms if form is not None], list(joint))
