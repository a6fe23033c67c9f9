"""The CUDA backend on CuPy: allocations, views at byte offsets, transfers, kernels, one stream.

Everything here imports CuPy lazily (through `probe.check_cuda`), so `import
rpcnet.compute.cuda.device` works on machines without CuPy; constructing a backend there raises
`CudaUnavailable` with one line saying what is missing.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from rpcnet.compute import host_pages
from rpcnet.compute.cuda import sources, vmm
from rpcnet.compute.cuda.errors import CudaGraphError, classify, error_status
from rpcnet.compute.cuda.execute import checked
from rpcnet.compute.cuda.granules import GranuleMap, reserve
from rpcnet.compute.cuda.params import SMALL, DeferredSink, ParamBlock, PendingWrites
from rpcnet.compute.cuda.probe import check_cuda
from rpcnet.compute.cuda.staging import DEFAULT_CHUNK, StagedSink, Staging, StagingPool
from rpcnet.compute.shared_content import enabled as sharing_enabled

# cudaMemcpyKind
_H2D, _D2H, _D2D = 1, 2, 3

#: True once the server's buffers and graphs go through the backend seam (see docs/gpu.md).
SERVING_READY = False


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str  # e.g. "NVIDIA H200"
    capability: tuple[int, int]
    total: int
    free: int


class CupyCopier:
    """staging.Copier on one CuPy stream: pinned host memory and async copies with events."""

    def __init__(self, cupy: ModuleType, stream: Any, device: Any = None) -> None:
        self.cp = cupy
        self.stream = stream
        # the stream's GPU is made current for each call: transfers run on the event loop and,
        # for cache hits, on worker threads, whose current device may be another GPU
        self.device = device if device is not None else contextlib.nullcontext()

    def pinned(self, nbytes: int) -> memoryview:
        """A view of new pinned host memory, which lives exactly as long as the view (the
        array under it holds the allocation): a staging pair dropped by its pool frees it."""
        import numpy as np

        mem = self.cp.cuda.alloc_pinned_memory(nbytes)
        return np.frombuffer(mem, dtype=np.uint8, count=nbytes).data

    def _host_ptr(self, view: memoryview) -> int:
        import numpy as np

        return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)

    def _event(self) -> Any:
        event = self.cp.cuda.Event(block=False, disable_timing=True)
        event.record(self.stream)
        return event

    def to_device_async(self, dst: int, src: memoryview, nbytes: int) -> object:
        with self.device, checked(self.cp.cuda.runtime.CUDARuntimeError, "upload"):
            rt = self.cp.cuda.runtime
            rt.memcpyAsync(dst, self._host_ptr(src), nbytes, _H2D, self.stream.ptr)
            return self._event()

    def to_host_async(self, dst: memoryview, src: int, nbytes: int) -> object:
        with self.device, checked(self.cp.cuda.runtime.CUDARuntimeError, "download"):
            rt = self.cp.cuda.runtime
            rt.memcpyAsync(self._host_ptr(dst), src, nbytes, _D2H, self.stream.ptr)
            return self._event()

    def wait(self, token: object) -> None:
        with self.device, checked(self.cp.cuda.runtime.CUDARuntimeError, "transfer"):
            token.synchronize()  # type: ignore[attr-defined]


def _cached(cache: dict[str, Any], key: str, make: Callable[[], Any]) -> Any:
    """cache[key], made by `make` the first time."""
    value = cache.get(key)
    if value is None:
        value = cache[key] = make()
    return value


class KernelLibrary:
    """The CUDA C modules of src/, compiled with NVRTC (CuPy's RawModule) on first use."""

    def __init__(self, cupy: ModuleType, capability: tuple[int, int]) -> None:
        self.cp = cupy
        self.capability = capability  # CuPy compiles for the current device's architecture
        self.options = sources.COMPILE_OPTIONS
        self._modules: dict[str, Any] = {}
        self._functions: dict[str, Any] = {}
        self._lock = threading.Lock()

    def module(self, name: str) -> Any:
        with self._lock:
            return _cached(
                self._modules,
                name,
                lambda: self.cp.RawModule(
                    code=sources.module_source(name), options=self.options, backend="nvrtc"
                ),
            )

    def function(self, module: str, kernel: str) -> Any:
        key = f"{module}.{kernel}"
        return _cached(self._functions, key, lambda: self.module(module).get_function(kernel))

    def warm(self) -> None:
        """Compile every module now (server start), not during a client's first graph: a
        RawModule compiles lazily, on its first function lookup, unless told to."""
        for name in sources.module_names():
            self.module(name).compile()


class CudaBackend:
    """One GPU: compute.backend.Backend on CuPy (allocate, view, copy, fill, sync, host sink)."""

    name = "cuda"
    host_resident = False

    def __init__(self, index: int, cupy: ModuleType | None = None) -> None:
        if cupy is None:
            cupy, _ = check_cuda([index])
        self.cp = cupy
        self.index = index
        self.device = cupy.cuda.Device(index)
        with self.device:
            self.stream = cupy.cuda.Stream(non_blocking=True)  # kernels, graph replays
            # Transfers come from the event loop while the worker may be capturing a CUDA graph
            # on `stream`: on their own stream they are never recorded into it.
            self.copy_stream = cupy.cuda.Stream(non_blocking=True)
            props = cupy.cuda.runtime.getDeviceProperties(index)
            free, total = cupy.cuda.runtime.memGetInfo()
        name = props["name"]
        self.info = GpuInfo(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            capability=(int(props["major"]), int(props["minor"])),
            total=int(total),
            free=int(free),
        )
        self.kernels = KernelLibrary(cupy, self.info.capability)
        self._staging: StagingPool | None = None
        self._scratch: dict[str, Any] = {}
        self._scratch_lock = threading.Lock()
        # small uploads wait here for the next plan or flush (params.py)
        self.pending = PendingWrites()
        self._graph_params: ParamBlock | None = None  # the kernel stream's: plans scatter it
        self._eager_params: ParamBlock | None = None  # the copy stream's: flush scatters it
        self._flush_lock = threading.Lock()
        # CUDA VMM (vmm.py): buffers of reserved granules, whose shared ranges give memory back
        with self.device:
            found = vmm.load(cupy, index)
        self._vmm: vmm.VmmDriver | None = found[0] if found is not None else None
        self.granule = found[1] if found is not None else 0
        self._granular: dict[int, GranuleMap] = {}  # buffer address -> its granules

    # ---- memory -----------------------------------------------------------------------
    def allocate(self, nbytes: int) -> Any | None:
        """A buffer as a uint8 array; None when the GPU cannot hold it. One of at least a
        granule, where weights may be shared, is a reserved range of granules (granules.py);
        any other is one cudaMalloc (not CuPy's pool, not managed memory)."""
        if self._vmm is not None and nbytes >= self.granule and sharing_enabled():
            return self._reserve(nbytes)
        return self._malloc(nbytes)

    def _malloc(self, nbytes: int) -> Any | None:
        cp = self.cp
        try:
            with self.device:
                mem = cp.cuda.Memory(max(nbytes, 1))
        except cp.cuda.memory.OutOfMemoryError:
            return None
        except cp.cuda.runtime.CUDARuntimeError as exc:
            if error_status(exc) == 2:  # cudaErrorMemoryAllocation
                return None
            raise
        return cp.ndarray((nbytes,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))

    def _reserve(self, nbytes: int) -> Any | None:
        assert self._vmm is not None
        cp = self.cp
        with self.device:
            gm = reserve(self._vmm, self.index, nbytes, self.granule)
        if gm is None:
            return None
        # CuPy keeps `lifetime` while a view of the array lives; the range goes with the last
        lifetime = _Lifetime()
        weakref.finalize(lifetime, gm.close)
        mem = cp.cuda.UnownedMemory(gm.base, gm.size, lifetime, self.index)
        self._granular[gm.base] = gm
        return cp.ndarray((nbytes,), dtype=cp.uint8, memptr=cp.cuda.MemoryPointer(mem, 0))

    def free(self, buf: Any) -> None:
        # cudaFree (or the range's unmap) when the last view of the allocation goes (CuPy's
        # Memory); writes still pending for it must not land in whatever takes its address next
        ptr = int(buf.data.ptr)
        self.pending.discard(ptr, ptr + int(buf.nbytes))
        self._granular.pop(ptr, None)

    # ---- shared weights (compute/shared_content.py) -------------------------------------
    @property
    def shares(self) -> bool:
        return self._vmm is not None

    def can_share(self, mem: Any) -> bool:
        return int(mem.data.ptr) in self._granular

    def drop_pages(self, mem: Any, start: int, end: int) -> None:
        """Unmap the granules wholly inside mem[start:end] and release their memory."""
        gm = self._granular.get(int(mem.data.ptr))
        if gm is None:
            return
        lo, hi = -(-start // gm.granule), end // gm.granule
        if hi <= lo:
            return
        self.flush()  # a small write still pending for the range lands before, not after
        with self.device, checked(self.cp.cuda.runtime.CUDARuntimeError, "unmap"):
            self.copy_stream.synchronize()  # no transfer of ours is using the range
            gm.unmap(lo, hi)

    def restore_pages(self, mem: Any, start: int, end: int) -> bool:
        """Map new memory where granules of mem[start:end] were unmapped (copy on write);
        False when the GPU has none."""
        gm = self._granular.get(int(mem.data.ptr))
        if gm is None:
            return True
        hi = min(-(-end // gm.granule), len(gm.handles))
        with self.device:
            return gm.map(start // gm.granule, hi)

    def granules(self, mem: Any) -> GranuleMap | None:
        """The granules of a reserved buffer (None: a cudaMalloc)."""
        return self._granular.get(int(mem.data.ptr))

    def hold(self, data: Any) -> Any | None:
        """Shared content: one device allocation holding host uint8 `data`."""
        held = self._malloc(int(data.nbytes))
        if held is not None:
            self.to_device(held, 0, data)
        return held

    def same(self, held: Any, data: Any) -> bool:
        """Compare held content with host bytes, chunk by chunk through the staging buffers:
        no second device copy, no host copy of the content."""
        import numpy as np

        host = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        if int(held.nbytes) != host.nbytes:
            return False
        pos, equal = 0, True

        def emit(view: memoryview) -> None:
            nonlocal pos, equal
            n = len(view)
            chunk = np.frombuffer(view, dtype=np.uint8)
            equal = equal and host_pages.same_bytes(chunk, host[pos : pos + n])
            pos += n

        self.download(held, 0, host.nbytes, emit)
        return equal

    def window(self, held: Any, start: int) -> Any:
        """`held` addressed by buffer offsets: a uint8 array whose pointer is `start` bytes
        before the content (CuPy checks no bounds; nothing below `start` is ever addressed)."""
        cp = self.cp
        return cp.ndarray((start + int(held.nbytes),), dtype=cp.uint8, memptr=held.data + -start)

    def view(
        self, buf: Any, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: Any
    ) -> Any:
        """A typed view of `buf` at byte `offset` with byte `strides` (ggml's nb, reversed)."""
        return self.cp.ndarray(shape, dtype=dtype, memptr=buf.data + offset, strides=strides)

    def scratch(self, kind: str, nbytes: int, zeroed: bool = False) -> Any | None:
        """Plan scratch shared by every plan of this GPU (they run one after another on its
        stream): the current `kind` buffer if it is large enough, else a larger one that
        replaces it. Plans keep the buffer they were built with alive, so a captured graph never
        points at freed memory; the old one goes with the last plan that uses it. `zeroed`: a
        new buffer is zeroed before it is handed out (kernels that leave it zeroed, e.g.
        per-group counters, may then rely on it)."""
        with self._scratch_lock:
            cur = self._scratch.get(kind)
            if cur is None or cur.size < nbytes:
                cur = self._malloc(nbytes)
                if cur is None:
                    return None
                if zeroed:
                    self.fill(cur, 0, nbytes, 0)
                self._scratch[kind] = cur
            return cur

    def free_memory(self) -> tuple[int, int]:
        with self.device:
            free, total = self.cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    # ---- the parameter block (params.py) ------------------------------------------------
    def defer(self, dst: int, data: Any) -> None:
        """Hold a small upload for the next plan that reads it, or the next flush."""
        if not self.pending.add(dst, data):
            self.flush()
            if not self.pending.add(dst, data):
                raise ValueError(f"an upload of {len(data)} bytes is too large to defer")

    def flush(self) -> None:
        """Apply every pending write now, on the copy stream, finished before it returns."""
        if not len(self.pending):
            return
        with self._flush_lock:
            writes = self.pending.take()
            if not writes:
                return
            if self._eager_params is None:
                self._eager_params = ParamBlock(self, self.copy_stream)
            self._eager_params.load(writes)
            self._eager_params.scatter()
            with self.device, checked(self.cp.cuda.runtime.CUDARuntimeError, "parameter upload"):
                self.copy_stream.synchronize()

    def stage_params(self, buffers: tuple[Any, ...] | None) -> Any:
        """Before a plan (on the kernel stream): load the pending writes into `buffers` (the
        plan's; None: every pending write) into the graph block; returns the plan's first step,
        the scatter."""
        if buffers is None:
            writes = self.pending.take()
        else:
            regions = [(int(b.array.data.ptr), int(b.array.data.ptr) + b.size) for b in buffers]
            writes = self.pending.take(lambda dst: any(lo <= dst < hi for lo, hi in regions))
        if self._graph_params is None:
            self._graph_params = ParamBlock(self, self.stream)
        self._graph_params.load(writes)
        return self._graph_params.scatter

    # ---- transfers --------------------------------------------------------------------
    @property
    def staging_pool(self) -> StagingPool:
        if self._staging is None:
            with self.device:
                self._staging = StagingPool(
                    CupyCopier(self.cp, self.copy_stream, self.device), DEFAULT_CHUNK
                )
        return self._staging

    @contextlib.contextmanager
    def _staged(self) -> Iterator[Staging]:
        """A staging buffer of the pool, on this GPU, for one transfer."""
        pool = self.staging_pool
        staging = pool.acquire()
        try:
            with self.device:
                yield staging
        finally:
            pool.release(staging)

    def upload(self, buf: Any, offset: int, total: int, fill: Any) -> None:
        self.flush()
        with self._staged() as staging:
            staging.upload(int(buf.data.ptr) + offset, total, fill)

    def download(self, buf: Any, offset: int, total: int, emit: Any) -> None:
        self.flush()
        with self._staged() as staging:
            staging.download(int(buf.data.ptr) + offset, total, emit)

    def host_sink(self, buf: Any, offset: int, nbytes: int) -> StagedSink | DeferredSink:
        if nbytes <= SMALL:
            return DeferredSink(self, int(buf.data.ptr) + offset, nbytes)
        self.flush()  # earlier small writes into the range land first
        return StagedSink(self.staging_pool, int(buf.data.ptr) + offset, nbytes)

    def to_device(self, buf: Any, offset: int, data: Any) -> None:
        src = memoryview(data).cast("B")
        pos = 0

        def fill(view: memoryview) -> None:
            nonlocal pos
            view[:] = src[pos : pos + len(view)]
            pos += len(view)

        self.upload(buf, offset, src.nbytes, fill)

    def to_host(self, buf: Any, offset: int, nbytes: int) -> memoryview:
        out = bytearray(nbytes)
        pos = 0

        def emit(view: memoryview) -> None:
            nonlocal pos
            out[pos : pos + len(view)] = view
            pos += len(view)

        # No wait on the kernel stream here (it may be capturing another client's graph): a
        # session reads only after its launched graphs ended, and each ends synchronized.
        self.download(buf, offset, nbytes, emit)
        return memoryview(out)

    def copy(self, dst: Any, dst_offset: int, src: Any, src_offset: int, nbytes: int) -> None:
        """COPY_TENSOR on the copy stream, finished before it returns (the next graph may read
        the destination, and graphs run on the other stream)."""
        self.flush()
        with self.device, checked(self.cp.cuda.runtime.CUDARuntimeError, "COPY_TENSOR"):
            self.cp.cuda.runtime.memcpyAsync(
                int(dst.data.ptr) + dst_offset,
                int(src.data.ptr) + src_offset,
                nbytes,
                _D2D,
                self.copy_stream.ptr,
            )
            self.copy_stream.synchronize()

    def fill(self, buf: Any, offset: int, nbytes: int, value: int) -> None:
        """MEMSET / BUFFER_CLEAR on the copy stream, finished before it returns."""
        self.flush()
        with self.device, checked(self.cp.cuda.runtime.CUDARuntimeError, "memset"):
            ptr = int(buf.data.ptr) + offset
            self.cp.cuda.runtime.memsetAsync(ptr, value, nbytes, self.copy_stream.ptr)
            self.copy_stream.synchronize()

    def synchronize(self, what: str = "synchronize") -> None:
        try:
            self.stream.synchronize()
        except self.cp.cuda.runtime.CUDARuntimeError as exc:
            status = error_status(exc)
            raise (
                classify(status, what) if status is not None else CudaGraphError(str(exc))
            ) from exc


class _Lifetime:
    """What a reserved buffer's CuPy memory owns: the range goes when it does."""

    __slots__ = ("__weakref__",)


def probe_devices(indices: list[int | None]) -> list[GpuInfo]:
    """The GPUs `--device` asks for, or CudaUnavailable (one line) when they cannot be served."""
    cupy, chosen = check_cuda(indices)
    return [CudaBackend(i, cupy).info for i in chosen]


class CupyCapturer:
    """capture.Capturer on one CuPy stream (CuPy >= 13: Stream.begin_capture/end_capture)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def capture(self, run: Any) -> object:
        self.stream.begin_capture()
        try:
            with self.stream:
                run()
        finally:
            graph = self.stream.end_capture()
        return graph

    def launch(self, graph: object) -> None:
        graph.launch(self.stream)  # type: ignore[attr-defined]
