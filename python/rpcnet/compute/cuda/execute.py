"""Running plans on one GPU: its stream, the CUDA-graph replay cache, the error policy.

A `PlanRunner` is a device's `runner` (compute/device.py): it runs on the device's worker thread
(off the event loop, FIFO over all clients), so the GPU work of a plan is launched on the
device's one stream and the job ends with that stream synchronized: a command that reads a
graph's outputs waits for the job, i.e. for that stream only.

CUDA errors: a per-graph error becomes `CudaGraphError` (the connection closes that client); a
sticky one (the context is unusable) goes to `fatal`, which logs it and ends the process
non-zero so a supervisor restarts it (docs/gpu.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rpcnet.compute.cuda.capture import Capturer, GraphReplayCache
from rpcnet.compute.cuda.errors import (
    CudaGraphError,
    CudaStickyError,
    classify,
    error_status,
)

log = logging.getLogger("rpcnet.cuda")

EXIT_STICKY = 70  # EX_SOFTWARE: the supervisor restarts the server


def exit_on_sticky(exc: CudaStickyError) -> None:
    """Default `fatal`: the context is gone for every client; stop the process now."""
    log.critical("%s; exiting so that a supervisor restarts the server", exc)
    logging.shutdown()
    os._exit(EXIT_STICKY)


@contextmanager
def checked(
    error_type: type[BaseException],
    what: str,
    fatal: Callable[[CudaStickyError], None] = exit_on_sticky,
) -> Iterator[None]:
    """CUDA errors (`error_type`: CuPy's CUDARuntimeError) of a transfer on the event loop as
    our narrow errors: a per-transfer one closes the client; a sticky one goes to `fatal`."""
    try:
        yield
    except error_type as exc:
        status = error_status(exc)
        err = classify(status, what) if status is not None else CudaGraphError(str(exc))
        if isinstance(err, CudaStickyError):
            fatal(err)
        raise err from exc


class PlanRunner:
    """Device.runner for a GPU: eager / capture / replay per plan, then synchronize."""

    def __init__(
        self,
        backend: Any,
        capturer: Capturer,
        fatal: Callable[[CudaStickyError], None] = exit_on_sticky,
        kernel_count: Callable[[], int] | None = None,
    ) -> None:
        self.backend = backend
        self.kernel_count = kernel_count  # kernels launched so far (launch.launch_count)
        self.replay = GraphReplayCache(capturer)
        self.fatal = fatal
        #: per session: run mode -> [plans, seconds from launch to the stream's end, kernels]
        self.modes: dict[Hashable, dict[str, list[float]]] = {}

    def run(self, plan: Any, owner: Hashable) -> str:
        for buf in plan.written:
            buf.touched()  # derived caches of these buffers are stale from here on
        capturable = all(getattr(step, "capturable", True) for step in plan.steps)
        scatter: Callable[[], None] | None = None

        def eager() -> None:
            if scatter is not None:
                scatter()
            for step in plan.steps:
                step()

        start = time.perf_counter()
        kernels0 = self.launches()
        with self.errors():
            scatter = self.stage(plan)
            how = self.replay.run(owner, plan.uid, plan.buffers, capturable, eager)
            self.backend.synchronize("graph")
        elapsed = time.perf_counter() - start
        plan.last_seconds = elapsed  # a short one (a replayed decode step) may run inline
        self.tally(owner, how, elapsed, self.kernels_since(kernels0))
        return how

    def cursor(self, plan: Any, owner: Hashable) -> SlicedRun | None:
        """A long plan's run in slices of nodes (eager), so that other clients' steps run
        between them; None for a plan without per-node steps."""
        steps = getattr(plan, "node_steps", None)
        return None if steps is None else SlicedRun(self, plan, owner, steps)

    def stage(self, plan: Any) -> Callable[[], None] | None:
        """The step's small uploads in one copy; their scatter leads the plan's kernels."""
        stage = getattr(self.backend, "stage_params", None)
        return None if stage is None else stage(getattr(plan, "touched", None))

    @contextmanager
    def errors(self) -> Iterator[None]:
        """CUDA errors of a plan's launches and its synchronize as our narrow errors: a
        per-graph one closes that client; a sticky one goes to `fatal`."""
        try:
            yield
        except CudaStickyError as exc:
            self.fatal(exc)
            raise
        except CudaGraphError:
            raise
        except Exception as exc:
            status = error_status(exc)
            if status is None:
                raise  # not a CUDA error: a kernel's argument check, a bug (closes the client)
            err = classify(status, "graph")
            if isinstance(err, CudaStickyError):
                self.fatal(err)
            raise err from exc

    def kernels_since(self, count: int) -> int:
        """Kernels launched since the launch count was `count` (0 without a count)."""
        return self.kernel_count() - count if self.kernel_count is not None else 0

    def launches(self) -> int:
        return self.kernel_count() if self.kernel_count is not None else 0

    def tally(self, owner: Hashable, how: str, seconds: float, kernels: int) -> None:
        """Count one run of `owner`'s plan in mode `how` (for the session's closing log)."""
        tally = self.modes.setdefault(owner, {}).setdefault(how, [0, 0.0, 0])
        tally[0] += 1
        tally[1] += seconds
        tally[2] += kernels

    # Bookkeeping calls come through the device's worker too (FIFO with the plans), so the
    # replay cache is only ever touched by one thread.
    def buffer_freed(self, handle: int) -> None:
        self.replay.buffer_freed(handle)

    def owner_closed(self, owner: Hashable) -> None:
        self.replay.session_closed(owner)
        modes = self.modes.pop(owner, None)
        if modes:  # how the session's graphs ran: decode should replay
            log.info(
                "cuda graphs of a closed session: %s",
                ", ".join(
                    f"{how} {n} ({secs / n * 1e6:.0f} us, {kernels / n:.0f} kernels each)"
                    for how, (n, secs, kernels) in modes.items()
                ),
            )


class SlicedRun:
    """One run of a long plan on the GPU taken in slices (`PlanCursor`'s contract for the
    device's turns): `advance` launches steps until the plan ends or `pause()` asks for the
    device back, then waits for the stream, so that a slice's errors are its owner's and the
    next client's step finds the GPU free. At most IN_FLIGHT steps are launched ahead of the
    stream: a pause then waits for that many nodes at most, not the rest of the plan."""

    IN_FLIGHT = 8

    def __init__(
        self, runner: PlanRunner, plan: Any, owner: Hashable, steps: Sequence[Callable[[], None]]
    ) -> None:
        self.runner, self.plan, self.owner, self.steps = runner, plan, owner, steps
        self.next = 0  # the index of the step to launch next
        self.busy = 0.0  # seconds of the plan's own slices so far
        self.kernels = 0

    def advance(self, pause: Callable[[], bool]) -> bool:
        """Run steps until the end (True) or until `pause()`, asked after each step, is true."""
        runner, steps, count = self.runner, self.steps, len(self.steps)
        start = time.perf_counter()
        kernels0 = runner.launches()
        with runner.errors():
            if self.next == 0:
                for buf in self.plan.written:
                    buf.touched()
                scatter = runner.stage(self.plan)
                if scatter is not None:
                    scatter()
            ahead = 0
            while self.next < count:
                steps[self.next]()
                self.next += 1
                ahead += 1
                if ahead >= self.IN_FLIGHT:
                    runner.backend.synchronize("graph")
                    ahead = 0
                if self.next < count and pause():
                    break
            runner.backend.synchronize("graph")
        self.busy += time.perf_counter() - start
        self.kernels += runner.kernels_since(kernels0)
        if self.next < count:
            return False
        self.plan.last_seconds = self.busy
        runner.replay.ran_eager(self.owner, self.plan.uid, self.plan.buffers)
        runner.tally(self.owner, "sliced", self.busy, self.kernels)
        return True
