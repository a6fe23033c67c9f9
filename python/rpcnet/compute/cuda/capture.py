"""Replay of decode plans as captured CUDA graphs: when to capture, when a capture is stale.

A compiled plan launches the same kernels with the same arguments on every GRAPH_RECOMPUTE
(inputs change content, not addresses), so after one eager run it can be captured once into a
CUDA graph and replayed for ~1 µs per kernel instead of ~6 µs per eager launch. A captured graph
bakes in device addresses, so it is dropped when anything it points at may move: a buffer it
uses is freed, or its session compiles a new graph (a new plan key). Plans with steps that
cannot be captured (cuBLAS through CuPy, host synchronization) always run eagerly.

The CUDA work is behind `Capturer` (CuPy: `Stream.begin_capture/end_capture`, `Graph.launch`),
so this bookkeeping runs and is tested without a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger("rpcnet.cuda")


class Capturer(Protocol):
    def capture(self, run: Callable[[], None]) -> object:
        """Record what `run` launches on the stream (without executing it) into a graph."""

    def launch(self, graph: object) -> None: ...


@dataclass
class _Entry:
    buffers: frozenset[int]
    runs: int = 0
    graph: object | None = None
    eager_only: bool = False  # its capture failed: run it eagerly from then on


@dataclass
class ReplayStats:
    eager: int = 0
    captures: int = 0
    replays: int = 0
    dropped: int = 0
    failed_captures: int = 0


@dataclass
class GraphReplayCache:
    """Per device. `run()` decides eager / capture / replay for one execution of a plan."""

    capturer: Capturer
    capture_after: int = 1  # eager runs before capturing (the first proves the plan works)
    stats: ReplayStats = field(default_factory=ReplayStats)
    _plans: dict[Hashable, _Entry] = field(default_factory=dict)
    _by_session: dict[Hashable, Hashable] = field(default_factory=dict)

    def run(
        self,
        session: Hashable,
        plan_key: Hashable,
        buffers: frozenset[int],
        capturable: bool,
        run_eager: Callable[[], None],
    ) -> str:
        """Execute the plan once; returns "eager", "captured" or "replayed"."""
        entry = self._entry(session, plan_key, buffers)
        if entry.graph is not None:
            self.capturer.launch(entry.graph)
            self.stats.replays += 1
            return "replayed"
        if not capturable or entry.eager_only or entry.runs < self.capture_after:
            run_eager()
            entry.runs += 1
            self.stats.eager += 1
            return "eager"
        try:
            entry.graph = self.capturer.capture(run_eager)
        except Exception as exc:  # noqa: BLE001 - a step the stream cannot record: run eagerly
            # Capture records without executing, so nothing ran: this run is an eager one.
            log.warning("CUDA graph capture failed, the plan runs eagerly: %s", exc)
            entry.eager_only = True
            self.stats.failed_captures += 1
            run_eager()
            entry.runs += 1
            self.stats.eager += 1
            return "eager"
        self.stats.captures += 1
        self.capturer.launch(entry.graph)  # capturing records; this executes
        return "captured"

    def ran_eager(self, session: Hashable, plan_key: Hashable, buffers: frozenset[int]) -> None:
        """Count an eager run made elsewhere (a long plan run in slices) as `run` counts its
        own: the plan's next run may be captured."""
        self._entry(session, plan_key, buffers).runs += 1
        self.stats.eager += 1

    def _entry(self, session: Hashable, plan_key: Hashable, buffers: frozenset[int]) -> _Entry:
        """The plan's entry, new when its buffers changed; the session's earlier plan dropped."""
        previous = self._by_session.get(session)
        if previous is not None and previous != plan_key:
            self._drop(previous)  # the session compiled a new graph
        self._by_session[session] = plan_key
        entry = self._plans.get(plan_key)
        if entry is None or entry.buffers != buffers:
            if entry is not None:
                self._drop(plan_key)
            entry = self._plans[plan_key] = _Entry(buffers)
        return entry

    def buffer_freed(self, buffer_id: int) -> int:
        """FREE_BUFFER: drop every plan that touches the buffer; returns how many."""
        stale = [key for key, e in self._plans.items() if buffer_id in e.buffers]
        for key in stale:
            self._drop(key)
        return len(stale)

    def session_closed(self, session: Hashable) -> None:
        key = self._by_session.pop(session, None)
        if key is not None:
            self._drop(key)

    def captured(self, plan_key: Hashable) -> bool:
        entry = self._plans.get(plan_key)
        return entry is not None and entry.graph is not None

    def _drop(self, plan_key: Hashable) -> None:
        entry = self._plans.pop(plan_key, None)
        if entry is not None and entry.graph is not None:
            self.stats.dropped += 1
        for session, key in list(self._by_session.items()):
            if key == plan_key:
                del self._by_session[session]
