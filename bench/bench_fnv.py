"""FNV-1a 64 throughput: rpcnet._native.fnv1a64 vs a plain C loop built with gcc -O2.

FNV-1a is byte-serial (each step needs the previous product), so both sides are bound by
multiply latency; the native version should match the C loop (ratio ~1.0).

Usage: python bench/bench_fnv.py [--mib 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np
from engine_machine import best_seconds
from rpcnet import _native

C_SOURCE = r"""
#include <stddef.h>
#include <stdint.h>

uint64_t fnv1a64(const uint8_t *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
"""


def build_c(tmp: Path) -> ctypes.CDLL:
    src = tmp / "fnv.c"
    lib = tmp / "libfnv.so"
    src.write_text(C_SOURCE)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    dll = ctypes.CDLL(str(lib))
    dll.fnv1a64.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    dll.fnv1a64.restype = ctypes.c_uint64
    return dll


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256, help="buffer size in MiB")
    ap.add_argument("--repeat", type=int, default=3, help="runs per side; the best one counts")
    args = ap.parse_args()

    size = args.mib << 20
    data = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        c = build_c(Path(tmp))
        ptr = data.ctypes.data
        expect = c.fnv1a64(ptr, size)
        got = _native.fnv1a64(data)
        if got != expect:
            raise SystemExit(f"mismatch: native {got:#018x} != C {expect:#018x}")
        t_native = best_seconds(lambda: _native.fnv1a64(data), args.repeat)
        t_c = best_seconds(lambda: c.fnv1a64(ptr, size), args.repeat)

    gbs_native = size / t_native / 1e9
    gbs_c = size / t_c / 1e9
    print(f"buffer: {args.mib} MiB, best of {args.repeat}")
    print(f"native fnv1a64: {gbs_native:.3f} GB/s")
    print(f"gcc -O2 C loop: {gbs_c:.3f} GB/s")
    print(f"ratio native/C: {gbs_native / gbs_c:.3f}")


if __name__ == "__main__":
    main()
