"""The CUDA kernels (python/rpcnet/compute/cuda/src/*.cu) executed on the CPU, for CI.

Each kernel module is compiled with g++ after ``emu.h`` (CUDA's execution model on fibers: see
that header), with one exported launcher per ``extern "C"`` kernel found in the preprocessed
source, into a shared library cached under ``$TMPDIR/rpcnet-cuda-emu/<digest of every input>``.
`EmuBackend` stands in for `rpcnet.compute.cuda.device.CudaBackend` where the launchers in
``compute/cuda/launch.py`` look (``kernels.function``, ``device``, ``stream``, ``cp``), with
NumPy arrays (`DevArray`) as device memory. Arguments are checked against the kernel's declared
parameters (count and C type), and every buffer made by the backend has red zones that are
checked after each launch.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
SRC_DIR = ROOT / "python" / "rpcnet" / "compute" / "cuda" / "src"
EMU_H = Path(__file__).resolve().parent / "emu.h"
CXXFLAGS = (
    "-x",
    "c++",
    "-std=c++17",
    "-O1",
    "-fPIC",
    "-fno-strict-aliasing",
    "-ffp-contract=off",  # same results on every host (a GPU would contract to FMA)
    "-U_FORTIFY_SOURCE",
    "-D_FORTIFY_SOURCE=0",
    "-w",
)
_KERNEL_RE = re.compile(r'extern\s*"C"\s*__rpc_emu_kernel__\s*void\s+(\w+)\s*\(')

#: bytes of red zone before and after every buffer the backend allocates
REDZONE = 256
_FILL = 0xA5


class EmuBuildError(RuntimeError):
    """g++ failed on a module (the message holds its output)."""


def gxx() -> str:
    path = os.environ.get("CXX_FOR_CUDA_EMU") or shutil.which("g++")
    if not path:
        raise EmuBuildError(
            "g++ is required to run the CUDA kernels on the CPU (apt-get install g++)"
        )
    return path


def module_names(src_dir: Path = SRC_DIR) -> list[str]:
    return sorted(p.stem for p in src_dir.glob("*.cu"))


def _digest(src_dir: Path, sources: Iterable[Path]) -> str:
    h = hashlib.sha256()
    compiler = subprocess.run(
        [gxx(), "--version"], capture_output=True, text=True, check=True
    ).stdout
    for part in (compiler, platform.machine(), " ".join(CXXFLAGS)):
        h.update(part.encode() + b"\0")
    headers = [*src_dir.glob("*.h"), *src_dir.glob("*.cuh")]
    for path in sorted({*headers, *sources, EMU_H, Path(__file__).resolve()}):
        h.update(str(path.name).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def cache_dir(src_dir: Path = SRC_DIR, sources: Iterable[Path] | None = None) -> Path:
    base = Path(os.environ.get("RPCNET_CUDA_EMU_CACHE") or Path(tempfile.gettempdir()))
    srcs = list(sources) if sources is not None else sorted(src_dir.glob("*.cu"))
    return base / "rpcnet-cuda-emu" / _digest(src_dir, srcs)


def scan_kernels(source: Path, include_dir: Path = SRC_DIR) -> list[str]:
    """The extern "C" __global__ functions of a module, from its preprocessed text (macros
    generate most of them)."""
    cmd = [gxx(), *CXXFLAGS, "-E", "-DRPC_EMU_SCAN", f"-I{include_dir}", "-include", str(EMU_H)]
    proc = subprocess.run([*cmd, str(source)], capture_output=True, text=True)
    if proc.returncode:
        raise EmuBuildError(f"preprocessing {source} failed:\n{proc.stderr}")
    return list(dict.fromkeys(_KERNEL_RE.findall(proc.stdout)))  # declared, then defined


def build_module(source: Path, out: Path, include_dir: Path = SRC_DIR) -> Path:
    """Compile one module with its kernels' launchers into `out` (a shared library)."""
    kernels = scan_kernels(source, include_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out.stem}-", dir=out.parent))
    try:
        unit = tmp_dir / f"{out.stem}.cpp"
        exports = "".join(f"RPC_EMU_EXPORT({k})\n" for k in kernels)
        listing = ",".join(kernels)
        unit.write_text(
            f'#include "{source.resolve()}"\n'
            f"{exports}"
            'extern "C" __attribute__((visibility("default"))) const char* emu_kernel_names()'
            f' {{ return "{listing}"; }}\n'
        )
        so = tmp_dir / out.name
        cmd = [gxx(), *CXXFLAGS, "-shared", f"-I{include_dir}", "-include", str(EMU_H)]
        proc = subprocess.run([*cmd, str(unit), "-o", str(so)], capture_output=True, text=True)
        if proc.returncode:
            raise EmuBuildError(f"compiling {source} failed:\n{proc.stderr[-20000:]}")
        os.replace(so, out)  # atomic: concurrent builders write the same bytes
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    return out


def build_all(
    names: Sequence[str] | None = None, src_dir: Path = SRC_DIR, jobs: int | None = None
) -> dict[str, Path]:
    """Every module's library, built (in parallel) unless the cache already has it."""
    names = list(names) if names is not None else module_names(src_dir)
    where = cache_dir(src_dir)
    paths = {n: where / f"{n}.so" for n in names}
    todo = [n for n in names if not paths[n].exists()]
    if todo:
        workers = jobs or max(1, min(len(todo), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            # the largest modules first: they bound the wall time
            todo.sort(key=lambda n: -(src_dir / f"{n}.cu").stat().st_size)
            futures = [
                pool.submit(build_module, src_dir / f"{n}.cu", paths[n], src_dir) for n in todo
            ]
            for f in futures:
                f.result()
    return paths


# Device memory: NumPy arrays with CuPy's `.data.ptr` --------------------------------------


class _Ptr:
    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class DevArray(np.ndarray):
    """A NumPy array that answers `.data.ptr` like a CuPy array (its address); views, slices
    and reshapes stay DevArrays. Use `np.asarray(a)` for a plain array."""

    @property
    def data(self) -> _Ptr:  # type: ignore[override]
        return _Ptr(int(self.__array_interface__["data"][0]))


class _Buffers:
    """Red zones around the backend's allocations, checked after every launch."""

    def __init__(self) -> None:
        self._live: list[tuple[weakref.ref[np.ndarray], int, int]] = []

    def allocate(self, nbytes: int, align: int = 256) -> np.ndarray:
        """`nbytes` with red zones around them, `align`-aligned (256: like cudaMalloc; a VMM
        reservation asks for its granularity)."""
        raw = np.empty(nbytes + 2 * REDZONE + align, np.uint8)
        start = -(raw.ctypes.data + REDZONE) % align + REDZONE
        raw[:start] = _FILL
        raw[start + nbytes :] = _FILL
        self._live.append((weakref.ref(raw), start, start + nbytes))
        return raw[start : start + nbytes]

    def check(self, kernel: str) -> None:
        alive = []
        for ref, lo, hi in self._live:
            raw = ref()
            if raw is None:
                continue
            alive.append((ref, lo, hi))
            if np.any(raw[:lo] != _FILL) or np.any(raw[hi:] != _FILL):
                bad = int(np.flatnonzero(np.concatenate([raw[:lo], raw[hi:]]) != _FILL)[0])
                where = f"{lo - bad} bytes before" if bad < lo else f"{bad - lo} bytes past"
                raw[:lo] = _FILL
                raw[hi:] = _FILL
                raise RuntimeError(
                    f"{kernel}: wrote outside a buffer of {hi - lo} bytes ({where} it)"
                )
        self._live = alive


# Kernels -------------------------------------------------------------------------------

_LAUNCH_ARGTYPES = [ctypes.c_uint] * 6 + [ctypes.POINTER(ctypes.c_void_p)]
_CTYPES = {
    "i": (ctypes.c_int32, np.int32),
    "I": (ctypes.c_uint32, np.uint32),
    "q": (ctypes.c_int64, np.int64),
    "Q": (ctypes.c_uint64, np.uint64),
    "f": (ctypes.c_float, np.float32),
    "d": (ctypes.c_double, np.float64),
}


class EmuKernel:
    """One kernel: called as fn(grid, block, args) like a CuPy RawKernel."""

    def __init__(self, name: str, fn: Any, signature: str, buffers: _Buffers) -> None:
        self.name = name
        self.signature = signature
        self._fn = fn
        self._buffers = buffers
        self.launches = 0

    def _pointer(self, i: int, arg: Any) -> int:
        if isinstance(arg, np.uint64):
            return int(arg)
        data = getattr(arg, "data", None)
        if type(arg) is np.ndarray:  # device arrays are subclasses answering `.data.ptr`
            raise TypeError(f"{self.name} param {i}: a host NumPy array, not device memory")
        if data is None or not hasattr(data, "ptr"):
            raise TypeError(f"{self.name} param {i} is a pointer: got {type(arg).__name__}")
        return int(data.ptr)

    def _pack(self, args: Sequence[Any]) -> list[Any]:
        if len(args) != len(self.signature):
            raise TypeError(
                f"{self.name} takes {len(self.signature)} arguments "
                f"({self.signature}), got {len(args)}"
            )
        values: list[Any] = []
        for i, (code, arg) in enumerate(zip(self.signature, args, strict=True)):
            if code in "cp":
                values.append(ctypes.c_void_p(self._pointer(i, arg)))
                continue
            if code not in _CTYPES:
                raise TypeError(f"{self.name} param {i}: a type the emulator cannot pass")
            ctype, want = _CTYPES[code]
            if not isinstance(arg, np.generic) or arg.dtype != np.dtype(want):
                raise TypeError(
                    f"{self.name} param {i} is {np.dtype(want).name}: got {arg!r} "
                    f"({type(arg).__name__}); pack it as np.{np.dtype(want).name}"
                )
            values.append(ctype(arg.item()))
        return values

    def __call__(self, grid: Sequence[int], block: Sequence[int], args: Sequence[Any]) -> None:
        g = [*grid, 1, 1][:3]
        b = [*block, 1, 1][:3]
        values = self._pack(args)
        argv = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values]
        )
        if any(not 0 <= int(v) < 1 << 32 for v in (*g, *b)):
            raise RuntimeError(f"{self.name}: grid {g} / block {b} not 32-bit unsigned")
        err = self._fn(*(int(v) for v in g), *(int(v) for v in b), argv)
        self.launches += 1
        if err:
            raise RuntimeError(err.decode())
        self._buffers.check(self.name)


def _load_once(cache: dict[str, Any], name: str, known: Sequence[str], load, where: str) -> Any:
    """`cache[name]`, loaded on first use; a KeyError names what `where` has instead."""
    if name not in cache:
        if name not in known:
            raise KeyError(f"{where} has no {name}: {list(known)}")
        cache[name] = load(name)
    return cache[name]


class EmuModule:
    def __init__(self, path: Path, buffers: _Buffers) -> None:
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        names = ctypes.CFUNCTYPE(ctypes.c_char_p)(("emu_kernel_names", self._lib))()
        self.kernel_names = [n for n in names.decode().split(",") if n]
        self._buffers = buffers
        self._kernels: dict[str, EmuKernel] = {}

    def function(self, kernel: str) -> EmuKernel:
        return _load_once(self._kernels, kernel, self.kernel_names, self._load, self.path.stem)

    def _load(self, kernel: str) -> EmuKernel:
        fn = getattr(self._lib, f"emu_{kernel}")
        fn.argtypes = _LAUNCH_ARGTYPES
        fn.restype = ctypes.c_char_p
        sig = getattr(self._lib, f"emu_sig_{kernel}")
        sig.restype = ctypes.c_char_p
        return EmuKernel(kernel, fn, sig().decode(), self._buffers)


class EmuKernels:
    """`kernels.function(module, kernel)` as CudaBackend's kernel registry answers it."""

    def __init__(self, paths: dict[str, Path], buffers: _Buffers) -> None:
        self._paths = paths
        self._buffers = buffers
        self._modules: dict[str, EmuModule] = {}

    def module(self, name: str) -> EmuModule:
        def load(name: str) -> EmuModule:
            return EmuModule(self._paths[name], self._buffers)

        return _load_once(self._modules, name, sorted(self._paths), load, "the kernel modules")

    def function(self, module: str, kernel: str) -> EmuKernel:
        return self.module(module).function(kernel)


class EmuBackend:
    """What compute/cuda/launch.py uses of a CudaBackend, on the CPU."""

    cp = np

    def __init__(self, paths: dict[str, Path] | None = None) -> None:
        self.buffers = _Buffers()
        self.kernels = EmuKernels(paths if paths is not None else build_all(), self.buffers)
        self.device = contextlib.nullcontext()
        self.stream = contextlib.nullcontext()

    def synchronize(self) -> None:
        pass

    # CuPy-like constructors of device arrays (with red zones)
    def empty(self, shape: int | tuple[int, ...], dtype: Any) -> DevArray:
        dt = np.dtype(dtype)
        shape_t = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(np.prod(shape_t, dtype=np.int64)) * dt.itemsize
        return self.buffers.allocate(nbytes).view(dt).reshape(shape_t).view(DevArray)

    def full(self, shape: int | tuple[int, ...], value: Any, dtype: Any) -> DevArray:
        a = self.empty(shape, dtype)
        a[...] = value
        return a

    def zeros(self, shape: int | tuple[int, ...], dtype: Any) -> DevArray:
        return self.full(shape, 0, dtype)

    def asarray(self, a: Any) -> DevArray:
        a = np.asarray(a)
        out = self.empty(a.shape, a.dtype)
        out[...] = a
        return out

    @staticmethod
    def asnumpy(a: Any) -> np.ndarray:
        return np.array(a, copy=True).view(np.ndarray)


def compile_test_module(source_text: str, out_dir: Path, name: str = "extra") -> EmuModule:
    """A module from a string (tests of the emulator itself), with the kernel sources' include
    path; returns it loaded on a fresh buffer registry."""
    src = out_dir / f"{name}.cu"
    src.write_text(source_text)
    so = build_module(src, out_dir / f"{name}.so")
    return EmuModule(so, _Buffers())
