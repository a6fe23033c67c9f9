"""Native MUL_MAT (`_native.matmul_quant`), every weight type: decode GB/s, prefill GFLOP/s.

Decode (N = 1): weight bytes read per second, against the host's measured read bandwidth (a
NumPy reduction over 512 MiB). Prefill (N = 64, 256): 2·M·K·N / time, in the order ggml's
MUL_MAT uses for that many rows (llamafile's for the float types). Weights are random block
bytes with sane f16 scales (timing does not depend on the values).

Usage: PYTHONPATH=python python bench/bench_matmul.py [--threads 2] [--types q8_0,q4_K]
       [--portable] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from rpcnet import _native

TYPES = {
    "f32": 0, "f16": 1, "bf16": 30, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
    "q2_K": 10, "q3_K": 11, "q4_K": 12, "q5_K": 13, "q6_K": 14, "iq4_nl": 20, "iq4_xs": 23,
    "mxfp4": 39,
}  # fmt: skip
DECODE_SHAPES = [(4096, 4096), (11008, 4096)]  # (M, K): attention and FFN-up of a 7 B model
PREFILL = [(4096, 4096, 64), (4096, 4096, 256)]


def best_s(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def read_bandwidth() -> float:
    """GB/s of one NumPy pass reading 512 MiB (single thread)."""
    a = np.ones(1 << 26, np.float64)
    return a.nbytes / best_s(lambda: a.sum(), 3) / 1e9


def weights(type_id: int, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    block, block_bytes, _ = _native.matmul_quant_block(type_id)
    w = rng.integers(0, 256, (m, k // block * block_bytes), dtype=np.uint8)
    if type_id == 0:
        w = rng.standard_normal((m, k), dtype=np.float32).view(np.uint8)
    elif type_id in (1, 30):
        w[:, 1::2] &= 0x3F  # moderate exponents
    return w


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--portable", action="store_true")
    args = ap.parse_args()
    simd = _native.set_portable_kernels(args.portable)
    rng = np.random.default_rng(0)
    bw = read_bandwidth()
    print(f"threads={args.threads} simd={simd} host read bandwidth {bw:.1f} GB/s (1 thread)")
    print(f"{'type':>7} {'M':>6} {'K':>5} {'N':>4} {'ms':>9} {'GB/s':>6} {'GFLOP/s':>8}")
    for name in args.types.split(","):
        t = TYPES[name]
        for m, k, n in [(m, k, 1) for m, k in DECODE_SHAPES] + PREFILL:
            w = weights(t, m, k, rng)
            x = rng.standard_normal((n, k), dtype=np.float32)
            out = np.empty((n, m), np.float32)
            # N >= 2 in ggml's order, as a client's MUL_MAT runs (llamafile's tinyBLAS for the
            # float types and IQ4_NL; without it the float types take the vec_dot rows)
            s = best_s(
                lambda t=t, w=w, x=x, out=out, n=n: _native.matmul_quant(
                    t, w, w.shape[1], x, out, args.threads, n >= 2
                ),
                args.repeat if n == 1 else max(1, args.repeat // 2),
            )
            gbs = w.nbytes / s / 1e9
            gflops = 2 * m * k * n / s / 1e9
            print(f"{name:>7} {m:>6} {k:>5} {n:>4} {s * 1e3:>9.2f} {gbs:>6.2f} {gflops:>8.1f}")


if __name__ == "__main__":
    main()
