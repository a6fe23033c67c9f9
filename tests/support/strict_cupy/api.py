"""`StrictCupy`: the part of CuPy the CUDA backend uses, on the CPU, refusing what a GPU would.

Device memory is NumPy bytes with red zones; kernels are the CUDA C modules executed by the CPU
emulator (tests/support/cuda_emu); cuBLAS's GemmEx is NumPy over device addresses. Every
operation goes through the timeline (timeline.py), which checks stream ordering and the capture
rules, and every kernel launch is recorded in `launches`.
"""

from __future__ import annotations

import ctypes
import weakref
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
from rpcnet.compute.cuda import sources

from support import cuda_emu
from support.strict_cupy.arrays import (
    StrictArray,
    device_arrays,
    host_operands,
    plain,
    unwrap,
)
from support.strict_cupy.streams import (
    CudaRuntimeError,
    CurrentStream,
    DeviceContext,
    Event,
    Graph,
    Stream,
)
from support.strict_cupy.timeline import (
    LEGACY,
    Allocation,
    CaptureError,
    LaunchError,
    MemoryFault,
    StrictViolation,
    Timeline,
)
from support.strict_cupy.vmm import GRANULE, StrictVmm, UnownedMemory

GIB = 1 << 30
H2D, D2H, D2D = 1, 2, 3
CUDA_R_32F, CUDA_R_16F = 0, 2
_NUMPY_NAMES = (
    "float16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool_ inf nan "
    "dtype errstate matmul repeat exp where maximum minimum multiply add subtract divide sqrt "
    "tanh argsort take_along_axis concatenate stack abs log sum mean"
).split()


class OutOfMemoryError(MemoryError):
    """cupy.cuda.memory.OutOfMemoryError."""


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    stream: int
    captured: bool


class Memory:
    """cupy.cuda.Memory: one device allocation, freed when the last reference goes."""

    def __init__(self, owner: StrictCupy, nbytes: int) -> None:
        owner.timeline.forbid_in_capture("a device allocation")
        if owner.timeline.device_bytes() + nbytes > owner.total:
            raise OutOfMemoryError(f"out of memory allocating {nbytes} bytes")
        self.raw = owner.buffers.allocate(nbytes)
        self.ptr = int(self.raw.ctypes.data)
        self.size = nbytes
        owner.timeline.register(Allocation(self.ptr, nbytes, self.raw, "device"))
        owner.memories[self.ptr] = weakref.ref(self)
        weakref.finalize(self, owner.timeline.unregister, self.ptr)


class StrictKernel:
    """A RawModule function: checks the launch and its pointers, then runs the emulated kernel
    on the current stream, or records it into the capturing stream's graph."""

    def __init__(self, owner: StrictCupy, kernel: cuda_emu.EmuKernel) -> None:
        self.owner = owner
        self.kernel = kernel
        self.name = kernel.name

    def __call__(self, grid: Any, block: Any, args: Any, shared_mem: int = 0) -> None:
        owner, tl = self.owner, self.owner.timeline
        g = tuple((*map(int, grid), 1, 1)[:3])
        b = tuple((*map(int, block), 1, 1)[:3])
        if not (0 < g[0] < 1 << 31 and 0 < g[1] <= 65535 and 0 < g[2] <= 65535):
            raise tl.fail(LaunchError(f"{self.name}: grid {g} outside CUDA's limits"))
        if min(b) <= 0 or b[0] * b[1] * b[2] > 1024 or b[2] > 64:
            raise tl.fail(LaunchError(f"{self.name}: block {b} outside CUDA's limits"))
        sig = self.kernel.signature
        if len(args) != len(sig):
            raise tl.fail(LaunchError(f"{self.name} takes {len(sig)} arguments, got {len(args)}"))
        touched = []
        for i, (code, arg) in enumerate(zip(sig, args, strict=True)):
            if code not in "cp":
                continue
            addr = int(arg) if isinstance(arg, np.integer) else int(arg.data.ptr)
            if addr == 0:
                continue  # NULL: an absent optional operand
            alloc = tl.find(addr)
            if alloc is None or alloc.kind != "device":
                raise tl.fail(MemoryFault(f"{self.name} param {i}: {addr:#x} is not device memory"))
            touched.append((alloc, code == "p"))
        sid = owner.current.sid
        owner.check_stream_use(sid, f"kernel {self.name}")

        scatter = self.name == "rpc_scatter_params"
        block = int(args[0].data.ptr) if scatter else 0

        def run(on: int) -> None:
            # the scatter's destinations are in its block, read when it runs (a replay's block
            # holds that step's writes)
            extra = _scatter_destinations(tl, self.name, block) if scatter else []
            for alloc, write in [*touched, *extra]:
                tl.access(on, alloc, write, f"kernel {self.name}")
            self.kernel(g, b, args)

        captured = tl.capture_of(sid) is not None
        owner.launches.append(Launch(self.name, g, b, sid, captured))
        if not captured:
            tl.trace.append(("kernel", self.name))
        owner.run_or_record(sid, run)


def _scatter_destinations(tl: Timeline, name: str, block: int) -> list:
    """The device allocations `rpc_scatter_params` writes, from its block at address `block`
    (params.py's layout), each write checked to lie inside one."""
    from rpcnet.compute.cuda.params import TABLE, unpack

    table = np.ctypeslib.as_array((ctypes.c_uint8 * TABLE).from_address(block))
    out = []
    for dst, _, nbytes in unpack(table):
        alloc = tl.find(dst, nbytes)
        if alloc is None or alloc.kind != "device":
            raise tl.fail(
                MemoryFault(f"{name}: a write to {dst:#x}+{nbytes} outside device memory")
            )
        out.append((alloc, True))
    return out


class RawModule:
    """cupy.RawModule over the emulator: the module is found by its source text."""

    def __init__(self, owner: StrictCupy, code: str, options: Any = (), backend: str = "") -> None:
        self.owner = owner
        names = [n for n in sources.module_names() if sources.module_source(n) == code]
        if len(names) != 1:
            raise AssertionError("RawModule source is not one of compute/cuda/src's modules")
        self.name = names[0]
        self.compiled = False

    def compile(self) -> None:
        self.owner.compiled.append(self.name)
        self.compiled = True

    def get_function(self, name: str) -> StrictKernel:
        self.compiled = True
        return StrictKernel(self.owner, self.owner.emu.function(self.name, name))


class StrictCupy:
    """A stand-in `cupy` module (pass it where the code takes `cupy=`)."""

    __name__ = "strict_cupy"

    def __init__(
        self,
        n_gpus: int = 1,
        total: int = 140 * GIB,
        name: str = "NVIDIA H200",
        vmm: bool = True,
        granularity: int = GRANULE,
    ):
        self.timeline = Timeline()
        self.current = CurrentStream()
        self.total = total
        self.free_override: int | None = None
        self.launches: list[Launch] = []
        self.compiled: list[str] = []
        self.memories: dict[int, weakref.ref[Memory]] = {}
        self.buffers = cuda_emu._Buffers()
        self.emu = cuda_emu.EmuKernels(cuda_emu.build_all(), self.buffers)
        # virtual memory management (None: a GPU without it)
        self.vmm = StrictVmm(self, granularity) if vmm else None
        tl, cur = self.timeline, self.current
        runtime = SimpleNamespace(
            driverGetVersion=lambda: 13000,
            runtimeGetVersion=lambda: 13000,
            getDeviceCount=lambda: n_gpus,
            getDeviceProperties=lambda i: {"name": name.encode(), "major": 9, "minor": 0},
            memGetInfo=self._mem_get_info,
            memcpyAsync=self._memcpy_async,
            memsetAsync=self._memset_async,
            deviceSynchronize=lambda: DeviceContext(tl, 0).synchronize(),
            CUDARuntimeError=CudaRuntimeError,
        )
        self.cuda = SimpleNamespace(
            runtime=runtime,
            Device=lambda i=0: DeviceContext(tl, i),
            Stream=lambda non_blocking=False: Stream(tl, cur, non_blocking),
            Event=lambda **kw: Event(tl, cur, **kw),
            Memory=lambda nbytes: Memory(self, nbytes),
            MemoryPointer=lambda mem, offset: _memory_pointer(mem, offset),
            UnownedMemory=lambda ptr, size, owner, device_id=-1: UnownedMemory(
                self, ptr, size, owner, device_id
            ),
            alloc_pinned_memory=self._alloc_pinned,
            memory=SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
            device=SimpleNamespace(get_cublas_handle=lambda: 1),
            cublas=SimpleNamespace(gemmEx=self._gemm_ex),
            graph=SimpleNamespace(Graph=Graph),
            get_current_stream=lambda: cur.sid,
        )

    def vmm_driver(self) -> StrictVmm | None:
        """What `rpcnet.compute.cuda.vmm.load` uses instead of libcuda."""
        return self.vmm

    def RawModule(self, code: str, options: Any = (), backend: str = "") -> RawModule:  # noqa: N802
        return RawModule(self, code, options, backend)

    def __getattr__(self, name: str) -> Any:
        if name in _NUMPY_NAMES:
            return getattr(np, name)
        raise AttributeError(f"the strict CuPy stand-in has no cupy.{name}")

    # ---- what tests look at --------------------------------------------------------------
    @property
    def violations(self) -> list[StrictViolation]:
        return self.timeline.violations

    def assert_clean(self) -> None:
        if self.violations:
            raise AssertionError(
                f"{len(self.violations)} violation(s) of the GPU's rules; first: "
                f"{self.violations[0]!r}"
            )

    # ---- arrays ----------------------------------------------------------------------------
    def ndarray(self, shape: Any, dtype: Any = float, memptr: Any = None, strides: Any = None):
        if memptr is None:
            return self.empty(shape, dtype)
        dt = np.dtype(dtype)
        shape_t = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        if memptr.offset < 0 or memptr.offset + _extent(shape_t, dt, strides) > memptr.mem.size:
            # CuPy checks no bounds (a shared content's window starts before its allocation):
            # the array is made, and every use of it is checked against live allocations
            span = np.asarray(_AtAddress(memptr.ptr, shape_t, dt, strides))
            arr = np.ndarray(shape_t, dt, span, 0, strides)
        else:
            arr = np.ndarray(shape_t, dt, memptr.mem.raw, memptr.offset, strides)
        return self._device_view(arr, memptr.mem)

    def _device_view(self, arr: np.ndarray, mem: Any) -> StrictArray:
        out = arr.view(StrictArray)
        out._mem, out._owner = mem, self
        return out

    def empty(self, shape: Any, dtype: Any = np.float32) -> StrictArray:
        dt = np.dtype(dtype)
        shape_t = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
        mem = Memory(self, int(np.prod(shape_t, dtype=np.int64)) * dt.itemsize)
        return self._device_view(mem.raw.view(dt).reshape(shape_t), mem)

    def zeros(self, shape: Any, dtype: Any = np.float32) -> StrictArray:
        out = self.empty(shape, dtype)
        out[...] = 0
        return out

    def full(self, shape: Any, value: Any, dtype: Any = np.float32) -> StrictArray:
        out = self.empty(shape, dtype)
        out[...] = value
        return out

    def asarray(self, a: Any, dtype: Any = None) -> StrictArray:
        """A host array to the device: an upload on the current stream."""
        if isinstance(a, StrictArray):
            return a if dtype is None else a.astype(dtype)
        host = np.asarray(a, dtype=dtype)
        out = self.empty(host.shape, host.dtype)
        sid = self.current.sid
        self.check_stream_use(sid, "an upload", host_copy=True)
        self.timeline.enqueue(sid)
        self.timeline.access(sid, self._alloc_of(out), True, "an upload")
        out.view(np.ndarray)[...] = host
        return out

    def asnumpy(self, a: Any) -> np.ndarray:
        return self.to_numpy(a) if isinstance(a, StrictArray) else np.asarray(a)

    def to_numpy(self, a: StrictArray) -> np.ndarray:
        sid = self.current.sid
        self.check_stream_use(sid, "a download", host_copy=True)
        self.timeline.enqueue(sid)
        self.timeline.access(sid, self._alloc_of(a), False, "a download")
        self.timeline.host_waits(self.timeline.snapshot(sid))  # a synchronous copy
        return np.array(a.view(np.ndarray), copy=True)

    def _alloc_of(self, a: StrictArray) -> Allocation:
        alloc = self.timeline.find(int(a.__array_interface__["data"][0]), max(a.nbytes, 1))
        if alloc is None:
            raise self.timeline.fail(MemoryFault("an array outside any live allocation"))
        return alloc

    def compute(self, name: str, fn: Any, args: Any, kwargs: dict) -> Any:
        """A NumPy computation on device arrays (CuPy array code) on the current stream."""
        tl = self.timeline
        if host_operands(args):
            raise tl.fail(StrictViolation(f"{name}: a host NumPy array among device operands"))
        out = kwargs.get("out")
        outs = device_arrays(out)
        reads = [a for a in device_arrays(args) if not any(a is o for o in outs)]
        sid = self.current.sid
        self.check_stream_use(sid, f"array code {name}")
        if out is None and (tl.capture_of(sid) or tl.capturing_thread()):
            raise tl.fail(CaptureError(f"array code {name} allocates its result"))
        result: list[Any] = []

        def run(on: int) -> None:
            for a in reads:
                tl.access(on, self._alloc_of(a), False, f"array code {name}")
            for o in outs:
                tl.access(on, self._alloc_of(o), True, f"array code {name}")
            result.append(fn(*unwrap(list(args)), **unwrap_kwargs(kwargs)))

        self.run_or_record(sid, run)
        if out is not None:
            return out[0] if isinstance(out, tuple) and len(out) == 1 else out
        return self._as_device(result[0], sid, name)

    def _as_device(self, value: Any, sid: int, name: str) -> Any:
        if not isinstance(value, np.ndarray):
            return value
        alloc = self.timeline.find(int(value.__array_interface__["data"][0]), 1)
        if alloc is not None and alloc.kind == "device" and value.nbytes:
            mem = self.memories[alloc.base]()  # a view of an operand: no new memory
            return self._device_view(value, mem)
        out = self.empty(value.shape, value.dtype)
        self.timeline.access(sid, self._alloc_of(out), True, f"array code {name}")
        out.view(np.ndarray)[...] = value
        return out

    def assign(self, target: StrictArray, value: Any, fn: Any) -> None:
        tl = self.timeline
        if isinstance(value, np.ndarray) and not isinstance(value, StrictArray) and value.ndim:
            raise tl.fail(StrictViolation("a host NumPy array assigned into device memory"))
        sid = self.current.sid
        self.check_stream_use(sid, "an assignment")

        def run(on: int) -> None:
            if isinstance(value, StrictArray):
                tl.access(on, self._alloc_of(value), False, "an assignment")
            tl.access(on, self._alloc_of(target), True, "an assignment")
            fn(target.view(np.ndarray), plain(value))

        self.run_or_record(sid, run)

    # ---- the stream an operation goes to --------------------------------------------------
    def check_stream_use(self, sid: int, what: str, host_copy: bool = False) -> None:
        tl = self.timeline
        if sid == LEGACY and tl.capturing_thread() is not None:
            raise tl.fail(CaptureError(f"{what} on the legacy stream"))
        if host_copy:
            tl.forbid_in_capture(what, sid)

    def run_or_record(self, sid: int, run: Any) -> None:
        cap = self.timeline.capture_of(sid)
        if cap is not None:
            cap.nodes.append(run)  # runs at each launch of the graph
            return
        self.timeline.enqueue(sid)
        run(sid)

    # ---- runtime calls ------------------------------------------------------------------
    def _mem_get_info(self) -> tuple[int, int]:
        if self.free_override is not None:
            return self.free_override, self.total
        return self.total - self.timeline.device_bytes(), self.total

    def _alloc_pinned(self, nbytes: int) -> np.ndarray:
        tl = self.timeline
        tl.forbid_in_capture("a pinned host allocation")
        mem = np.zeros(max(nbytes, 1), np.uint8)
        tl.register(Allocation(int(mem.ctypes.data), nbytes, mem, "pinned"))
        weakref.finalize(mem, tl.unregister, int(mem.ctypes.data))
        return mem

    def _stream_of(self, ptr: int) -> int:
        if ptr == 0:
            return LEGACY
        if ptr not in self.timeline.clocks:
            raise self.timeline.fail(LaunchError(f"stream {ptr:#x} does not exist"))
        return ptr

    def _memcpy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        tl = self.timeline
        sid = self._stream_of(stream)
        want = {H2D: ("pinned", "device"), D2H: ("device", "pinned"), D2D: ("device", "device")}
        if kind not in want:
            raise tl.fail(LaunchError(f"memcpyAsync kind {kind}"))
        src_alloc, dst_alloc = tl.find(src, nbytes), tl.find(dst, nbytes)
        for alloc, (side, k) in (
            (src_alloc, ("source", want[kind][0])),
            (dst_alloc, ("destination", want[kind][1])),
        ):
            if alloc is None or alloc.kind != k:
                raise tl.fail(MemoryFault(f"memcpyAsync kind {kind}: its {side} is not {k} memory"))
        what = {H2D: "a copy to the device", D2H: "a copy to the host", D2D: "a device copy"}[kind]
        self.check_stream_use(sid, what, host_copy=kind != D2D)
        assert src_alloc is not None and dst_alloc is not None
        if tl.capture_of(sid) is None:
            tl.trace.append(("copy", kind, nbytes))

        def run(on: int) -> None:
            tl.access(on, src_alloc, False, what)
            tl.access(on, dst_alloc, True, what)
            ctypes.memmove(dst, src, nbytes)

        self.run_or_record(sid, run)

    def _memset_async(self, ptr: int, value: int, nbytes: int, stream: int) -> None:
        tl = self.timeline
        sid = self._stream_of(stream)
        alloc = tl.find(ptr, nbytes)
        if alloc is None or alloc.kind != "device":
            raise tl.fail(MemoryFault("memsetAsync outside device memory"))
        self.check_stream_use(sid, "a memset")

        def run(on: int) -> None:
            tl.access(on, alloc, True, "a memset")
            ctypes.memset(ptr, value, nbytes)

        self.run_or_record(sid, run)

    def _gemm_ex(
        self, handle: int, transa: int, transb: int, m: int, n: int, k: int, alpha: int,
        a: int, a_type: int, lda: int, b: int, b_type: int, ldb: int, beta: int,
        c: int, c_type: int, ldc: int, compute_type: int, algo: int,
    ) -> None:  # fmt: skip
        """cublasGemmEx, column-major: C (m x n) = alpha op(A) op(B) + beta C."""
        tl = self.timeline
        types = {CUDA_R_32F: np.float32, CUDA_R_16F: np.float16}
        if a_type not in types or b_type not in types or c_type != CUDA_R_32F:
            raise tl.fail(LaunchError(f"gemmEx types {a_type}, {b_type}, {c_type}"))
        al = ctypes.c_float.from_address(alpha).value
        be = ctypes.c_float.from_address(beta).value

        def matrix(ptr: int, dtype: Any, rows: int, cols: int, ld: int, write: bool):
            nbytes = (ld * (cols - 1) + rows) * np.dtype(dtype).itemsize
            alloc = tl.find(ptr, nbytes)
            if alloc is None or alloc.kind != "device" or ld < rows:
                raise tl.fail(MemoryFault("gemmEx operand outside device memory"))
            buf = (ctypes.c_char * (ld * cols * np.dtype(dtype).itemsize)).from_address(ptr)
            return alloc, np.frombuffer(buf, dtype).reshape(cols, ld)[:, :rows].T

        a_rows, a_cols = (m, k) if transa == 0 else (k, m)
        b_rows, b_cols = (k, n) if transb == 0 else (n, k)
        a_alloc, a_mat = matrix(a, types[a_type], a_rows, a_cols, lda, False)
        b_alloc, b_mat = matrix(b, types[b_type], b_rows, b_cols, ldb, False)
        c_alloc, c_mat = matrix(c, np.float32, m, n, ldc, True)
        sid = self.current.sid
        self.check_stream_use(sid, "gemmEx")

        def run(on: int) -> None:
            tl.access(on, a_alloc, False, "gemmEx")
            tl.access(on, b_alloc, False, "gemmEx")
            tl.access(on, c_alloc, True, "gemmEx")
            op_a = a_mat if transa == 0 else a_mat.T
            op_b = b_mat if transb == 0 else b_mat.T
            prod = op_a.astype(np.float32) @ op_b.astype(np.float32)
            c_mat[...] = np.float32(al) * prod + (np.float32(be) * c_mat if be else 0)

        self.run_or_record(sid, run)


def _extent(shape: tuple[int, ...], dtype: np.dtype, strides: Any) -> int:
    """Bytes from an array's first element to the end of its last (non-negative strides)."""
    if not shape or 0 in shape:
        return 0
    if strides is None:
        return int(np.prod(shape)) * dtype.itemsize
    return sum((n - 1) * int(st) for n, st in zip(shape, strides, strict=True)) + dtype.itemsize


class _AtAddress:
    """The bytes an array made at a raw device address spans (no allocation checks)."""

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: np.dtype, strides: Any) -> None:
        self.__array_interface__ = {
            "data": (ptr, False),
            "shape": (_extent(shape, dtype, strides),),
            "typestr": "|u1",
            "version": 3,
        }


def unwrap_kwargs(kwargs: dict) -> dict:
    return {key: unwrap(value) for key, value in kwargs.items()}


def _memory_pointer(mem: Any, offset: int) -> Any:
    from support.strict_cupy.arrays import _Pointer

    return _Pointer(mem, offset)
