"""Serving cuda devices, host side (no GPU): the protocol devices `--device` builds, the plan
runner's eager/capture/replay decisions and its CUDA error policy, and the session's calls
into them (GET_DEVICE_MEMORY, FREE_BUFFER, close).

CuPy is the strict stand-in (tests/support/strict_cupy) as a machine with two H200s.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest
from rpcnet.compute.cuda import sources
from rpcnet.compute.cuda.errors import CudaGraphError, CudaStickyError
from rpcnet.compute.cuda.execute import PlanRunner
from rpcnet.compute.cuda.probe import CudaUnavailable
from rpcnet.compute.cuda.serve import make_cuda_devices
from rpcnet.compute.graph import Plan
from rpcnet.protocol import messages as msg
from rpcnet.server.session import Session
from support.strict_cupy import GIB, StrictCupy


def _pair(payload: bytes) -> tuple[int, int]:
    return struct.unpack("<QQ", payload)


def fake_cupy(n_gpus: int = 2, free: int = 100 * GIB, total: int = 140 * GIB) -> StrictCupy:
    """The strict stand-in as a machine with `n_gpus` H200s, `free` bytes free on each."""
    cupy = StrictCupy(n_gpus=n_gpus, total=total)
    cupy.free_override = free
    return cupy


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("cuda", ["CUDA0", "CUDA1"]),
        ("cuda:1,cuda:0", ["CUDA1", "CUDA0"]),
        ("cuda:0,cpu", ["CUDA0", "CPU"]),
    ],
)
def test_devices_for_each_spec(spec, names):
    cupy = fake_cupy()
    devices = make_cuda_devices(spec, 64 * GIB, 2, cupy=cupy, ready=True)
    try:
        assert [d.name for d in devices] == names
        assert [d.index for d in devices] == list(range(len(names)))
        for d in devices:
            assert d.memory.capacity == 64 * GIB  # --mem caps the GPU's 140 GiB
            if d.name.startswith("CUDA"):
                assert d.description == "NVIDIA H200"
                assert d.kind == "cuda" and d.runner is not None
            else:
                assert d.kind == "cpu" and d.runner is None
    finally:
        for d in devices:
            d.shutdown()


def test_every_module_is_compiled_before_the_first_client():
    cupy = fake_cupy(n_gpus=1)
    (device,) = make_cuda_devices("cuda:0", None, None, cupy=cupy, ready=True)
    device.shutdown()
    assert sorted(cupy.compiled) == sources.module_names()


def test_not_ready_names_the_gpus_in_one_line():
    cupy = fake_cupy()
    with pytest.raises(CudaUnavailable) as info:
        make_cuda_devices("cuda", None, None, cupy=cupy, ready=False)
    text = str(info.value)
    assert "\n" not in text
    assert "CUDA0 (NVIDIA H200), CUDA1 (NVIDIA H200)" in text
    assert "RPCNET_CUDA_EXPERIMENTAL=1" in text


def test_gpu_index_out_of_range_is_one_line():
    cupy = fake_cupy(n_gpus=1)
    with pytest.raises(CudaUnavailable, match=r"only 1 GPU\(s\) visible"):
        make_cuda_devices("cuda:0,cuda:3", None, None, cupy=cupy, ready=True)


def test_get_device_memory_reports_the_gpu_free_memory_capped_by_mem():
    cupy = fake_cupy()
    devices = make_cuda_devices("cuda:0", None, None, cupy=cupy, ready=True)
    try:
        session = Session(8, devices)
        ask = msg.u32(0)
        assert _pair(session.get_device_memory(ask)) == (100 * GIB, 140 * GIB)
        cupy.free_override = 3 * GIB  # another process took GPU memory
        assert _pair(session.get_device_memory(ask)) == (3 * GIB, 140 * GIB)
    finally:
        devices[0].shutdown()


# ------------------------------------------------------------------ the plan runner


class RecordingCapturer:
    def __init__(self) -> None:
        self.captured = 0
        self.launched = 0

    def capture(self, run):
        self.captured += 1
        return ("graph", self.captured)  # recorded, not executed

    def launch(self, graph) -> None:
        self.launched += 1


class Backend:
    def __init__(self) -> None:
        self.syncs = 0

    def synchronize(self, what: str = "") -> None:
        self.syncs += 1


def _plan(steps, handles=frozenset({7})) -> Plan:
    return Plan(list(steps), frozenset(handles))


def test_runner_runs_eagerly_then_captures_then_replays_and_syncs_every_time():
    ran = []
    be, cap = Backend(), RecordingCapturer()
    runner = PlanRunner(be, cap, fatal=lambda exc: pytest.fail(f"fatal {exc}"))
    plan = _plan([lambda: ran.append(1)])
    owner = object()
    assert runner.run(plan, owner) == "eager"
    assert runner.run(plan, owner) == "captured"
    assert runner.run(plan, owner) == "replayed"
    assert ran == [1] and cap.captured == 1 and cap.launched == 2 and be.syncs == 3
    runner.buffer_freed(7)  # FREE_BUFFER of a buffer the graph uses: recapture after one run
    assert runner.run(plan, owner) == "eager"
    other = _plan([lambda: ran.append(2)])
    runner.run(plan, owner)
    assert runner.replay.captured(plan.uid)
    runner.run(other, owner)  # a new graph of the session drops the captured one
    assert not runner.replay.captured(plan.uid)


def test_submitted_plan_work_reports_the_runner_mode():
    """The future of `submit(plan_work(...))`, as a session launches a graph, carries what the
    runner did (eager, captured, replayed): the device check reads it."""
    cupy = fake_cupy()
    (device,) = make_cuda_devices("cuda:0", None, None, cupy=cupy, ready=True)
    device.runner = PlanRunner(Backend(), RecordingCapturer(), fatal=lambda e: pytest.fail("fatal"))
    try:
        plan = _plan([lambda: None])
        modes = [device.submit(device.plan_work(plan, "session")).result() for _ in range(3)]
        assert modes == ["eager", "captured", "replayed"]
    finally:
        device.shutdown()


def test_a_short_gpu_plan_runs_inline_when_the_device_is_idle():
    """A replayed decode step skips the hand-off to the worker thread (and the event loop's
    wake-up after it), as a short CPU plan does."""
    import threading

    cupy = fake_cupy()
    (device,) = make_cuda_devices("cuda:0", None, None, cupy=cupy, ready=True)
    device.runner = PlanRunner(Backend(), RecordingCapturer(), fatal=lambda e: pytest.fail("fatal"))
    threads: list[int] = []

    def step() -> None:
        threads.append(threading.get_ident())

    step.capturable = False  # type: ignore[attr-defined]  # every run executes the step
    try:
        plan = _plan([step])
        device.submit(device.plan_work(plan, "session")).result()  # never run: the worker runs it
        assert plan.last_seconds is not None
        device.submit(device.plan_work(plan, "session")).result()  # short now: inline
        device.submit(device.plan_work(plan, "session")).result()
        me = threading.get_ident()
        assert threads[0] != me and threads[1:] == [me, me]
    finally:
        device.shutdown()


def test_runner_keeps_plans_with_cublas_steps_eager():
    def prefill() -> None:
        pass

    prefill.capturable = False  # type: ignore[attr-defined]
    cap = RecordingCapturer()
    runner = PlanRunner(Backend(), cap, fatal=lambda exc: pytest.fail("fatal"))
    plan = _plan([prefill])
    assert [runner.run(plan, "s") for _ in range(3)] == ["eager"] * 3
    assert cap.captured == 0


class FakeCudaError(RuntimeError):
    def __init__(self, status: int) -> None:
        super().__init__(f"cudaError {status}")
        self.status = status


def _failing(status: int):
    def step() -> None:
        raise FakeCudaError(status)

    return step


def test_a_per_graph_cuda_error_fails_the_graph_only():
    fatal = []
    runner = PlanRunner(Backend(), RecordingCapturer(), fatal=fatal.append)
    with pytest.raises(CudaGraphError, match="CUDA error 2 during graph"):
        runner.run(_plan([_failing(2)]), "s")
    assert fatal == []


def test_a_sticky_cuda_error_goes_to_fatal():
    fatal = []
    runner = PlanRunner(Backend(), RecordingCapturer(), fatal=fatal.append)
    with pytest.raises(CudaStickyError, match="cudaErrorIllegalAddress"):
        runner.run(_plan([_failing(700)]), "s")
    assert len(fatal) == 1 and isinstance(fatal[0], CudaStickyError)


def test_session_feeds_the_runner_free_buffer_and_close():
    cupy = fake_cupy()
    (device,) = make_cuda_devices("cuda:0", None, None, cupy=cupy, ready=True)
    calls = []
    device.runner = SimpleNamespace(
        buffer_freed=lambda h: calls.append(("freed", h)),
        owner_closed=lambda o: calls.append(("closed", o)),
    )
    device.backend = SimpleNamespace(
        name="cuda", host_resident=False, allocate=lambda n: bytearray(n), free=lambda m: None
    )
    try:
        session = Session(8, [device])
        handle, _ = _pair(session.alloc_buffer(msg.alloc_request(0, 4096)))
        session.free_buffer(msg.u64(handle))
        session.close()
        device.submit(lambda: None).result()  # the worker has done the bookkeeping
        assert calls == [("freed", handle), ("closed", session)]
    finally:
        device.shutdown()


def test_transfer_errors_close_the_client_or_stop_the_server():
    from rpcnet.compute.cuda.execute import checked

    fatal = []
    with pytest.raises(CudaGraphError, match="during upload"):
        with checked(FakeCudaError, "upload", fatal.append):
            raise FakeCudaError(1)  # cudaErrorInvalidValue: this transfer only
    assert fatal == []
    with pytest.raises(CudaStickyError, match="cudaErrorLaunchFailure"):
        with checked(FakeCudaError, "download", fatal.append):
            raise FakeCudaError(719)
    assert len(fatal) == 1
    with checked(FakeCudaError, "memset", fatal.append):
        pass  # no error, nothing raised
