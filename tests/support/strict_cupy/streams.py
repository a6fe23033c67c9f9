"""Streams, events, graphs and the current stream of the strict stand-in (CuPy's `cuda.Stream`,
`cuda.Event`, `cuda.graph.Graph`)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

from support.strict_cupy.timeline import HOST, LEGACY, Capture, CaptureError, Timeline

_ptrs = itertools.count(0x5000, 0x10)


class CudaRuntimeError(RuntimeError):
    """CuPy's CUDARuntimeError: `status` is the cudaError_t."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"{text} ({status})")
        self.status = status


STREAM_CAPTURE_INVALIDATED = 901


class CurrentStream(threading.local):
    def __init__(self) -> None:
        self.stack: list[int] = []

    @property
    def sid(self) -> int:
        return self.stack[-1] if self.stack else LEGACY


class Graph:
    """A captured graph: the recorded operations, run in order on the stream it is launched on."""

    def __init__(self, timeline: Timeline, nodes: list[Callable[[int], None]]) -> None:
        self.timeline = timeline
        self.nodes = nodes

    def launch(self, stream: Stream | None = None) -> None:
        sid = stream.sid if stream is not None else LEGACY
        self.timeline.forbid_in_capture("a graph launch", sid)
        self.timeline.trace.append(("graph",))
        for node in self.nodes:
            self.timeline.enqueue(sid)
            node(sid)


class Stream:
    def __init__(self, timeline: Timeline, current: CurrentStream, non_blocking: bool = False):
        self.timeline = timeline
        self.current = current
        self.ptr = next(_ptrs)
        self.sid = self.ptr
        timeline.new_stream(self.sid, blocking=not non_blocking)

    def __enter__(self) -> Stream:
        self.current.stack.append(self.sid)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.current.stack.pop()

    def synchronize(self) -> None:
        self.timeline.forbid_in_capture("a stream synchronize", self.sid)
        self.timeline.host_waits(self.timeline.snapshot(self.sid))

    def wait_event(self, event: Event) -> None:
        self.timeline.stream_waits(self.sid, event.clock)

    def record(self, event: Event | None = None) -> Event:
        event = event if event is not None else Event(self.timeline, self.current)
        event.record(self)
        return event

    def is_capturing(self) -> bool:
        return self.timeline.capture_of(self.sid) is not None

    def begin_capture(self, mode: Any = None) -> None:
        tl = self.timeline
        with tl.lock:
            if tl.capture_of(self.sid) is not None:
                raise tl.fail(CaptureError(f"{tl.names[self.sid]} is capturing already"))
            tl.captures[self.sid] = Capture(self.sid, threading.get_ident())

    def end_capture(self) -> Graph:
        tl = self.timeline
        with tl.lock:
            cap = tl.captures.pop(self.sid, None)
        if cap is None:
            raise tl.fail(CaptureError(f"end_capture on {tl.names[self.sid]}, not capturing"))
        if cap.broken is not None:
            raise CudaRuntimeError(STREAM_CAPTURE_INVALIDATED, "cudaErrorStreamCaptureInvalidated")
        return Graph(tl, cap.nodes)


class Event:
    def __init__(
        self,
        timeline: Timeline,
        current: CurrentStream,
        block: bool = False,
        disable_timing: bool = False,
        interprocess: bool = False,
    ) -> None:
        self.timeline = timeline
        self.current = current
        self.clock: dict[int, int] = {}

    def record(self, stream: Stream | None = None) -> None:
        sid = stream.sid if stream is not None else self.current.sid
        self.timeline.enqueue(sid)
        self.clock = self.timeline.snapshot(sid)

    def synchronize(self) -> None:
        self.timeline.forbid_in_capture("an event synchronize")
        self.timeline.host_waits(self.clock)

    def query(self) -> bool:
        self.timeline.host_waits(self.clock)  # every operation has finished on the CPU
        return True


class DeviceContext:
    """`cuda.Device(i)`: a context manager; `synchronize()` waits for every stream."""

    def __init__(self, timeline: Timeline, index: int) -> None:
        self.timeline = timeline
        self.id = index

    def __enter__(self) -> DeviceContext:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def synchronize(self) -> None:
        tl = self.timeline
        tl.forbid_in_capture("a device synchronize")
        for sid in list(tl.clocks):
            if sid != HOST:
                tl.host_waits(tl.snapshot(sid))
