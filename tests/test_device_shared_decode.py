"""compute/device.py + compute/shared_decode.py: decode steps of clients whose weights hold the same
bytes run as one pass (each single-row MUL_MAT of all of them one product), and each client's
results keep the bits its own run gives. Plans are made of REAL native MUL_MAT steps over q8_0
weights quantized by rpcnet's quantizer; the worker is held by a gate job while the plans queue,
so what joins is decided, not raced."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.compute import device as device_module
from rpcnet.compute.buffer import DeviceBuffer
from rpcnet.compute.device import Device, OwnedPlan
from rpcnet.compute.graph import Plan
from rpcnet.compute.shared_decode import JointForm, WeightSite
from rpcnet.ggml_types import GgmlType
from support.q8_0_steps import cpu_worker, f32_vector, q8_0_matrix, q8_0_matvec_step, q8_0_row_bytes

K, M = 256, 40
ROW = q8_0_row_bytes(K)


@pytest.fixture
def device() -> Iterator[Device]:
    yield from cpu_worker()


def q8_0_weights(seed: int) -> np.ndarray:
    return q8_0_matrix(np.random.default_rng(seed).standard_normal((M, K)).astype(np.float32))


class Client:
    """One client's decode plan: two products (the second over its own other matrix)."""

    def __init__(self, device: Device, first: np.ndarray, second: np.ndarray, seed: int):
        self.weights = [first.copy(), second.copy()]  # its own copies, as each client loads
        self.buffers = [
            DeviceBuffer(i + 1, device, 0, w.nbytes, w) for i, w in enumerate(self.weights)
        ]
        self.x = np.random.default_rng(seed).standard_normal(K).astype(np.float32)
        self.mid = np.zeros(M, dtype=np.float32)
        self.out = np.zeros(M, dtype=np.float32)
        steps = [
            q8_0_matvec_step(w, K, M, self.x, out)
            for w, out in zip(self.weights, (self.mid, self.out), strict=True)
        ]
        sites = tuple(WeightSite(i, buf, 0, buf.size) for i, buf in enumerate(self.buffers))
        self.plan = Plan(list(steps), joint=JointForm(list(steps), sites))

    def results(self) -> tuple[bytes, bytes]:
        return self.mid.tobytes(), self.out.tobytes()

    def alone(self) -> tuple[bytes, bytes]:
        """Its results from a run of its own plan (nothing shared)."""
        self.plan.run()
        got = self.results()
        self.mid[:] = 0
        self.out[:] = 0
        return got


def submit_held(device: Device, jobs: list) -> tuple[list, threading.Event]:
    """Submit `jobs` while the worker is held by a gate job (so that they queue together);
    their futures, and the event that lets the worker go."""
    release, started = threading.Event(), threading.Event()

    def gate() -> None:
        started.set()
        release.wait(5)

    device.submit(gate)
    assert started.wait(5)
    return [device.submit(job) for job in jobs], release


def run_queued(device: Device, jobs: list) -> list:
    """Submit `jobs` while the worker is held by a gate, then let it go; their futures."""
    futures, release = submit_held(device, jobs)
    release.set()
    for f in futures:
        f.result(10)
    return futures


def test_clients_with_equal_weights_run_as_one_and_keep_their_bits(device: Device):
    first, second = q8_0_weights(1), q8_0_weights(2)
    clients = [Client(device, first, second, seed=10 + i) for i in range(3)]
    expected = [c.alone() for c in clients]
    assert len(set(expected)) == 3  # different activations: the check below can fail
    run_queued(device, [OwnedPlan(c.plan, owner=c) for c in clients])
    assert (device.joint_runs, device.joint_plans) == (1, 3)
    assert [c.results() for c in clients] == expected


def test_weights_that_differ_in_one_byte_are_not_shared(device: Device):
    first, second = q8_0_weights(1), q8_0_weights(2)
    other = first.copy()
    other[5 * ROW + 7] ^= 1  # one quant of one row
    a, b = Client(device, first, second, 20), Client(device, other, second, 21)
    expected = [a.alone(), b.alone()]
    assert device.joint_index.shared(a.plan, b.plan) == (1,)
    run_queued(device, [OwnedPlan(a.plan, owner=a), OwnedPlan(b.plan, owner=b)])
    # run together (the second product shared), each with its own first matrix
    assert device.joint_runs == 1
    assert [a.results(), b.results()] == expected


def test_a_write_to_the_weights_drops_the_verdict(device: Device):
    first, second = q8_0_weights(1), q8_0_weights(2)
    a, b = Client(device, first, second, 30), Client(device, first, second, 31)
    assert device.joint_index.shared(a.plan, b.plan) == (0, 1)
    b.weights[1][3] ^= 0x40  # what a SET_TENSOR does: the bytes change, the generation rises
    b.buffers[1].touched()
    assert device.joint_index.shared(a.plan, b.plan) == (0,)


def test_one_clients_plans_never_join_and_keep_their_order(device: Device):
    first, second = q8_0_weights(1), q8_0_weights(2)
    a, b = Client(device, first, second, 40), Client(device, first, second, 41)
    order: list[str] = []

    class Tagged(OwnedPlan):
        def __init__(self, client: Client, tag: str) -> None:
            super().__init__(client.plan, client)
            self.tag = tag

        def __call__(self) -> None:
            order.append(self.tag)
            super().__call__()

    run_queued(device, [Tagged(a, "a1"), Tagged(a, "a2"), Tagged(b, "b1")])
    # a1 and b1 ran as one (joint runs do not call the jobs), then a2 on its own
    assert (device.joint_runs, device.joint_plans) == (1, 2)
    assert order == ["a2"]


def test_a_job_of_no_known_client_is_not_overtaken(device: Device):
    first, second = q8_0_weights(1), q8_0_weights(2)
    a, b = Client(device, first, second, 50), Client(device, first, second, 51)
    order: list[str] = []
    run_queued(
        device,
        [OwnedPlan(a.plan, owner=a), lambda: order.append("plain"), OwnedPlan(b.plan, owner=b)],
    )
    assert device.joint_runs == 0
    assert order == ["plain"]


def test_a_failed_plan_fails_alone(device: Device):
    """A plan whose step cannot run (a GET_ROWS index out of range) fails; the plan it ran with
    finishes with its own results."""
    first, second = q8_0_weights(1), q8_0_weights(2)
    a, b = Client(device, first, second, 60), Client(device, first, second, 61)
    expected = b.alone()
    table = np.zeros((4, K), dtype=np.float32)
    rows = np.array([9], dtype=np.int32)  # out of range
    dst = np.zeros(K, dtype=np.float32)
    bad = _native.get_rows_step(
        (table.view(np.uint8), 0, (K, 4, 1, 1), (4, 4 * K, 16 * K, 16 * K)),
        GgmlType.F32,
        (rows.view(np.uint8), 0, (1, 1, 1, 1), (4, 4, 4, 4)),
        f32_vector(dst),
    )
    assert a.plan.joint is not None
    steps_a = [bad, *a.plan.joint.steps[1:]]
    # the same candidate positions: the first is no product now, the second still shared
    a.plan.joint = JointForm(steps_a, a.plan.joint.sites)
    a.plan.steps = steps_a
    (fa, fb), release = submit_held(
        device, [OwnedPlan(a.plan, owner=a), OwnedPlan(b.plan, owner=b)]
    )
    release.set()
    with pytest.raises(ValueError, match="out of range"):
        fa.result(10)
    fb.result(10)
    assert device.joint_runs == 1
    assert b.results() == expected


def test_the_worker_waits_for_a_client_whose_step_is_due(
    device: Device, monkeypatch: pytest.MonkeyPatch
):
    """A client that decoded with the head's weights a moment ago has its next step on the way:
    the worker holds the head back (up to the wait) so both run as one."""
    monkeypatch.setattr(device_module, "JOIN_WAIT_SECONDS", 2.0)
    monkeypatch.setattr(device_module, "JOIN_WAIT_SHARE", 100.0)
    first, second = q8_0_weights(1), q8_0_weights(2)
    a, b = Client(device, first, second, 70), Client(device, first, second, 71)
    expected = [a.alone(), b.alone()]
    run_queued(device, [OwnedPlan(a.plan, owner=a), OwnedPlan(b.plan, owner=b)])
    assert device.joint_runs == 1
    # a decode step (short), whose share of the wait is not the limit
    a.plan.last_seconds = b.plan.last_seconds = 0.05
    fa = device.submit(OwnedPlan(a.plan, owner=a))
    time.sleep(0.05)
    assert not fa.done()  # held back for b
    device.submit(OwnedPlan(b.plan, owner=b)).result(5)
    fa.result(5)
    assert device.joint_runs == 2
    assert [a.results(), b.results()] == expected


def test_a_client_with_other_weights_is_not_waited_for(
    device: Device, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(device_module, "JOIN_WAIT_SECONDS", 2.0)
    monkeypatch.setattr(device_module, "JOIN_WAIT_SHARE", 100.0)
    a = Client(device, q8_0_weights(1), q8_0_weights(2), 80)
    b = Client(device, q8_0_weights(3), q8_0_weights(4), 81)  # another model
    run_queued(device, [OwnedPlan(a.plan, owner=a), OwnedPlan(b.plan, owner=b)])
    assert device.joint_runs == 0
    a.plan.last_seconds = 0.05
    started = time.monotonic()
    device.submit(OwnedPlan(a.plan, owner=a)).result(5)
    assert time.monotonic() - started < 1.0  # b decoded just now, but could never join


def test_a_first_comparison_does_not_hold_up_submit(
    device: Device, monkeypatch: pytest.MonkeyPatch
):
    """The first comparison of two clients' weights reads both models (0.1-0.3 s at real
    sizes): the worker makes it with the queue unlocked, so a submit meanwhile (the event
    loop's) returns at once, and the plans still run as one."""
    first, second = q8_0_weights(1), q8_0_weights(2)
    a, b = Client(device, first, second, 90), Client(device, first, second, 91)
    expected = [a.alone(), b.alone()]
    comparing, submitted = threading.Event(), threading.Event()
    real = _native.same_weights

    def slow_same(x: Any, y: Any) -> bool:
        comparing.set()
        submitted.wait(5)  # until the submit below returned (5 s if it cannot)
        return bool(real(x, y))

    monkeypatch.setattr(_native, "same_weights", slow_same)
    (fa, fb), release = submit_held(
        device, [OwnedPlan(a.plan, owner=a), OwnedPlan(b.plan, owner=b)]
    )
    release.set()
    assert comparing.wait(5)
    t0 = time.monotonic()
    later = device.submit(lambda: None)
    waited = time.monotonic() - t0
    submitted.set()
    for f in (fa, fb, later):
        f.result(10)
    assert waited < 1.0
    assert (device.joint_runs, device.joint_plans) == (1, 2)
    assert [a.results(), b.results()] == expected
