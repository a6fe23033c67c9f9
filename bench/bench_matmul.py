"""Decode-shaped MUL_MAT (q8_0 weights, N activation rows): native block kernel vs NumPy path.

The NumPy path is what `kernels/matmul.py` does per run once its float32 weight copy is cached:
round the activations to q8_0 values, then np.matmul against the (M, K) float32 weights.

Usage: PYTHONPATH=python python bench/bench_matmul.py [--threads 2] [--repeat 50]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from rpcnet import _native
from rpcnet.compute import quant
from rpcnet.compute.kernels.operands import vec_dot_operand

Q8_0 = 8
SHAPES = [(2816, 1024, 1), (16384, 1024, 1), (2816, 1024, 8), (1024, 2816, 1)]


def best_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"threads={args.threads}")
    print(f"{'M':>6} {'K':>5} {'N':>2} {'numpy ms':>9} {'native ms':>9} {'speedup':>7} {'GB/s':>6}")
    for m, k, n in SHAPES:
        packed = quant.quantize(Q8_0, rng.standard_normal((m, k), dtype=np.float32))
        w32 = quant.dequantize(Q8_0, packed, m, k)
        x = rng.standard_normal((n, k), dtype=np.float32)
        out = np.empty((n, m), np.float32)
        stride = packed.shape[1]

        def numpy_path(x=x, w32=w32, out=out) -> None:
            np.matmul(vec_dot_operand(x, Q8_0), w32.T, out=out)

        def native_path(packed=packed, stride=stride, x=x, out=out) -> None:
            _native.matmul_q8_0(packed, stride, x, out, args.threads)

        t_np, t_nat = best_ms(numpy_path, args.repeat), best_ms(native_path, args.repeat)
        gbs = packed.nbytes / (t_nat * 1e-3) / 1e9
        print(f"{m:>6} {k:>5} {n:>2} {t_np:>9.3f} {t_nat:>9.3f} {t_np / t_nat:>6.1f}x {gbs:>6.1f}")


if __name__ == "__main__":
    main()
