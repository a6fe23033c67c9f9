"""compute/turns.py, compute/plan_run.PlanCursor and the device worker: fair turns between
clients. A long plan runs in slices of nodes and gives the device back to another client's short
step; sliced and interleaved plans give the bits they give when run whole. Plans are chains of
REAL native MUL_MAT steps over q8_0 weights quantized by rpcnet's quantizer (each node reads
the previous node's output, so a step run out of order changes the result)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from types import SimpleNamespace

import numpy as np
import pytest
from rpcnet.compute import turns
from rpcnet.compute.device import Device, OwnedPlan
from rpcnet.compute.graph import Plan, batch_native_steps
from rpcnet.compute.plan_run import PlanCursor
from rpcnet.compute.turns import Job, Turns
from support.q8_0_steps import cpu_worker, q8_0_matrix, q8_0_matvec_step

K = 256  # square products: each node's output is the next node's input


@pytest.fixture
def device() -> Iterator[Device]:
    yield from cpu_worker()


class Chain:
    """A plan of `n` products, x -> h1 -> ... -> hn, each over its own q8_0 matrix."""

    def __init__(self, n: int, seed: int, first: object = None, last: object = None) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal(K).astype(np.float32)
        self.weights = [
            q8_0_matrix(rng.standard_normal((K, K)).astype(np.float32) / 16) for _ in range(n)
        ]
        self.h = [np.zeros(K, dtype=np.float32) for _ in range(n)]
        src = self.x
        steps: list = [] if first is None else [first]
        for w, out in zip(self.weights, self.h, strict=True):
            steps.append(q8_0_matvec_step(w, K, K, src, out))
            src = out
        if last is not None:
            steps.append(last)
        self.plan = Plan(batch_native_steps(list(steps)))
        self.plan.node_steps = steps

    def results(self) -> bytes:
        return b"".join(h.tobytes() for h in self.h)

    def clear(self) -> None:
        for h in self.h:
            h[:] = 0


def test_a_sliced_plan_gives_the_bits_of_a_whole_run():
    chain = Chain(6, seed=1)
    chain.plan.run()  # the native steps folded into one run_steps call
    whole = chain.results()
    chain.clear()
    cursor = PlanCursor(chain.plan, chain.plan.node_steps)
    slices = 0
    while not cursor.advance(lambda: True):  # one node per slice
        slices += 1
    assert slices == 5
    assert chain.results() == whole
    assert chain.plan.last_seconds is not None


def test_two_plans_interleaved_node_by_node_keep_their_bits():
    a, b = Chain(5, seed=2), Chain(5, seed=3)
    alone = []
    for chain in (a, b):
        chain.plan.run()
        alone.append(chain.results())
        chain.clear()
    ca, cb = PlanCursor(a.plan, a.plan.node_steps), PlanCursor(b.plan, b.plan.node_steps)
    done = [False, False]
    while not all(done):
        for i, cursor in enumerate((ca, cb)):
            if not done[i]:
                done[i] = cursor.advance(lambda: True)
    assert [a.results(), b.results()] == alone


def test_a_short_step_of_another_client_runs_between_a_long_plans_nodes(device: Device):
    """Client A's long plan is held inside its first node while client B's short step is
    submitted: the worker runs B's step after that node, then the rest of A's plan."""
    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def gate() -> None:  # A's first node: a Python step, so the worker is inside A's plan
        order.append("A0")
        inside.set()
        release.wait(5)

    a = Chain(4, seed=4, first=gate, last=lambda: order.append("A-end"))
    b = Chain(2, seed=5)
    expected = []
    for chain in (a, b):
        release.set()
        chain.plan.run()
        expected.append(chain.results())
        chain.clear()
    release.clear()
    inside.clear()
    order.clear()
    a.plan.last_seconds = a.plan.fastest_seconds = 10.0  # long: runs in slices
    b.plan.last_seconds = b.plan.fastest_seconds = 0.001  # short: a decode step
    owner_a, owner_b = object(), object()
    waits: list[tuple[object, float]] = []
    device.wait_observer = lambda owner, seconds: waits.append((owner, seconds))

    class Recorded(OwnedPlan):
        def __call__(self) -> None:
            order.append("B")
            super().__call__()

    fa = device.submit(OwnedPlan(a.plan, owner_a))
    assert inside.wait(5)
    fb = device.submit(Recorded(b.plan, owner_b))
    release.set()
    fb.result(5)
    fa.result(5)
    assert order == ["A0", "B", "A-end"]  # B ran once A's first node was done
    assert device.slices == 1
    assert [a.results(), b.results()] == expected
    assert a.plan.last_seconds is not None and a.plan.last_seconds < 10.0  # its own time
    assert sorted(owner is owner_a for owner, _ in waits) == [False, True]
    assert all(seconds >= 0 for _, seconds in waits)


def test_one_clients_jobs_keep_their_order_behind_its_paused_plan(device: Device):
    """A client's second job waits for its first (paused between slices) even when short."""
    inside, release = threading.Event(), threading.Event()
    order: list[str] = []

    def gate() -> None:
        inside.set()
        release.wait(5)

    a = Chain(3, seed=6, first=gate)
    a.plan.last_seconds = a.plan.fastest_seconds = 10.0
    owner_a, owner_b = object(), object()

    def tagged(tag: str, owner: object):
        def fn() -> None:
            order.append(tag)

        fn.owner = owner  # type: ignore[attr-defined]
        return fn

    class Last(OwnedPlan):
        def cursor(self):  # noqa: D102 - records the end of A's plan
            inner = super().cursor()
            assert inner is not None
            advance = inner.advance

            def recorded(pause):
                finished = advance(pause)
                if finished:
                    order.append("A")
                return finished

            inner.advance = recorded  # type: ignore[method-assign]
            return inner

    fa = device.submit(Last(a.plan, owner_a))
    assert inside.wait(5)
    later_a = device.submit(tagged("A-next", owner_a))
    fb = device.submit(tagged("B", owner_b))
    release.set()
    for f in (fa, later_a, fb):
        f.result(5)
    assert order == ["B", "A", "A-next"]


def test_a_decode_step_slowed_down_once_still_goes_first():
    """What makes a plan short is its fastest run: a busy host that slows one decode step down
    does not turn the next into a long plan that takes turns with prefills."""
    chain = Chain(2, seed=7)
    work = OwnedPlan(chain.plan, object())
    assert not turns.is_short(work)  # never run, and not of a form that joins decode steps
    chain.plan.run()
    assert turns.is_short(work)
    chain.plan.last_seconds = 10 * turns.SHORT_SECONDS  # one slow run, as a busy host gives
    assert turns.is_short(work)
    chain.plan.fastest_seconds = 2 * turns.SHORT_SECONDS
    assert not turns.is_short(work)


def job(owner: object, short: bool, at: float) -> Job:
    return Job(SimpleNamespace(owner=owner), Future(), short, submitted=at)


def test_long_jobs_take_turns_and_short_ones_go_first():
    q = Turns()
    a, b, c = object(), object(), object()
    long_a, long_b = job(a, False, 0.0), job(b, False, 0.01)
    q.add(long_a)
    q.add(long_b)
    assert q.next_job(0.02) is long_a  # the one that waited longest
    long_a.cursor = object()  # started
    assert not q.should_pause(long_a, 0.021, 0.02)  # b waits, but the slice is young
    short_c = job(c, True, 0.03)
    q.add(short_c)
    assert q.should_pause(long_a, 0.04, 0.02)  # a short step of another client waits
    q.pause(long_a, 0.04)
    assert q.next_job(0.04) is short_c
    short_c.ran = 0.04
    q.finished(short_c, 0.05)
    # c's next step may be on its way: a long job waits for it (a due decode step)
    wait = q.next_job(0.05)
    assert isinstance(wait, float) and 0 < wait <= turns.DUE_WAIT_SECONDS
    # then b, which has waited longer than a since a's slice, has its turn
    assert q.next_job(0.05 + 2 * turns.DUE_WAIT_SECONDS) is long_b


def test_a_starving_long_job_gets_a_slice_ahead_of_short_ones():
    q = Turns()
    a, b = object(), object()
    long_a = job(a, False, 0.0)
    q.add(long_a)
    q.add(job(b, True, 0.0))
    assert q.next_job(turns.STARVE_SECONDS) is long_a
    # its slice is guaranteed: the queued short step does not take the device back at once
    assert not q.should_pause(long_a, turns.STARVE_SECONDS + 0.001, turns.STARVE_SECONDS)


def test_a_job_of_no_known_client_waits_for_those_before_it():
    q = Turns()
    a = object()
    first = job(a, False, 0.0)
    q.add(first)
    assert q.next_job(0.0) is first
    first.cursor = object()
    q.pause(first, 0.01)
    barrier = Job(lambda: None, Future(), True)
    q.add(barrier)
    q.add(job(object(), True, 0.02))
    assert q.eligible() == [first]  # the barrier, and what follows it, wait for a's plan


# --- a GPU's plan runner: long plans in slices on the device's stream (strict CuPy stand-in) ---


class GpuChain:
    """A plan of `n` elementwise launches on a stand-in GPU, h_i = h_{i-1} + x (f32), so a step
    run out of order or twice changes the result; `first` is an optional leading Python step."""

    def __init__(self, backend, n: int, seed: int, first=None) -> None:
        from rpcnet.compute.cuda import launch

        self.be, self.size = backend, 4 * 256
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal(256).astype(np.float32)
        self.mem = [backend.allocate(self.size) for _ in range(n + 1)]
        backend.to_device(self.mem[0], 0, self.x.tobytes())
        view = [backend.view(m, 0, (256,), (4,), np.float32) for m in self.mem]
        x = view[0]
        steps = [] if first is None else [first]
        for i in range(n):
            steps.append(lambda i=i: launch.binary(backend, "ADD", view[i], x, view[i + 1]))
        self.plan = SimpleNamespace(
            steps=steps, node_steps=steps, uid=seed, buffers=frozenset(), written=(), touched=()
        )
        self.plan.short = lambda limit: (self.plan.last_seconds or 1e9) <= limit
        self.plan.last_seconds = None
        self.plan.joint = None

    def result(self) -> np.ndarray:
        return np.frombuffer(self.be.to_host(self.mem[-1], 0, self.size), np.float32)

    def clear(self) -> None:
        for m in self.mem[1:]:
            self.be.to_device(m, 0, bytes(self.size))


def test_a_gpu_plan_in_slices_gives_the_result_of_a_whole_run():
    from rpcnet.compute.cuda.device import CupyCapturer
    from rpcnet.compute.cuda.execute import PlanRunner, SlicedRun
    from support.strict_cupy import strict_cuda_backend

    be = strict_cuda_backend()
    runner = PlanRunner(be, CupyCapturer(be.stream), fatal=lambda exc: pytest.fail(str(exc)))
    chain = GpuChain(be, 2 * SlicedRun.IN_FLIGHT + 3, seed=7)
    runner.run(chain.plan, "a")
    whole = chain.result().copy()
    np.testing.assert_allclose(whole, chain.x * (2 * SlicedRun.IN_FLIGHT + 4), rtol=1e-5)
    chain.clear()
    events: list[str] = []
    synchronize = be.synchronize
    be.synchronize = lambda what: (events.append("sync"), synchronize(what))[1]
    chain.plan.steps = chain.plan.node_steps = [
        lambda s=s: (events.append("node"), s())[1] for s in chain.plan.steps
    ]
    cursor = runner.cursor(chain.plan, "a")
    assert cursor is not None
    slices = 0
    while not cursor.advance(lambda: True):  # one node per slice
        slices += 1
        # each slice ends with the stream drained: the next client finds the GPU free
        assert events[-2:] == ["node", "sync"]
    assert slices == len(chain.plan.steps) - 1
    assert np.array_equal(chain.result(), whole)
    assert runner.modes["a"]["sliced"][0] == 1
    assert chain.plan.last_seconds is not None
    # without pauses, at most IN_FLIGHT nodes are launched ahead of the stream
    chain.clear()
    events.clear()
    cursor = runner.cursor(chain.plan, "a")
    assert cursor is not None and cursor.advance(lambda: False)
    assert np.array_equal(chain.result(), whole)
    runs = "".join("n" if e == "node" else "|" for e in events).split("|")
    assert max(len(r) for r in runs) == SlicedRun.IN_FLIGHT
    be.cp.assert_clean()


def test_a_gpu_long_plan_lets_another_clients_step_run_between_its_nodes():
    """As on the CPU: client A's long plan on the GPU is held inside its first node while
    client B's short step is submitted; B runs after that node, then the rest of A."""
    from support.strict_cupy import strict_cuda_device

    device = strict_cuda_device(1 << 26)
    be = device.backend
    order: list[str] = []
    inside, release = threading.Event(), threading.Event()

    def gate() -> None:
        order.append("A0")
        inside.set()
        release.wait(5)

    try:
        a = GpuChain(be, 12, seed=8, first=gate)
        b = GpuChain(be, 3, seed=9)
        expected = []
        for chain in (a, b):
            release.set()
            device.runner.run(chain.plan, "warm")
            expected.append(chain.result().copy())
            chain.clear()
        release.clear()
        inside.clear()
        order.clear()
        a.plan.last_seconds = 10.0  # long: runs in slices
        b.plan.last_seconds = 0.001  # short: a decode step
        owner_a, owner_b = object(), object()
        b.plan.steps = [lambda: order.append("B"), *b.plan.steps]
        a.plan.steps.append(lambda: order.append("A-end"))  # node_steps: the same list
        fa = device.submit(device.plan_work(a.plan, owner_a))
        assert inside.wait(5)
        fb = device.submit(device.plan_work(b.plan, owner_b))
        release.set()
        fb.result(5)
        fa.result(5)
        assert order == ["A0", "B", "A-end"]  # B ran once A's first node was done
        assert device.slices >= 1
        assert [np.array_equal(c.result(), e) for c, e in zip((a, b), expected, strict=True)] == [
            True,
            True,
        ]
        assert a.plan.last_seconds < 10.0
        be.cp.assert_clean()
    finally:
        device.shutdown()
