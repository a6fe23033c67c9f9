"""What every run of compiled plans does around its kernels: one plan alone, several side by
side (compute/shared_decode.py), or one in slices between other clients' steps (`PlanCursor`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rpcnet import _native


@contextmanager
def plan_run(plans: Sequence[Any]) -> Iterator[None]:
    """Around one run of `plans` (graph.Plan): the derived caches of the buffers they write go
    stale, the kernel pool rests after, and each plan records how long the run took (only a run
    that finished: `Plan.short` judges decode steps by it)."""
    for plan in plans:
        for buf in plan.written:
            buf.touched()  # derived caches of these buffers are stale from here on
    started = time.perf_counter()
    try:
        yield
    finally:
        _native.pool_rest()  # no kernel follows soon: the cores go to the response and client
    elapsed = time.perf_counter() - started
    for plan in plans:
        ran(plan, elapsed)


def ran(plan: Any, seconds: float) -> None:
    """Record a finished run of `plan`: its last and its fastest run's time."""
    plan.last_seconds = seconds
    fastest = getattr(plan, "fastest_seconds", None)
    plan.fastest_seconds = seconds if fastest is None else min(fastest, seconds)


class PlanCursor:
    """One run of a plan taken in slices, so that other clients' steps can run between them:
    `advance` runs steps until the plan ends or `pause()` asks for the device back, and the next
    `advance` goes on from there. Around the whole run it does what `plan_run` does; the time
    the plan records is that of its own steps, not of the pauses."""

    def __init__(self, plan: Any, steps: Sequence[Callable[[], None]]) -> None:
        self.plan, self.steps = plan, steps
        self.next = 0  # the index of the step to run next
        self.busy = 0.0  # seconds spent in the plan's steps so far

    def advance(self, pause: Callable[[], bool]) -> bool:
        """Run steps until the end (True) or until `pause()`, asked after each step, is true."""
        steps, count = self.steps, len(self.steps)
        if self.next == 0:
            for buf in self.plan.written:
                buf.touched()
        started = time.perf_counter()
        try:
            while self.next < count:
                steps[self.next]()
                self.next += 1
                if self.next < count and pause():
                    break
        finally:
            # the kernel pool rests between slices too: the wait for a client's next step
            # leaves its cores to that client
            _native.pool_rest()
            self.busy += time.perf_counter() - started
        if self.next < count:
            return False
        ran(self.plan, self.busy)
        return True
