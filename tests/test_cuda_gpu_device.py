"""The CUDA backend's memory, capture and device seams on a real GPU (marked `gpu`): staged
transfers, views, captured and replayed launches, DeviceBuffer and plans on a cuda device,
against NumPy and against the CPU device. Without CuPy or a GPU these tests fail
(CudaUnavailable), never skip.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.cuda_kernel_checks import gguf_dequant
from support.cuda_quant import dequant_q8_1, q8_1_oracle

pytestmark = pytest.mark.gpu
pytest_plugins = ["support.cuda_gpu_fixtures"]


def test_allocation_failure_returns_none(be):
    assert be.allocate(1 << 50) is None


def test_views_and_staged_round_trip(be, cp):
    nbytes = (64 << 20) + 12345  # several staging chunks and a ragged tail
    buf = be.allocate(nbytes + 4096)
    assert buf is not None
    payload = np.random.default_rng(11).integers(0, 256, nbytes, dtype=np.uint8)
    fed = 0

    def fill(view):
        nonlocal fed
        view[:] = payload[fed : fed + len(view)].tobytes()
        fed += len(view)

    be.upload(buf, 4096, nbytes, fill)
    be.synchronize()
    view = be.view(buf, 4096, (nbytes,), (1,), cp.uint8)
    assert int(cp.asnumpy(view[:16]).sum()) == int(payload[:16].sum())
    back = bytearray()
    be.download(buf, 4096, nbytes, lambda v: back.extend(bytes(v)))
    assert bytes(back) == payload.tobytes()
    f = be.view(buf, 4096, (8, 4), (16, 4), cp.float32)
    np.testing.assert_array_equal(cp.asnumpy(f), payload[: 8 * 16].view(np.float32).reshape(8, 4))
    be.fill(buf, 4096, 1024, 0)
    be.copy(buf, 4096 + 1024, buf, 4096, 1024)
    be.synchronize()
    assert not cp.asnumpy(buf[4096 : 4096 + 2048]).any()


def test_captured_matvec_replays_with_new_inputs(be, cp, real_tensors):
    """A decode-shaped plan (q8_1 quantize + MMVQ) captured once and replayed: new activation
    contents give new, correct results without recapturing."""
    from rpcnet.compute.cuda import launch
    from rpcnet.compute.cuda.capture import GraphReplayCache
    from rpcnet.compute.cuda.device import CupyCapturer

    raw, k = real_tensors["Q8_0"]
    m = raw.shape[0]
    w_dev = cp.asarray(raw)
    y_dev = cp.zeros((1, k), cp.float32)
    dst = cp.zeros((1, m), cp.float32)
    scratch = cp.zeros(launch.q8_1_bytes(k, 1), cp.uint8)
    cache = GraphReplayCache(CupyCapturer(be.stream))
    w = gguf_dequant("Q8_0", raw, k).astype(np.float64)

    def step():
        launch.matvec(be, "Q8_0", w_dev, y_dev, dst, k, m, 1, scratch)

    rng = np.random.default_rng(13)
    modes = []
    for _ in range(4):
        y = rng.standard_normal((1, k)).astype(np.float32)
        with be.device, be.stream:
            y_dev.set(y, stream=be.stream)
        modes.append(cache.run("s", "plan", frozenset({1}), True, step))
        be.synchronize()
        yq = dequant_q8_1(q8_1_oracle(y[0]))
        want, scale = w @ yq, np.abs(w) @ np.abs(yq)
        assert np.all(np.abs(cp.asnumpy(dst)[0] - want) <= 1e-5 * scale + 1e-30)
    assert modes == ["eager", "captured", "replayed", "replayed"]


def test_device_buffer_through_the_cuda_backend_seam():
    """DeviceBuffer on a cuda protocol device: staged receive in pieces, reads, fill, copy,
    host_array/write_back — the calls the session makes — byte-exact against NumPy."""
    from rpcnet.compute.buffer import DeviceBuffer
    from rpcnet.compute.cuda.serve import make_cuda_devices

    (device,) = make_cuda_devices("cuda:0", 1 << 30, None, ready=True)
    try:
        assert device.name == "CUDA0" and device.description.startswith("NVIDIA")
        free, total = device.memory_report()
        assert 0 < free <= total <= 1 << 30
        size = (20 << 20) + 777
        mem = device.allocate(size)
        buf = DeviceBuffer(1, device, 0x1000, size, mem)
        payload = np.random.default_rng(5).integers(0, 256, size - 100, dtype=np.uint8)
        fed = 0
        for piece in buf.host_sink(100, size - 100).pieces():
            piece[:] = payload[fed : fed + len(piece)].tobytes()
            fed += len(piece)
        assert fed == size - 100
        assert bytes(buf.read(100, size - 100)) == payload.tobytes()
        buf.fill(100, 64, 0xAB)
        buf.copy_from(1000, buf, 100, 64)
        assert bytes(buf.read(1000, 64)) == b"\xab" * 64
        host = buf.host_array(0, 4096)
        host[:] = 7
        buf.write_back(0, host)
        assert bytes(buf.read(0, 4096)) == b"\x07" * 4096
        sink = buf.host_sink(4096, 8192)
        sink.whole()[:] = b"\x01" * 8192
        sink.commit()
        assert bytes(buf.read(4096, 8192)) == b"\x01" * 8192
    finally:
        device.shutdown()


def test_plan_on_a_cuda_device_runs_eager_captured_replayed_like_the_cpu():
    """A decode-shaped plan (RMS_NORM, then a q8_0 and an f16 matvec, then SWIGLU) compiled for
    a cuda device by the registry, run by its PlanRunner (eager, captured, replayed), against
    the same plan on the CPU device."""
    import struct

    from rpcnet import _native
    from rpcnet.compute.buffer import DeviceBuffer
    from rpcnet.compute.cuda.serve import make_cuda_devices
    from rpcnet.compute.device import cpu_device
    from rpcnet.compute.graph import compile_plan
    from rpcnet.compute.ops import Glu, Op
    from rpcnet.compute.tensor import FLAG_COMPUTE, Tensor
    from rpcnet.ggml_types import GgmlType as T

    rng = np.random.default_rng(9)
    k, m = 512, 256
    x = rng.standard_normal(k).astype(np.float32)
    w16 = rng.standard_normal((m, k)).astype(np.float16)
    wq = rng.standard_normal((m, k)).astype(np.float32)
    import gguf.quants

    wq8 = gguf.quants.quantize(wq, gguf.GGMLQuantizationType.Q8_0)

    def build(device):
        size = 4 << 20
        buf = DeviceBuffer(1, device, 0x1000, size, device.allocate(size))
        used = [0]

        def tensor(type_, ne, op=0, params=(), src=(), data=None):
            _, block, ts, _ = _native.type_info(type_)
            nb1 = ts * ne[0] // block
            nb = (ts, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])
            raw = b"".join(
                struct.pack("<f" if isinstance(p, float) else "<i", p) for p in params
            ).ljust(64, b"\0")
            t = Tensor(
                0,
                int(type_),
                ne,
                nb,
                int(op),
                raw,
                FLAG_COMPUTE if op else 0,
                "",
                buf,
                used[0],
                tuple(src),
            )
            if data is not None:
                buf.write(t.offset, np.ascontiguousarray(data).tobytes())
            used[0] += (t.nbytes + 255) // 256 * 256
            return t

        xt = tensor(T.F32, (k, 1, 1, 1), data=x)
        n = tensor(T.F32, (k, 1, 1, 1), Op.RMS_NORM, (1e-6,), (xt,))
        g = tensor(T.F32, (m, 1, 1, 1), Op.MUL_MAT, (), (tensor(T.Q8_0, (k, m, 1, 1), data=wq8), n))
        u = tensor(T.F32, (m, 1, 1, 1), Op.MUL_MAT, (), (tensor(T.F16, (k, m, 1, 1), data=w16), n))
        out = tensor(T.F32, (m, 1, 1, 1), Op.GLU, (int(Glu.SWIGLU), 0), (g, u))
        return [n, g, u, out], buf, out

    cpu = cpu_device(0, capacity=1 << 30)
    (gpu,) = make_cuda_devices("cuda:0", 1 << 30, None, ready=True)
    try:
        nodes, cbuf, cout = build(cpu)
        compile_plan(nodes, "cpu").run()
        want = np.frombuffer(bytes(cbuf.read(cout.offset, 4 * m)), np.float32)
        nodes, gbuf, gout = build(gpu)
        plan = compile_plan(nodes, gpu.kind)
        for expected in ("eager", "captured", "replayed"):
            assert gpu.submit(gpu.plan_work(plan, "session")).result() == expected
            got = np.frombuffer(bytes(gbuf.read(gout.offset, 4 * m)), np.float32)
            # q8_1 activations on the GPU vs f32 on the CPU: the quantized-type tolerance
            assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), expected
    finally:
        gpu.shutdown()
        cpu.shutdown()


def test_granule_buffers_on_the_real_driver(be, cp):
    """CUDA virtual memory management through the real driver: a buffer of reserved granules,
    the granules a shared range covers unmapped (edges kept with their bytes) and mapped again,
    and shared content read at buffer offsets through its window."""
    assert be.shares, "this GPU supports virtual memory management: buffers should be granular"
    g = be.granule
    buf = be.allocate(4 * g)
    gm = be.granules(buf)
    assert gm is not None and gm.mapped == 4
    data = np.random.default_rng(5).integers(0, 256, 4 * g, dtype=np.uint8)
    be.to_device(buf, 0, data)
    be.synchronize()
    lo, hi = g - 64, 3 * g + 64  # a shared range over granules 1 and 2, into 0 and 3
    held = be.hold(data[lo:hi])
    assert held is not None
    assert be.same(held, data[lo:hi])
    altered = data[lo:hi].copy()
    altered[-1] ^= 1
    assert not be.same(held, altered)
    be.drop_pages(buf, lo, hi)
    assert gm.mapped == 2 and gm.handles[1] is None and gm.handles[2] is None
    assert bytes(be.to_host(buf, 0, g)) == data[:g].tobytes()  # the edge granules kept theirs
    assert bytes(be.to_host(buf, 3 * g, g)) == data[3 * g :].tobytes()
    window = be.window(held, lo)
    probe = be.view(window, g + 8, (4096,), (1,), cp.uint8)
    np.testing.assert_array_equal(cp.asnumpy(probe), data[g + 8 : g + 8 + 4096])
    assert be.restore_pages(buf, lo, hi) and gm.mapped == 4
    be.to_device(buf, g, data[g : 3 * g])  # copy on write: the content back in the buffer
    be.synchronize()
    assert bytes(be.to_host(buf, 0, 4 * g)) == data.tobytes()
