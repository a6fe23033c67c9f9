"""One connection's launched work, in order, across the threads that run it.

Graphs run on their device's worker, allreduce exchanges on their peer link's thread. Each job
must start after the connection's previous one, yet no thread may block waiting for another's
job: a device worker waiting for a peer would stall every client of that device, and two servers
whose workers wait for each other's peers would deadlock. So a job whose predecessor runs
elsewhere (or has not started yet) is handed to its thread from the predecessor's completion
callback; consecutive jobs on one thread are simply queued there (FIFO).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol


class Runner(Protocol):
    """A FIFO executor: a device (its worker) or a peer link (its thread)."""

    def submit(self, fn: Callable[[], None]) -> Future[None]: ...


class Chain:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tail: Future[None] | None = None
        self._tail_runner: Runner | None = None
        self._tail_queued = True  # the tail job is in its runner's queue already

    def launch(self, runner: Runner, work: Callable[[], None]) -> Future[None]:
        """Run `work` on `runner` after every job launched before; its future (the outcome)."""
        done: Future[None] = Future()
        with self._lock:
            prev = self._tail
            direct = (
                prev is None or prev.done() or (self._tail_runner is runner and self._tail_queued)
            )
            self._tail, self._tail_runner, self._tail_queued = done, runner, direct
        if direct:
            self._queue(runner, work, done)
        else:
            assert prev is not None
            prev.add_done_callback(lambda _: self._queue(runner, work, done))
        return done

    def _queue(self, runner: Runner, work: Callable[[], None], done: Future[None]) -> None:
        with self._lock:
            if self._tail is done:
                self._tail_queued = True
        try:
            inner = runner.submit(work)
        except RuntimeError as exc:  # the runner shut down (server exit, link closed)
            done.set_exception(exc)
            return
        inner.add_done_callback(lambda f: _settle(done, f))


def _settle(done: Future[None], inner: Future[None]) -> None:
    if done.done():  # cancelled by its waiter meanwhile
        return
    if inner.cancelled():
        done.cancel()
        return
    exc = inner.exception()
    if exc is not None:
        done.set_exception(exc)
    else:
        done.set_result(None)
