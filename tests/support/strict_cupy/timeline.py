"""What happened before what on a stand-in GPU: vector clocks of the host and each stream, the
live allocations with their last writer and readers, and the capture state.

Every operation executes at once on the CPU, so a missing event or synchronize never corrupts
data here; the clocks say whether a GPU would have ordered it. An operation on stream S first
learns what the host has seen complete (work enqueued after that is ordered after it), then
checks each allocation it touches: the last write (and, for a write, each read since) must be
S's own or known complete to S. An event carries its stream's clock at record time.
"""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from typing import Any

HOST = 0
LEGACY = 1  # the legacy default stream ("null" stream)


class StrictViolation(AssertionError):
    """Something a GPU would refuse or order differently; recorded and raised."""


class StreamOrderError(StrictViolation):
    """Memory used on one stream after another stream wrote (or read) it, with no event or
    synchronize between them."""


class CaptureError(StrictViolation):
    """An allocation, synchronize, host copy or legacy-stream use while a stream captures."""


class LaunchError(StrictViolation):
    """A launch a GPU would refuse: grid, block or pointer arguments."""


class MemoryFault(StrictViolation):
    """A device address in no live allocation (freed, or never allocated)."""


@dataclass
class Allocation:
    base: int
    size: int
    raw: Any  # the NumPy bytes (kept alive while registered)
    kind: str  # "device" or "pinned"
    # a VMM reservation: (addr, nbytes) -> whether all of it is mapped with access (its
    # physical memory is counted by the VMM stand-in, not by `size`)
    mapped: Any = None
    last_write: tuple[int, int, str] | None = None  # (agent, time, what)
    reads: dict[int, tuple[int, str]] = field(default_factory=dict)


@dataclass
class Capture:
    stream: int
    thread: int
    nodes: list[Any] = field(default_factory=list)
    broken: str | None = None


class Timeline:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.clocks: dict[int, dict[int, int]] = {HOST: {}, LEGACY: {}}
        self.names: dict[int, str] = {HOST: "the host", LEGACY: "the legacy stream"}
        self.blocking: set[int] = set()  # streams that synchronize with the legacy stream
        self._bases: list[int] = []
        self._allocs: dict[int, Allocation] = {}
        self.captures: dict[int, Capture] = {}
        self.violations: list[StrictViolation] = []
        # what the host started, in order: ("copy", kind, nbytes), ("kernel", name), ("graph",)
        # (captured work is not here: it runs inside its graph's launch)
        self.trace: list[tuple] = []
        self.physical = 0  # bytes of live VMM physical allocations (strict_cupy/vmm.py)

    # ---- agents --------------------------------------------------------------------------
    def new_stream(self, sid: int, blocking: bool) -> None:
        with self.lock:
            self.clocks[sid] = {}
            self.names[sid] = f"stream {sid:#x}"
            if blocking:
                self.blocking.add(sid)

    def fail(self, violation: StrictViolation) -> StrictViolation:
        with self.lock:
            self.violations.append(violation)
            for cap in self.captures.values():
                if cap.thread == threading.get_ident() and cap.broken is None:
                    cap.broken = str(violation)  # end_capture fails, as CUDA invalidates it
        return violation

    @staticmethod
    def _merge(into: dict[int, int], other: dict[int, int]) -> None:
        for agent, t in other.items():
            if into.get(agent, 0) < t:
                into[agent] = t

    def enqueue(self, sid: int) -> None:
        """Work enqueued on `sid` now is ordered after all the host has seen complete (and,
        between the legacy stream and blocking streams, after each other's work)."""
        with self.lock:
            clock = self.clocks[sid]
            self._merge(clock, self.clocks[HOST])
            if sid == LEGACY:
                for other in self.blocking:
                    self._merge(clock, self.clocks[other])
            elif sid in self.blocking:
                self._merge(clock, self.clocks[LEGACY])

    def host_waits(self, clock: dict[int, int]) -> None:
        with self.lock:
            self._merge(self.clocks[HOST], clock)

    def stream_waits(self, sid: int, clock: dict[int, int]) -> None:
        with self.lock:
            self._merge(self.clocks[sid], clock)

    def snapshot(self, sid: int) -> dict[int, int]:
        with self.lock:
            return dict(self.clocks[sid])

    # ---- memory --------------------------------------------------------------------------
    def register(self, alloc: Allocation) -> None:
        with self.lock:
            bisect.insort(self._bases, alloc.base)
            self._allocs[alloc.base] = alloc

    def unregister(self, base: int) -> None:
        with self.lock:
            if self._allocs.pop(base, None) is not None:
                del self._bases[bisect.bisect_left(self._bases, base)]

    def find(self, addr: int, nbytes: int = 1) -> Allocation | None:
        with self.lock:
            i = bisect.bisect_right(self._bases, addr) - 1
            if i < 0:
                return None
            alloc = self._allocs[self._bases[i]]
            end = alloc.base + max(alloc.size, 1)
            if addr + max(nbytes, 1) > end:
                return None
            if alloc.mapped is not None and not alloc.mapped(addr, max(nbytes, 1)):
                return None  # unmapped (or not yet accessible) granules of a reservation
            return alloc

    def device_bytes(self) -> int:
        with self.lock:
            plain = [a for a in self._allocs.values() if a.kind == "device" and a.mapped is None]
            return sum(a.size for a in plain) + self.physical

    def access(self, sid: int, alloc: Allocation, write: bool, what: str) -> None:
        """`what` on stream `sid` reads (or writes) `alloc`: check the order, then record it."""
        with self.lock:
            clock = self.clocks[sid]
            last = alloc.last_write
            if last is not None and last[0] != sid and clock.get(last[0], 0) < last[1]:
                raise self.fail(
                    StreamOrderError(
                        f"{what} on {self.names[sid]} uses memory that {last[2]} on "
                        f"{self.names[last[0]]} wrote, with no event or synchronize between"
                    )
                )
            if write:
                for agent, (t, reader) in alloc.reads.items():
                    if agent != sid and clock.get(agent, 0) < t:
                        raise self.fail(
                            StreamOrderError(
                                f"{what} on {self.names[sid]} overwrites memory that {reader} "
                                f"on {self.names[agent]} reads, with no event or synchronize "
                                "between"
                            )
                        )
            t = clock.get(sid, 0) + 1
            clock[sid] = t
            if write:
                alloc.last_write = (sid, t, what)
                alloc.reads = {}
            else:
                alloc.reads[sid] = (t, what)

    # ---- capture -------------------------------------------------------------------------
    def capture_of(self, sid: int) -> Capture | None:
        return self.captures.get(sid)

    def capturing_thread(self) -> Capture | None:
        """The capture the calling thread has open, if any."""
        me = threading.get_ident()
        with self.lock:
            return next((c for c in self.captures.values() if c.thread == me), None)

    def forbid_in_capture(self, what: str, sid: int | None = None) -> None:
        """`what` (an allocation, a synchronize, a host copy) may not happen in the capturing
        thread, nor on a capturing stream from any thread."""
        cap = self.capturing_thread() or (self.captures.get(sid) if sid is not None else None)
        if cap is not None:
            raise self.fail(
                CaptureError(f"{what} while {self.names[cap.stream]} is capturing a graph")
            )
