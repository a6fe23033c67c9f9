"""Optional per-kernel timing (`RPCNET_PROFILE=FILE`): where graph time goes, by op and types.

Enabled at plan time only, so an unprofiled server pays nothing per step.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable

_PATH = os.environ.get("RPCNET_PROFILE")
# RPCNET_PROFILE_SHAPES=1: labels also name the kernel and the operand shapes (finer rows)
_SHAPES = os.environ.get("RPCNET_PROFILE_SHAPES") == "1"
_totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
_lock = threading.Lock()


_collect = False  # `serve --metrics`: totals feed rpcnet_kernel_seconds_total


def collect() -> None:
    """Time every kernel of plans compiled from now on (for the metrics endpoint)."""
    global _collect
    _collect = True


def enabled() -> bool:
    return bool(_PATH) or _collect


def totals() -> dict[str, tuple[float, int]]:
    """{"OP types": (seconds, calls)} so far."""
    with _lock:
        return {label: (v[0], int(v[1])) for label, v in _totals.items()}


def label(base: str, kernel_name: str, shapes: list[tuple[int, ...]]) -> str:
    """A profile row's name: `base` ("OP types"), with the kernel and shapes if asked for."""
    return f"{base} {kernel_name} {shapes}" if _SHAPES else base


def timed(
    label: str, step: Callable[[], None], sync: Callable[[], None] | None = None
) -> Callable[[], None]:
    """`step` timed into the totals; `sync` (a GPU stream's synchronize) makes the time the
    kernel's own rather than its launch's."""

    def run() -> None:
        t0 = time.perf_counter()
        step()
        if sync is not None:
            sync()
        _add(label, time.perf_counter() - t0)

    return run


PLAN_LABEL = "(plan: host time of whole runs)"


def timed_plan(steps: list[Callable[[], None]]) -> None:
    """Run a plan's steps, timing the whole run: minus the kernels' sum, the per-node overhead."""
    t0 = time.perf_counter()
    for step in steps:
        step()
    _add(PLAN_LABEL, time.perf_counter() - t0)


def _add(label: str, elapsed: float) -> None:
    with _lock:
        entry = _totals[label]
        entry[0] += elapsed
        entry[1] += 1


def report() -> str:
    with _lock:
        rows = sorted(_totals.items(), key=lambda kv: -kv[1][0])
    plan = [r for r in rows if r[0] == PLAN_LABEL]
    rows = [r for r in rows if r[0] != PLAN_LABEL]
    total = sum(v[0] for _, v in rows) or 1.0
    lines = [f"{'kernel':<56} {'calls':>8} {'seconds':>9} {'share':>6}"]
    for label, (seconds, calls) in rows:
        lines.append(f"{label:<56} {calls:>8} {seconds:>9.3f} {seconds / total:>6.1%}")
    for label, (seconds, calls) in plan:
        overhead = (seconds - total) / max(1, calls) * 1e3
        lines.append(
            f"{label:<56} {calls:>8} {seconds:>9.3f}  outside kernels {overhead:.3f} ms/run"
        )
    return "\n".join(lines)


def _write() -> None:
    if _PATH and _totals:
        with open(_PATH, "w") as fh:
            fh.write(report() + "\n")


if _PATH:
    atexit.register(_write)
