"""Whose work a device's worker runs next: fair turns between clients, decode steps first.

Every client's jobs run in the order it launched them. Among the clients' next jobs:

- a short one (a plan whose fastest run took at most SHORT_SECONDS: a decode step) goes first, in
  arrival order; it runs whole (decode steps of clients with equal weights run together,
  compute/shared_decode.py);
- a long one (a prefill) runs in slices of nodes (`PlanCursor`): after each node it gives the
  device back as soon as another client's short job waits, and after SLICE_SECONDS when another
  long job waits; long jobs take turns, the one that waited longest first;
- a long job that has waited STARVE_SECONDS gets a slice ahead of short ones, so that clients
  decoding back to back cannot hold a prefill off for ever;
- before a long job takes the device, the worker waits briefly for a client whose decode step
  just finished and whose next one is on its way (≤ DUE_WAIT_SECONDS, ≤ DUE_WAIT_SHARE of the
  step): otherwise that step would find a prefill node running and wait for it.

A job of no known client (a device callback) runs after everything queued before it, and
nothing queued after it overtakes it. Sans threads: the device calls it with its lock held.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

# A plan whose fastest run took at most this long is a decode-like step: it goes before long ones.
SHORT_SECONDS = 0.1
# A long plan runs at most this long while another client's long plan waits for the device.
SLICE_SECONDS = 0.02
# A long plan that has waited this long runs one slice ahead of the short steps queued.
STARVE_SECONDS = 0.25
# How long a long plan waits for the next step of a client whose decode step just finished.
DUE_WAIT_SECONDS = 0.005
DUE_WAIT_SHARE = 0.25


@dataclass(eq=False)
class Job:
    """One piece of work submitted to a device, with what its turns need to know."""

    fn: Callable[[], Any]
    future: Future[Any]
    short: bool  # goes before long jobs and runs whole
    submitted: float = field(default_factory=time.monotonic)
    waited_since: float = 0.0  # when it last lost (or first waited for) the device
    cursor: Any = None  # a long plan's PlanCursor once it has started
    ran: float = 0.0  # seconds it has had the device
    guaranteed: float = 0.0  # until when (monotonic) short jobs do not take the device from it

    def __post_init__(self) -> None:
        self.waited_since = self.submitted

    @property
    def owner(self) -> object:
        return getattr(self.fn, "owner", None)

    @property
    def plan(self) -> Any:
        """The `OwnedPlan` when this job may run with other clients' steps (see shared_decode)."""
        fn = self.fn
        return fn if self.short and getattr(fn, "joinable", False) else None

    @property
    def started(self) -> bool:
        return self.cursor is not None


def is_short(fn: Callable[[], Any]) -> bool:
    """Whether `fn` goes first and runs whole: a plan whose fastest run was short (a decode step
    stays one when a busy host slows a run down), a plan never run that could join other
    clients' decode steps, or a plain callable (a device callback)."""
    short = getattr(fn, "short", None)
    if short is None:
        return True
    plan = getattr(fn, "plan", None)
    if plan is None:
        return bool(short(SHORT_SECONDS))
    seconds = getattr(plan, "fastest_seconds", None)
    if seconds is None:
        seconds = getattr(plan, "last_seconds", None)
    if seconds is None:
        return bool(getattr(fn, "joinable", False))
    return bool(seconds <= SHORT_SECONDS)


class Turns:
    """The queue of a device's jobs and the choice of the next one."""

    def __init__(self) -> None:
        self.jobs: deque[Job] = deque()  # not started, in arrival order
        self.paused: list[Job] = []  # long jobs between slices
        self.running: Job | None = None
        self.arrivals = 0  # jobs added so far: a running slice re-checks the queue when it rises
        self._due: dict[int, tuple[float, float]] = {}  # id(owner) -> (step finished, grace)

    def __bool__(self) -> bool:
        return bool(self.jobs or self.paused)

    def add(self, job: Job) -> None:
        self.jobs.append(job)
        self.arrivals += 1
        self._due.pop(id(job.owner), None)

    def blocked_owners(self) -> set[int]:
        """Clients whose next job has started (running or paused): their queued jobs wait."""
        busy = [*self.paused, self.running] if self.running is not None else self.paused
        return {id(job.owner) for job in busy}

    def eligible(self) -> list[Job]:
        """Each client's next job: its paused one, else its first queued one (arrival order)."""
        out = list(self.paused)
        seen = self.blocked_owners()
        for job in self.jobs:
            if job.owner is None:  # a barrier: it waits for all before it, all after wait for it
                if not out and self.running is None:
                    out.append(job)
                break
            if id(job.owner) not in seen:
                seen.add(id(job.owner))
                out.append(job)
        return out

    def next_job(self, now: float) -> Job | float | None:
        """The job to run now, or how long to wait for a due decode step, or None (no work)."""
        candidates = self.eligible()
        if not candidates:
            return None
        shorts = [job for job in candidates if job.short]
        longs = [job for job in candidates if not job.short]
        starving = [job for job in longs if now - job.waited_since >= STARVE_SECONDS]
        if shorts and not starving:
            return self._take(shorts[0], now)
        if not shorts:
            wait = self._due_wait(now)
            if wait > 0:
                return wait
        pick = min(starving or longs, key=lambda job: job.waited_since)
        if starving:
            pick.guaranteed = now + SLICE_SECONDS
        return self._take(pick, now)

    def should_pause(self, job: Job, now: float, slice_started: float) -> bool:
        """Whether the running long `job` should give the device back after its current node."""
        others = self.eligible()
        if now >= job.guaranteed and any(other.short for other in others):
            return True
        return now - slice_started >= SLICE_SECONDS and any(not o.short for o in others)

    def pause(self, job: Job, now: float) -> None:
        self.running = None
        job.waited_since = now
        self.paused.append(job)

    def finished(self, job: Job, now: float) -> None:
        if self.running is job:
            self.running = None
        if job.short and job.owner is not None:  # its next step may be on its way
            self._due[id(job.owner)] = (now, min(DUE_WAIT_SECONDS, DUE_WAIT_SHARE * job.ran))

    def take_joined(self, job: Job) -> None:
        """`job` leaves the queue to run with the running one (a joint decode pass)."""
        self.jobs.remove(job)

    def forget(self, owner: object) -> None:
        self._due.pop(id(owner), None)

    def _take(self, job: Job, now: float) -> Job:
        if job.started:
            self.paused.remove(job)
        else:
            self.jobs.remove(job)
        self.running = job
        return job

    def _due_wait(self, now: float) -> float:
        """How long to wait for a client with nothing queued whose decode step just finished."""
        waiting = {id(job.owner) for job in (*self.jobs, *self.paused)}
        left = 0.0
        for key, (finished, grace) in list(self._due.items()):
            due = finished + grace - now
            if due <= 0:
                del self._due[key]
            elif key not in waiting:
                left = max(left, due)
        return left
