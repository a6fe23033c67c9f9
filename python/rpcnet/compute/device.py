"""Devices: their memory pool, derived-data cache and the one worker thread that runs plans."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from rpcnet.compute import shared_decode, turns
from rpcnet.compute.backend import CPU, Backend
from rpcnet.compute.derived import DerivedCache
from rpcnet.compute.memory import MemoryPool
from rpcnet.compute.plan_run import PlanCursor
from rpcnet.compute.turns import Job, Turns, is_short

# A plan whose last run took at most this long runs on the submitting thread when the worker is
# idle; the event loop stalls that long at most (a decode step, never a prefill).
INLINE_MAX_SECONDS = 0.1
# Only a device one client has had to itself this long runs plans inline: clients sharing it are
# served by the worker, in the order their graphs arrived (inline runs block the event loop, and
# the clients whose requests pile up meanwhile would be served in poll order, not arrival order).
SHARED_WINDOW_SECONDS = 1.0
# Decode steps of clients with the same weights run as one (compute/shared_decode.py). The worker
# waits for a client whose last step could have joined, but at most this long and this share of the
# step's own last run: a client whose answer is on its way sends its next step within ~1 ms.
JOIN_WAIT_SECONDS = 0.004
JOIN_WAIT_SHARE = 0.25
# Plans run side by side at most (their products' rows go 7 at a time anyway).
MAX_JOINT_PLANS = 8


def physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


class OwnedPlan:
    """A plan as one session launched it: calling it runs the plan; `short` and `owner` let the
    device decide whether it may run inline (see `Device.submit`)."""

    def __init__(self, plan: Any, owner: object) -> None:
        self.plan, self.owner = plan, owner

    def __call__(self) -> None:
        self.plan.run()

    def short(self, limit: float) -> bool:
        return bool(self.plan.short(limit))

    @property
    def joinable(self) -> bool:
        return self.plan.joint is not None

    def cursor(self) -> PlanCursor | None:
        """The plan's run in slices (one node each), or None when it must run whole."""
        steps = getattr(self.plan, "node_steps", None)
        return None if steps is None else PlanCursor(self.plan, steps)


class RunnerWork:
    """A plan for a device's runner (a GPU: stream, CUDA-graph replay), as one session launched
    it; like `OwnedPlan`, a short one (a replayed decode step) may run inline."""

    joinable = False

    def __init__(self, runner: Any, plan: Any, owner: object) -> None:
        self.runner, self.plan, self.owner = runner, plan, owner

    def __call__(self) -> Any:
        return self.runner.run(self.plan, self.owner)

    def cursor(self) -> Any:
        """The plan's run in slices of nodes on the device's stream, or None when it must run
        whole (a runner without slices, a plan without per-node steps)."""
        cursor_of = getattr(self.runner, "cursor", None)
        return None if cursor_of is None else cursor_of(self.plan, self.owner)

    def short(self, limit: float) -> bool:
        return bool(self.plan.short(limit))


@dataclass
class Device:
    """A compute device as the protocol sees it (index, name, memory) plus its executor."""

    index: int
    name: str
    description: str
    memory: MemoryPool
    backend: Backend = CPU  # where buffers live and how bytes move (compute/backend.py)
    alignment: int = 32
    max_size: int = (1 << 64) - 1
    threads: int = 1

    runner: Any = None  # runs plans instead of plan.run (cuda: stream, replay cache, errors)
    live_memory: Callable[[], tuple[int, int]] | None = None  # (free, total) the device reports
    derived_limit: int | None = None  # bytes for dequantized weight copies; default capacity / 4
    max_scratch: int | None = None  # compute scratch per plan; default min(1 GiB, capacity / 10)
    # called on the worker with each graph's wait for the device, (owner, seconds): --metrics
    wait_observer: Callable[[object, float], None] | None = None

    def __post_init__(self) -> None:
        # One worker per device: plans never run concurrently; whose runs next is compute/turns.py
        # (fair turns, decode steps first; decode steps of clients with the same weights as one).
        self._exclusive = threading.Lock()  # held by whichever thread runs this device's work
        self._queued = 0  # jobs handed to the worker and not finished
        self._queued_lock = threading.Lock()
        self._wakeup = threading.Condition(self._queued_lock)
        self._turns = Turns()
        self._closing = False
        self._recent_owners: dict[int, float] = {}  # id(owner) -> when it last launched a plan
        # id(owner) -> (when it last launched a joinable plan, that plan): whose step is due
        self._joiners: dict[int, tuple[float, weakref.ref[Any]]] = {}
        self.joint_index = shared_decode.JointIndex()
        self.joint_runs = 0  # joint runs so far, and the plans they ran (for tests and metrics)
        self.joint_plans = 0
        self.slices = 0  # times a long plan gave the device back to another client's work
        self._thread = threading.Thread(target=self._work, name=f"rpcnet-{self.name}", daemon=True)
        self._thread.start()
        limit = self.derived_limit if self.derived_limit is not None else self.memory.capacity // 4
        self.derived = DerivedCache(self.memory, limit)
        from rpcnet.compute.scratch import ScratchBudget, default_max_scratch

        scratch = self.max_scratch
        self.scratch = ScratchBudget(
            self.memory, default_max_scratch(self.memory.capacity) if scratch is None else scratch
        )

    def allocate(self, nbytes: int) -> Any | None:
        """Raw device memory, or None when the device cannot hold it."""
        if not self.memory.reserve(nbytes):
            return None
        try:
            mem = self.backend.allocate(nbytes)
        except Exception:
            self.memory.release(nbytes)
            raise
        if mem is None:
            self.memory.release(nbytes)
        return mem

    @property
    def kind(self) -> str:
        """The kernel registry's device key for this device ("cpu", "cuda")."""
        return self.backend.name

    def release(self, nbytes: int, mem: Any = None) -> None:
        if mem is not None:
            self.backend.free(mem)
        self.memory.release(nbytes)

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run `fn` in its turn (compute/turns.py); its future ends when it is done.

        A short plan (`short(INLINE_MAX_SECONDS)`, a decode step) that finds the worker idle runs
        right here on the calling thread: that saves the hand-off to the worker and the wake-up
        of the event loop after it, ~0.3 ms of a 10 ms decode step on a 2-core host."""
        short = getattr(fn, "short", None)
        owner = getattr(fn, "owner", None)
        alone = self._alone(owner)
        if short is not None and short(INLINE_MAX_SECONDS) and alone and self._queued == 0:
            if self._exclusive.acquire(blocking=False):
                done: Future[Any] = Future()
                try:
                    result = fn()
                except BaseException as exc:  # noqa: BLE001 - the job's outcome, for its waiter
                    done.set_exception(exc)
                else:
                    done.set_result(result)  # a GPU runner's run mode ("eager", "replayed", ...)
                finally:
                    self._exclusive.release()
                self._observe_wait(owner, 0.0)
                return done
        job = Job(fn, Future(), is_short(fn))
        with self._wakeup:
            if self._closing:
                raise RuntimeError(f"device {self.name} is shut down")
            self._queued += 1
            self._turns.add(job)
            plan = job.plan
            if plan is not None and owner is not None:
                self._joiners[id(owner)] = (time.monotonic(), weakref.ref(plan.plan))
            self._wakeup.notify()
        return job.future

    def _alone(self, owner: object) -> bool:
        """Record a launch by `owner`; whether no other owner launched within the window."""
        if owner is None:
            return True
        now = time.monotonic()
        with self._queued_lock:
            recent = self._recent_owners
            recent[id(owner)] = now
            for key in [k for k, t in recent.items() if now - t > SHARED_WINDOW_SECONDS]:
                del recent[key]
            return len(recent) == 1

    # ------------------------------------------------------------------ the worker

    def _work(self) -> None:
        while self._turn():
            pass

    def _turn(self) -> bool:
        """Take the next turn and run it; False once the device shuts down. Its own frame, so
        that the jobs are dropped when it returns, not when the next one arrives: a plan of a
        closed connection holds its scratch until it is gone."""
        with self._wakeup:
            head = self._next_job()
            if head is None:
                return False
            batch = self._take_batch(head) if head.plan is not None else [head]
        done = batch
        try:
            with self._exclusive:
                done = self._run_turn(batch)
        finally:
            now = time.monotonic()
            with self._wakeup:
                for job in batch:
                    if job in done:
                        self._turns.finished(job, now)
                        self._queued -= 1
                    else:
                        self._turns.pause(job, now)
        for job in done:
            self._observe_wait(job.owner, now - job.submitted - job.ran)
        return True

    def _next_job(self) -> Job | None:
        """The next job in turn; waits while there is none (or a due decode step is on its
        way). None once the device shuts down. Called with the lock held."""
        while True:
            if self._closing and not self._turns:
                return None
            turn = self._turns.next_job(time.monotonic())
            if isinstance(turn, Job):
                return turn
            self._wakeup.wait(turn)  # None: until a submit; a float: a due step's grace

    def _run_turn(self, batch: list[Job]) -> list[Job]:
        """Run one turn: a long plan's slice, or short jobs (several: a joint decode pass).
        The jobs that finished."""
        head = batch[0]
        if not head.short and not head.started:
            cursor_of = getattr(head.fn, "cursor", None)
            cursor = cursor_of() if cursor_of is not None else None
            if cursor is None:  # a plan without per-node steps: it cannot pause
                return self._run_batch(batch)
            if not head.future.set_running_or_notify_cancel():
                return batch
            head.cursor = cursor
        if head.started:
            return self._run_slice(head)
        return self._run_batch(batch)

    def _run_slice(self, job: Job) -> list[Job]:
        """Run the long plan of `job` until it ends or another client's work is due."""
        started = time.monotonic()
        seen = -1

        def pause() -> bool:
            nonlocal seen
            now = time.monotonic()
            arrivals = self._turns.arrivals
            if arrivals == seen and now - started < turns.SLICE_SECONDS:
                return False  # nothing arrived since the last look, and the slice is young
            seen = arrivals
            with self._queued_lock:
                return self._turns.should_pause(job, now, started)

        try:
            finished = job.cursor.advance(pause)
        except BaseException as exc:  # noqa: BLE001 - the job's outcome, for its waiter
            finished = True
            job.future.set_exception(exc)
        else:
            if finished:
                job.future.set_result(None)
        finally:
            job.ran += time.monotonic() - started
        if not finished:
            self.slices += 1
            return []
        return [job]

    def _take_batch(self, head: Job) -> list[Job]:
        """`head` (a short joinable plan), and queued joinable plans of other clients with the
        same weights. Waits (the lock released) for clients whose steps usually join but are
        not queued yet. Called with the lock held."""
        plan = head.plan
        if plan is None or head.future.cancelled():
            return [head]
        batch = [head]
        deadline = time.monotonic() + min(
            JOIN_WAIT_SECONDS, JOIN_WAIT_SHARE * (plan.plan.last_seconds or 0.0)
        )
        while True:
            self._compare_unlocked(plan.plan)
            self._join_queued(batch)
            missing = self._missing_joiners(batch, plan.plan)
            left = deadline - time.monotonic()
            if not missing or left <= 0 or len(batch) >= MAX_JOINT_PLANS or self._closing:
                return batch
            self._wakeup.wait(left)

    def _compare_unlocked(self, head: Any) -> None:
        """Compare the weight bytes of `head` and of every queued or due joinable plan that the
        index has not compared yet, with the queue unlocked: the first comparison of two
        clients' models reads both (0.1-0.3 s), and `submit` on the event loop must not wait
        for it. Called with the lock held; returns with it held. Plans that arrive meanwhile
        are compared on a later pass (until then they do not join)."""
        queued = [job.plan.plan for job in self._turns.jobs if job.plan is not None]
        due = [ref() for _, ref in self._joiners.values()]
        index = self.joint_index
        todo = [p for p in (*queued, *due) if p is not None and index.pending(head, p)]
        if not todo:
            return
        self._wakeup.release()
        try:
            for other in todo:
                index.shared(head, other)
        finally:
            self._wakeup.acquire()

    def _join_queued(self, batch: list[Job]) -> None:
        """Move queued plans that can join `batch` into it: each its owner's next job (so no
        client's work is reordered), of an owner not in the batch, sharing weights with the
        head. Jobs of no known owner end the search (they may be anyone's)."""
        head = batch[0].plan
        assert head is not None
        owners = {id(job.owner) for job in batch} | self._turns.blocked_owners()
        for job in list(self._turns.jobs):
            if len(batch) >= MAX_JOINT_PLANS:
                return
            owner = job.owner
            if owner is None:
                return
            first_of_owner = id(owner) not in owners
            owners.add(id(owner))
            plan = job.plan
            if not first_of_owner or plan is None or job.future.cancelled():
                continue
            if self.joint_index.shared(head.plan, plan.plan, compare=False):
                self._turns.take_joined(job)
                batch.append(job)

    def _missing_joiners(self, batch: list[Job], head: Any) -> bool:
        """Whether a client outside `batch` with nothing queued launched, within the shared
        window, a plan that could have joined `head` (its next step is likely on its way)."""
        now = time.monotonic()
        turns = self._turns
        inside = {id(job.owner) for job in (*batch, *turns.jobs, *turns.paused)}
        for key, (at, ref) in list(self._joiners.items()):
            last = ref()
            if now - at > SHARED_WINDOW_SECONDS or last is None:
                del self._joiners[key]
            elif key not in inside and self.joint_index.shared(head, last, compare=False):
                return True
        return False

    def _run_batch(self, batch: list[Job]) -> list[Job]:
        """Run short jobs whole: one alone, or several plans as one joint pass. All finish."""
        jobs = [job for job in batch if job.started or job.future.set_running_or_notify_cancel()]
        started = time.monotonic()
        try:
            self._run_jobs(jobs)
        finally:
            elapsed = time.monotonic() - started
            for job in jobs:
                job.ran += elapsed
        return batch

    def _run_jobs(self, jobs: list[Job]) -> None:
        if not jobs:
            return
        if len(jobs) == 1:
            job = jobs[0]
            try:
                result = job.fn()
            except BaseException as exc:  # noqa: BLE001 - the job's outcome, for its waiter
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)
            return
        plans = [job.fn.plan for job in jobs if isinstance(job.fn, OwnedPlan)]
        try:
            positions = shared_decode.joint_positions(plans, self.joint_index)
            ok = shared_decode.run_together(plans, positions)
        except BaseException as exc:  # noqa: BLE001 - every job's outcome, for its waiter
            for job in jobs:
                job.future.set_exception(exc)
            return
        self.joint_runs += 1
        self.joint_plans += len(jobs)
        for job, finished in zip(jobs, ok, strict=True):
            if finished:
                job.future.set_result(None)
            else:
                job.future.set_exception(ValueError("row index out of range"))

    def _observe_wait(self, owner: object, seconds: float) -> None:
        observer = self.wait_observer
        if observer is not None and owner is not None:
            observer(owner, max(seconds, 0.0))

    def plan_work(self, plan: Any, owner: object) -> Callable[[], Any]:
        """What the worker runs for `plan` launched by `owner` (a session): the plan with its
        owner (`OwnedPlan`, which `submit` may run inline), or on a GPU the device's runner
        (stream, CUDA-graph replay, error policy)."""
        runner = self.runner
        if runner is None:
            return OwnedPlan(plan, owner)
        return RunnerWork(runner, plan, owner)

    def buffer_freed(self, handle: int) -> None:
        if self.runner is not None:
            self._later(lambda: self.runner.buffer_freed(handle))

    def owner_closed(self, owner: object) -> None:
        with self._queued_lock:  # the worker waits for no step of a client that left
            self._joiners.pop(id(owner), None)
            self._recent_owners.pop(id(owner), None)
            self._turns.forget(owner)
        if self.runner is not None:
            self._later(lambda: self.runner.owner_closed(owner))

    def _later(self, fn: Callable[[], None]) -> None:
        try:
            self.submit(fn)
        except RuntimeError:  # the worker is shut down: the server is closing, nothing to keep
            pass

    def memory_report(self) -> tuple[int, int]:
        """(free, total) for GET_DEVICE_MEMORY: the pool (--mem), and the real free memory of
        the device where it can tell (a GPU shared with other processes)."""
        free, total = self.memory.free, self.memory.capacity
        if self.live_memory is not None:
            free = min(free, self.live_memory()[0])
        return free, total

    def shutdown(self) -> None:
        """Cancel the queued jobs and fail the paused ones, let the running one finish (or its
        slice: then it fails too), stop the worker."""
        with self._wakeup:
            self._closing = True
            turns = self._turns
            while turns.jobs:
                turns.jobs.popleft().future.cancel()
                self._queued -= 1
            for job in turns.paused:
                job.future.set_exception(RuntimeError(f"device {self.name} is shut down"))
                self._queued -= 1
            turns.paused.clear()
            self._wakeup.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()


def limit_blas_threads(n_threads: int) -> None:
    """BLAS (matmul) threads are process-wide; `--threads` sets them like rpc-server's -t."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=n_threads)


def avoid_hugepage_stalls() -> None:
    """Stop NumPy from madvise(MADV_HUGEPAGE)-ing large arrays.

    With the kernel's THP defrag set to "madvise", first-touch faults on such regions may compact
    memory synchronously: receiving a few hundred MiB of weights then stalls for hundreds of ms
    at unpredictable moments. Plain 4 KiB faults cost less and always the same.
    """
    for module in ("_core", "core"):
        setter = getattr(getattr(np, module, None), "multiarray", None)
        setter = getattr(setter, "_set_madvise_hugepage", None)
        if setter is not None:
            setter(False)
            return


def cpu_device(
    index: int = 0,
    capacity: int | None = None,
    threads: int | None = None,
    max_scratch: int | None = None,
) -> Device:
    total = capacity if capacity is not None else physical_memory()
    avoid_hugepage_stalls()
    n_threads = threads or max(1, os.cpu_count() or 1)
    limit_blas_threads(n_threads)
    return Device(
        index=index,
        name="CPU",
        description=f"rpcnet CPU ({n_threads} threads, NumPy)",
        memory=MemoryPool(total),
        threads=n_threads,
        max_scratch=max_scratch,
    )
