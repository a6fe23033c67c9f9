"""The strict CuPy stand-in (tests/support/strict_cupy) refuses what a GPU would refuse or
order differently, and the real CUDA backend's host logic (CudaBackend, CupyCopier,
CupyCapturer, the plan runner) keeps its rules: each rule is shown failing on a deliberate
mistake and passing on the backend's own code path."""

from __future__ import annotations

import numpy as np
import pytest
from rpcnet.compute.cuda import launch
from rpcnet.compute.cuda.capture import GraphReplayCache
from rpcnet.compute.cuda.device import CupyCapturer
from support.strict_cupy import (
    CaptureError,
    CudaRuntimeError,
    LaunchError,
    MemoryFault,
    StreamOrderError,
    StrictCupy,
    strict_cuda_backend,
)


@pytest.fixture
def be():
    return strict_cuda_backend()


def _f32(be, values: np.ndarray):
    mem = be.allocate(values.nbytes)
    be.to_device(mem, 0, values.tobytes())
    return mem, be.view(mem, 0, values.shape, values.strides, np.float32)


def test_the_backends_transfers_and_kernels_keep_every_rule(be):
    x = np.arange(256, dtype=np.float32).reshape(4, 64)
    _, src = _f32(be, x)
    dst_mem, dst = _f32(be, np.zeros_like(x))
    launch.cpy(be, src, dst)
    be.synchronize()
    got = np.frombuffer(be.to_host(dst_mem, 0, x.nbytes), np.float32).reshape(x.shape)
    assert np.array_equal(got, x)
    be.fill(dst_mem, 0, 64, 0)
    be.copy(dst_mem, 64, dst_mem, 0, 64)
    assert not np.frombuffer(be.to_host(dst_mem, 0, 128), np.float32).any()
    be.cp.assert_clean()
    assert [launch.kernel for launch in be.cp.launches] == ["rpc_cpy_f32_f32"]


def test_a_download_before_the_kernel_stream_is_synchronized_is_refused(be):
    x = np.ones((2, 64), np.float32)
    _, src = _f32(be, x)
    dst_mem, dst = _f32(be, np.zeros_like(x))
    launch.cpy(be, src, dst)
    with pytest.raises(StreamOrderError, match="rpc_cpy"):
        be.to_host(dst_mem, 0, x.nbytes)  # the copy stream, no wait on the kernel stream


def test_a_kernel_reading_an_upload_that_was_not_waited_for_is_refused(be):
    cp = be.cp
    x = np.ones((2, 64), np.float32)
    src_mem = be.allocate(x.nbytes)
    _, dst = _f32(be, np.zeros_like(x))  # (a later wait on the copy stream would order it)
    copier = be.staging_pool.copier
    pinned = copier.pinned(x.nbytes)
    pinned[:] = x.tobytes()
    copier.to_device_async(int(src_mem.data.ptr), pinned, x.nbytes)  # never waited on
    src = be.view(src_mem, 0, x.shape, x.strides, np.float32)
    with pytest.raises(StreamOrderError, match="a copy to the device"):
        launch.cpy(be, src, dst)
    assert len(cp.violations) == 1


def test_an_event_orders_two_streams(be):
    cp = be.cp
    x = np.ones((2, 64), np.float32)
    _, src = _f32(be, x)
    dst_mem, dst = _f32(be, np.zeros_like(x))
    launch.cpy(be, src, dst)
    done = cp.cuda.Event()
    done.record(be.stream)
    be.copy_stream.wait_event(done)  # the download is ordered after the kernel
    assert np.array_equal(np.frombuffer(be.to_host(dst_mem, 0, x.nbytes), np.float32), x.ravel())
    cp.assert_clean()


def test_test_inputs_made_on_the_legacy_stream_are_unordered_with_the_kernel_stream(be):
    x = be.cp.asarray(np.ones((2, 64), np.float32))  # an upload on the legacy stream
    _, dst = _f32(be, np.zeros((2, 64), np.float32))
    with pytest.raises(StreamOrderError, match="legacy stream"):
        launch.cpy(be, x, dst)


def _capture(be, run):
    cache = GraphReplayCache(CupyCapturer(be.stream))
    return [cache.run("s", "plan", frozenset({1}), True, run) for _ in range(3)], cache


@pytest.mark.parametrize("mistake", ["allocate", "synchronize", "host copy", "legacy stream"])
def test_capture_rules(be, mistake):
    """The capture fails (the plan runs eagerly from then on, as the runner does), and the
    violation is recorded, so a test using the device fails."""
    cp = be.cp
    _, src = _f32(be, np.ones((2, 64), np.float32))
    _, dst = _f32(be, np.zeros((2, 64), np.float32))
    other = be.allocate(64)

    def run() -> None:
        launch.cpy(be, src, dst)
        if mistake == "allocate":
            be.allocate(64)
        elif mistake == "synchronize":
            be.stream.synchronize()
        elif mistake == "host copy":
            be.to_device(other, 0, b"\0" * 8)
        else:
            cp.asarray(np.ones(4, np.float32))

    modes, cache = _capture(be, run)
    assert modes == ["eager", "eager", "eager"] and cache.stats.failed_captures == 1
    assert isinstance(cp.violations[0], CaptureError), cp.violations
    with pytest.raises(AssertionError, match="violation"):
        cp.assert_clean()


def test_a_captured_graph_runs_its_kernels_at_each_launch_not_at_capture(be):
    src_mem, src = _f32(be, np.full((2, 64), 1.0, np.float32))
    dst_mem, dst = _f32(be, np.zeros((2, 64), np.float32))
    cache = GraphReplayCache(CupyCapturer(be.stream))
    for value in (1.0, 2.0, 3.0):
        be.to_device(src_mem, 0, np.full(128, value, np.float32).tobytes())
        cache.run("s", "plan", frozenset({1}), True, lambda: launch.cpy(be, src, dst))
        be.synchronize()
        got = np.frombuffer(be.to_host(dst_mem, 0, 512), np.float32)
        assert (got == value).all()
    assert cache.stats.captures == 1 and cache.stats.replays == 1
    be.cp.assert_clean()
    assert [launch.captured for launch in be.cp.launches] == [False, True]


def test_array_code_on_a_capturing_stream_is_recorded_only_with_its_output_given(be):
    cp = be.cp
    _, x = _f32(be, np.full(8, -2.0, np.float32))
    _, out = _f32(be, np.zeros(8, np.float32))
    be.stream.begin_capture()
    with be.stream:
        cp.maximum(x, np.float32(0.5), out=out)  # recorded
        with pytest.raises(CaptureError, match="allocates"):
            cp.maximum(x, np.float32(0.5))
    with pytest.raises(CudaRuntimeError):
        be.stream.end_capture()  # invalidated by the allocation


def test_launch_limits_and_dead_pointers_are_refused(be):
    cp = be.cp
    fn = be.kernels.function("cpy", "rpc_cpy_f32_f32")
    with pytest.raises(LaunchError, match="grid"):
        with be.stream:
            fn((1, 70000), (32,), ())
    mem = be.allocate(256)
    addr = int(mem.data.ptr)
    del mem
    args = [np.uint64(addr) if c in "cp" else np.int64(1) for c in fn.kernel.signature]
    with pytest.raises(MemoryFault, match="not device memory"):
        with be.stream:
            fn((1,), (32,), args)
    assert len(cp.violations) == 2


def test_gemm_ex_column_major_arithmetic_on_the_stand_in():
    """launch.gemm_rows packs cublasGemmEx's column-major arguments for row-major operands;
    the stand-in's GemmEx computes from those arguments alone."""
    be = strict_cuda_backend(StrictCupy())
    rng = np.random.default_rng(0)
    n, k, m = 3, 64, 5
    y, w = rng.standard_normal((n, k), np.float32), rng.standard_normal((m, k), np.float32)
    w_mem, wv = _f32(be, w)
    y_mem, yv = _f32(be, y)
    out_mem, out = _f32(be, np.zeros((n, m), np.float32))
    launch.gemm_rows(be, wv, launch._CUDA_R_32F, yv, launch._CUDA_R_32F, out, n, k, m)
    be.synchronize()
    got = np.frombuffer(be.to_host(out_mem, 0, n * m * 4), np.float32).reshape(n, m)
    assert np.allclose(got, y @ w.T, rtol=1e-5, atol=1e-5)
    be.cp.assert_clean()


def test_staged_uploads_and_downloads_through_cupy_copier_in_small_chunks():
    """CupyCopier (pinned slots, async copies on the copy stream, events) under the staging
    pool's double buffering: many chunks each way, every byte right, every slot reuse waited."""
    from rpcnet.compute.cuda.device import CupyCopier
    from rpcnet.compute.cuda.staging import StagingPool

    be = strict_cuda_backend()
    pool = StagingPool(CupyCopier(be.cp, be.copy_stream), chunk=4096)
    payload = np.random.default_rng(1).integers(0, 256, 50_000, np.uint8).tobytes()
    mem = be.allocate(len(payload))
    staging = pool.acquire()
    pos = 0

    def fill(view: memoryview) -> None:
        nonlocal pos
        view[:] = payload[pos : pos + len(view)]
        pos += len(view)

    staging.upload(int(mem.data.ptr), len(payload), fill)
    back = bytearray()
    staging.download(int(mem.data.ptr), len(payload), lambda view: back.extend(view))
    pool.release(staging)
    assert bytes(back) == payload
    be.cp.assert_clean()
