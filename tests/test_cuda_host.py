"""Host-side parts of the CUDA device that need no GPU: the start-up check of `--device cuda`
(a real `rpcnet serve` process), device-spec parsing, the pinned-staging bookkeeping and the
CUDA error policy."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from rpcnet.compute.cuda import errors, staging
from rpcnet.compute.cuda.probe import CudaUnavailable, gpu_count, parse_device_spec


def _serve(tmp_path, *device_args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if importlib.util.find_spec("cupy") is not None:
        # This machine has CuPy: hide it so the process meets the CuPy-less case for real.
        shadow = tmp_path / "no_cupy"
        shadow.mkdir()
        (shadow / "cupy.py").write_text("raise ImportError('No module named cupy')\n")
        env["PYTHONPATH"] = os.pathsep.join([str(shadow), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "rpcnet.cli", "serve", "--port", "0", *device_args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("device", ["cuda", "cuda:0,cuda:1", "cuda:0,cpu"])
def test_serve_cuda_without_cupy_exits_with_one_line(tmp_path, device):
    proc = _serve(tmp_path, "--device", device)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "CuPy" in lines[0]
    assert "pip install 'rpcnet[cuda12]'" in lines[0] and "'rpcnet[cuda13]'" in lines[0]
    assert proc.stdout == ""


def test_serve_unknown_device_exits_with_one_line(tmp_path):
    proc = _serve(tmp_path, "--device", "tpu:0")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "rpcnet: unknown device 'tpu:0' (available: cpu, cuda, cuda:N)"
    ]


def test_parse_device_spec():
    assert parse_device_spec("cpu") == [("cpu", None)]
    assert parse_device_spec("cuda") == [("cuda", None)]
    assert parse_device_spec("cuda:0,cuda:1") == [("cuda", 0), ("cuda", 1)]
    assert parse_device_spec("cuda:1, cpu") == [("cuda", 1), ("cpu", None)]
    for bad in ("gpu", "cuda:x", "cpu:0", "cuda:-1"):
        with pytest.raises(ValueError):
            parse_device_spec(bad)


def _runtime(driver: int, runtime: int, count: int | Exception):
    def get_count():
        if isinstance(count, Exception):
            raise count
        return count

    rt = SimpleNamespace(
        driverGetVersion=lambda: driver,
        runtimeGetVersion=lambda: runtime,
        getDeviceCount=get_count,
    )
    return SimpleNamespace(cuda=SimpleNamespace(runtime=rt))


def test_gpu_count_messages():
    """The lines for: no driver, a driver too old for CuPy's runtime, no GPU visible."""
    with pytest.raises(CudaUnavailable, match=r"^--device cuda: no NVIDIA driver found"):
        gpu_count(_runtime(0, 12080, 1))
    with pytest.raises(CudaUnavailable, match=r"supports CUDA 12\.2 but CuPy needs 13\.0"):
        gpu_count(_runtime(12020, 13000, RuntimeError("cudaErrorInsufficientDriver")))
    with pytest.raises(CudaUnavailable, match=r"no CUDA GPU is visible"):
        gpu_count(_runtime(12080, 12080, 0))
    with pytest.raises(CudaUnavailable, match=r"no CUDA GPU is visible \(cudaErrorNoDevice\)"):
        gpu_count(_runtime(12080, 12080, RuntimeError("cudaErrorNoDevice")))
    assert gpu_count(_runtime(12080, 12080, 2)) == 2
    for msg_exc in (CudaUnavailable("x"),):
        assert "\n" not in str(msg_exc)


def test_chunks_cover_exactly():
    assert list(staging.chunks(0, 4)) == []
    assert list(staging.chunks(10, 4)) == [(0, 4), (4, 4), (8, 2)]
    assert list(staging.chunks(8, 4)) == [(0, 4), (4, 4)]
    with pytest.raises(ValueError):
        list(staging.chunks(8, 0))


class HostCopier:
    """staging.Copier over a host bytearray standing in for device memory. A copy completes
    only when waited on, so a slot reused before its copy finished would corrupt the data."""

    def __init__(self, size: int) -> None:
        self.memory = bytearray(size)
        self.in_flight: dict[int, tuple] = {}
        self.allocated = 0
        self.next_token = 0
        self.max_in_flight = 0

    def pinned(self, nbytes: int) -> memoryview:
        self.allocated += nbytes
        return memoryview(bytearray(nbytes))

    def _start(self, op: tuple) -> int:
        self.next_token += 1
        self.in_flight[self.next_token] = op
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
        return self.next_token

    def to_device_async(self, dst: int, src: memoryview, nbytes: int) -> object:
        return self._start(("h2d", dst, src, nbytes))

    def to_host_async(self, dst: memoryview, src: int, nbytes: int) -> object:
        return self._start(("d2h", dst, src, nbytes))

    def wait(self, token: object) -> None:
        kind, a, b, n = self.in_flight.pop(token)  # type: ignore[call-overload]
        if kind == "h2d":
            self.memory[a : a + n] = bytes(b[:n])
        else:
            a[:n] = self.memory[b : b + n]


@pytest.mark.parametrize("total", [0, 1, 4096, 4096 * 3 + 17])
def test_staging_upload_and_download_round_trip(total):
    rng = np.random.default_rng(total)
    payload = rng.integers(0, 256, total, dtype=np.uint8).tobytes()
    copier = HostCopier(total + 64)
    st = staging.Staging(copier, chunk=4096)
    assert st.pinned_bytes == copier.allocated == 8192  # bounded: two slots, whatever the size

    fed = 0

    def fill(view: memoryview) -> None:
        nonlocal fed
        view[:] = payload[fed : fed + len(view)]
        fed += len(view)

    st.upload(32, total, fill)
    assert fed == total
    assert not copier.in_flight
    assert bytes(copier.memory[32 : 32 + total]) == payload
    assert copier.max_in_flight <= 2

    out = bytearray()
    st.download(32, total, lambda view: out.extend(bytes(view)))
    assert bytes(out) == payload
    assert copier.max_in_flight <= 2


def _payload(total: int) -> bytes:
    return np.random.default_rng(total).integers(0, 256, total, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("total", [1, 4096, 4096 * 5 + 3])
def test_staged_sink_pieces_interleaved_between_two_transfers(total):
    """Two connections receiving at once (the event loop interleaves their pieces) each get
    their own slots from the pool, and every byte lands where it belongs."""
    copier = HostCopier(2 * total + 256)
    pool = staging.StagingPool(copier, chunk=4096)
    a, b = _payload(total), _payload(total + 1)[:total][::-1]
    sinks = [staging.StagedSink(pool, 0, total), staging.StagedSink(pool, total + 128, total)]
    gens = [s.pieces() for s in sinks]
    fed = [0, 0]
    done = [False, False]
    while not all(done):
        for i, (gen, data) in enumerate(zip(gens, (a, b), strict=True)):
            if done[i]:
                continue
            view = next(gen, None)
            if view is None:
                done[i] = True
                continue
            view[:] = data[fed[i] : fed[i] + len(view)]
            fed[i] += len(view)
    assert bytes(copier.memory[:total]) == a
    assert bytes(copier.memory[total + 128 : 2 * total + 128]) == b
    assert not copier.in_flight and pool.in_use == 0
    assert pool.pinned_bytes == 2 * 2 * 4096  # two pairs were needed, both kept for reuse


def test_staged_sink_whole_then_commit_and_an_abandoned_receive():
    total = 4096 * 2 + 5
    copier = HostCopier(total)
    pool = staging.StagingPool(copier, chunk=4096, keep=1)
    sink = staging.StagedSink(pool, 0, total)
    sink.whole()[:] = _payload(total)  # a cache-file read, verified, then committed
    assert bytes(copier.memory) == bytes(total)  # nothing on the device before commit
    sink.commit()
    assert bytes(copier.memory) == _payload(total) and pool.in_use == 0

    gen = staging.StagedSink(pool, 0, total).pieces()
    next(gen)[:] = bytes(4096)  # the connection drops after one piece
    gen.close()
    assert not copier.in_flight and pool.in_use == 0  # copies finished, slots back
    assert pool.pinned_bytes == 2 * 4096  # keep=1: idle pairs beyond it are let go


def test_sticky_errors_are_told_apart():
    assert isinstance(errors.classify(700, "graph"), errors.CudaStickyError)
    assert isinstance(errors.classify(719, "graph"), errors.CudaStickyError)
    assert isinstance(errors.classify(2, "graph"), errors.CudaGraphError)  # out of memory
    assert isinstance(errors.classify(701, "graph"), errors.CudaGraphError)
    assert "cudaErrorIllegalAddress" in str(errors.classify(700, "graph compute"))


def test_kernel_type_table_matches_ggml():
    import gguf
    from rpcnet.compute.cuda import sources

    assert set(sources.WEIGHT_TYPES) == set(sources.TYPE_IDS)
    assert len(sources.WEIGHT_TYPES) == 16
    for name, type_id in sources.TYPE_IDS.items():
        assert int(gguf.GGMLQuantizationType[name]) == type_id, name
    # blocks.cuh's RpcType enum carries the same ids
    header = (sources.SRC_DIR / "blocks.cuh").read_text()
    for name, type_id in sources.TYPE_IDS.items():
        assert f"RPC_{name} = {type_id}," in header, name


def test_weight_alignment_table_matches_block_layouts():
    """A type's row alignment divides its block size (so every block of an aligned row is
    aligned) and matches the rpc_ld_u32a<A> the header uses for it."""
    import gguf
    from rpcnet.compute.cuda import sources

    header = (sources.SRC_DIR / "blocks.cuh").read_text().split("// ---- activations", 1)[0]
    for name, align in sources.WEIGHT_ALIGN.items():
        _, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
        assert nbytes % align == 0, name
        body = header.split(f"struct Blk<RPC_{name}>", 1)[1].split("template <> struct Blk<", 1)[0]
        used = {int(a) for a in re.findall(r"rpc_ld_u32a<(\d)>", body)}
        assert all(a <= align for a in used), (name, used)


def test_cuda_op_table_names_real_entry_points_and_ops():
    from rpcnet.compute import kernels  # noqa: F401 - registers the CPU kernels
    from rpcnet.compute.cuda import op_coverage, sources
    from rpcnet.compute.kernels.kernel_table import table
    from rpcnet.compute.ops import op_name

    launched = set().union(*sources.expected_kernels().values())
    cpu_ops = {op_name(k.op) for k in table("cpu")}
    for op, entries in op_coverage.op_table().items():
        assert op in cpu_ops, op
        assert entries and entries <= launched, op
    missing = op_coverage.missing_ops()
    assert "MUL_MAT" not in missing and "ADD" not in missing and "TOP_K" in missing
    on_cuda = {op_name(k.op) for k in table("cuda")}
    assert set(missing) | on_cuda == cpu_ops and not set(missing) & on_cuda


def test_pinned_slots_live_as_long_as_their_views():
    """A staging pair the pool drops frees its pinned memory (nothing else holds it)."""
    import gc
    import weakref
    from types import SimpleNamespace

    from rpcnet.compute.cuda.device import CupyCopier

    class Pinned(bytearray):  # stands in for CuPy's PinnedMemoryPointer (a buffer exporter)
        pass

    made: list[weakref.ref] = []

    def alloc_pinned_memory(n: int) -> Pinned:
        mem = Pinned(n)
        made.append(weakref.ref(mem))
        return mem

    cupy = SimpleNamespace(cuda=SimpleNamespace(alloc_pinned_memory=alloc_pinned_memory))
    copier = CupyCopier(cupy, stream=None)
    view = copier.pinned(1 << 20)
    view[:4] = b"abcd"
    gc.collect()
    assert made[0]() is not None and bytes(made[0]()[:4]) == b"abcd"
    del view
    gc.collect()
    assert made[0]() is None, "the pinned allocation outlived its view"
