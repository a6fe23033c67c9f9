"""Bookkeeping of CUDA-graph replay (compute/cuda/capture.py), with a capturer that records
what a real one would do: capturing runs nothing, launching a graph runs what was recorded."""

from __future__ import annotations

from rpcnet.compute.cuda.capture import GraphReplayCache


class RecordingCapturer:
    def __init__(self) -> None:
        self.executed: list[str] = []
        self._recording: list[str] | None = None

    def step(self, name: str) -> None:
        (self._recording if self._recording is not None else self.executed).append(name)

    def capture(self, run):
        self._recording = []
        run()
        graph, self._recording = tuple(self._recording), None
        return graph

    def launch(self, graph) -> None:
        self.executed.extend(graph)


def plan(cap: RecordingCapturer, name: str):
    return lambda: (cap.step(f"{name}.a"), cap.step(f"{name}.b"))


def test_eager_then_capture_then_replay():
    cap = RecordingCapturer()
    cache = GraphReplayCache(cap)
    run = plan(cap, "p")
    modes = [cache.run("s1", "p", frozenset({1, 2}), True, run) for _ in range(4)]
    assert modes == ["eager", "captured", "replayed", "replayed"]
    # every execution ran both kernels exactly once, in order, whatever the mode
    assert cap.executed == ["p.a", "p.b"] * 4
    assert (cache.stats.eager, cache.stats.captures, cache.stats.replays) == (1, 1, 2)


def test_uncapturable_plans_stay_eager():
    cap = RecordingCapturer()
    cache = GraphReplayCache(cap)
    modes = {cache.run("s", "p", frozenset({1}), False, plan(cap, "p")) for _ in range(5)}
    assert modes == {"eager"} and not cache.captured("p")
    assert len(cap.executed) == 10


def test_freeing_a_used_buffer_drops_the_graph():
    cap = RecordingCapturer()
    cache = GraphReplayCache(cap)
    for _ in range(2):
        cache.run("s", "p", frozenset({1, 2}), True, plan(cap, "p"))
        cache.run("t", "q", frozenset({3}), True, plan(cap, "q"))
    assert cache.captured("p") and cache.captured("q")
    assert cache.buffer_freed(2) == 1
    assert not cache.captured("p") and cache.captured("q")
    assert cache.buffer_freed(99) == 0
    assert cache.run("s", "p", frozenset({1, 4}), True, plan(cap, "p")) == "eager"


def test_a_new_graph_of_the_session_drops_its_old_one():
    cap = RecordingCapturer()
    cache = GraphReplayCache(cap)
    for _ in range(2):
        cache.run("s", "p1", frozenset({1}), True, plan(cap, "p1"))
    assert cache.captured("p1")
    assert cache.run("s", "p2", frozenset({1}), True, plan(cap, "p2")) == "eager"
    assert not cache.captured("p1")
    assert cache.stats.dropped == 1


def test_same_key_with_other_buffers_is_not_replayed():
    cap = RecordingCapturer()
    cache = GraphReplayCache(cap)
    for _ in range(2):
        cache.run("s", "p", frozenset({1}), True, plan(cap, "p"))
    assert cache.run("s", "p", frozenset({2}), True, plan(cap, "p")) == "eager"


def test_closing_a_session_drops_its_graph():
    cap = RecordingCapturer()
    cache = GraphReplayCache(cap)
    for _ in range(2):
        cache.run("s", "p", frozenset({1}), True, plan(cap, "p"))
    cache.session_closed("s")
    assert not cache.captured("p")


class FailingCapturer(RecordingCapturer):
    """A stream that cannot record the plan (a CuPy allocation, a host synchronization)."""

    def capture(self, run):
        self._recording = []
        try:
            run()
        finally:
            self._recording = None
        raise RuntimeError("cudaErrorStreamCaptureUnsupported")


def test_a_failed_capture_runs_the_plan_eagerly_from_then_on():
    cap = FailingCapturer()
    cache = GraphReplayCache(cap)
    run = plan(cap, "p")
    modes = [cache.run("s1", "p", frozenset({1}), True, run) for _ in range(4)]
    assert modes == ["eager"] * 4
    assert cap.executed == ["p.a", "p.b"] * 4  # the failed capture's run executed eagerly too
    assert cache.stats.failed_captures == 1
