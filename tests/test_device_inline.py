"""compute/device.py: a short plan that finds the device's worker idle runs on the submitting
thread (no hand-off, no wake-up of the event loop after it); anything else queues on the worker,
in order, and never runs at the same time as another job of the device."""

from __future__ import annotations

import threading

import pytest
from rpcnet.compute.device import INLINE_MAX_SECONDS, Device, OwnedPlan, cpu_device
from rpcnet.compute.graph import Plan


@pytest.fixture
def device():
    dev = cpu_device(capacity=1 << 20, threads=1)
    yield dev
    dev.shutdown()


def recording_plan(seen: list[str]) -> Plan:
    return Plan([lambda: seen.append(threading.current_thread().name)])


def test_a_plan_runs_on_the_worker_until_it_is_known_to_be_short(device: Device):
    seen: list[str] = []
    plan = recording_plan(seen)
    device.submit(plan).result(5)  # never run: its cost is unknown
    assert seen[-1].startswith("rpcnet-CPU")
    assert plan.last_seconds is not None and plan.last_seconds < INLINE_MAX_SECONDS
    done = device.submit(plan)
    assert done.done() and done.exception() is None
    assert seen[-1] == threading.current_thread().name


def test_a_long_plan_stays_on_the_worker(device: Device):
    seen: list[str] = []
    plan = recording_plan(seen)
    device.submit(plan).result(5)
    plan.last_seconds = INLINE_MAX_SECONDS * 2  # a prefill: would stall the event loop
    device.submit(plan).result(5)
    assert seen[-1].startswith("rpcnet-CPU")


def test_a_short_plan_queues_behind_busy_worker_work(device: Device):
    seen: list[str] = []
    order: list[str] = []
    plan = Plan([lambda: (order.append("short"), seen.append(threading.current_thread().name))])
    device.submit(plan).result(5)
    order.clear()
    release = threading.Event()
    started = threading.Event()

    def blocking() -> None:
        started.set()
        release.wait(5)
        order.append("blocking")

    first = device.submit(blocking)
    assert started.wait(5)
    second = device.submit(plan)  # the worker is busy: no inline run beside it
    assert not second.done()
    release.set()
    first.result(5)
    second.result(5)
    assert order == ["blocking", "short"]
    assert seen[-1].startswith("rpcnet-CPU")


def test_an_inline_failure_is_the_futures_outcome(device: Device):
    calls: list[int] = []

    def step() -> None:
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("bad row index")

    plan = Plan([step])
    device.submit(plan).result(5)
    failed = device.submit(plan)
    assert failed.done()
    with pytest.raises(ValueError, match="bad row index"):
        failed.result()
    # the device is free again: the next job is not blocked by the failed one
    assert device.submit(lambda: None).result(5) is None


def test_a_device_shared_by_two_clients_runs_their_plans_on_the_worker(device: Device):
    seen: list[str] = []
    plan = recording_plan(seen)
    first, second = object(), object()  # two sessions
    device.submit(OwnedPlan(plan, first)).result(5)
    device.submit(OwnedPlan(plan, first)).result(5)
    assert seen[-1] == threading.current_thread().name  # alone: inline
    device.submit(OwnedPlan(plan, second)).result(5)
    device.submit(OwnedPlan(plan, first)).result(5)
    # both launched within the window: served by the worker, in arrival order
    assert [name.startswith("rpcnet-CPU") for name in seen[-2:]] == [True, True]
