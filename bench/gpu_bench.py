"""GPU kernel figures for docs/gpu.md: decode matvec GB/s per weight type and shape, staged
upload GB/s, and the f16-scratch + cuBLAS prefill rate. Needs CuPy and a GPU.

Matvec shapes are (K, M): K-element rows, M rows (4096x4096: attention projections, 4096x14336:
gate/up, 14336x4096: down). GB/s counts the weight bytes read once per call (the q8_1
quantization of the activation is included in the time). Timing: CUDA events around `--iters`
back-to-back launches after a warm-up, best of `--repeat`.

Usage: python bench/gpu_bench.py [--out results.json] [--types Q8_0,Q4_K] [--ncols 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

SHAPES = [(4096, 4096), (4096, 14336), (14336, 4096)]
#: the 1.1 B llama of the device check (Q/O, gate/up, down), warp-per-row vs split rows
MODEL_SHAPES = [(2048, 2048), (2048, 8192), (8192, 2048)]
MODEL_TYPES = ("Q8_0", "Q4_K", "Q6_K", "F16")


def time_ms(be, fn, iters: int, repeat: int) -> float:
    cp = be.cp
    fn()
    be.synchronize()
    best = float("inf")
    with be.device:
        for _ in range(repeat):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(be.stream)
            for _ in range(iters):
                fn()
            end.record(be.stream)
            end.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(start, end) / iters)
    return best


def bench_matvec(
    be, types, ncols: int, iters: int, repeat: int, shapes=SHAPES, split: bool | None = None
) -> list[dict]:
    from rpcnet.compute.cuda import launch

    cp = be.cp
    rows = []
    for type_name in types:
        for k, m in shapes:
            nbytes = launch.row_bytes(type_name, k) * m
            with be.device:
                w = cp.random.randint(0, 256, nbytes, dtype=cp.uint8)
                if type_name in ("F32", "F16", "BF16"):  # finite values: no NaN slow paths
                    w[:] = 0
                y = cp.random.standard_normal((ncols, k), dtype=cp.float32)
                dst = cp.empty((ncols, m), cp.float32)
                scratch = cp.empty(launch.q8_1_bytes(k, ncols), cp.uint8)
            ms = time_ms(
                be,
                lambda w=w, y=y, dst=dst, s=scratch, t=type_name, k=k, m=m: launch.matvec(
                    be, t, w, y, dst, k, m, ncols, s, split=split
                ),
                iters,
                repeat,
            )
            rows.append(
                {
                    "type": type_name,
                    "k": k,
                    "m": m,
                    "ncols": ncols,
                    "split": launch.split_rows(type_name, k) if split is None else split,
                    "us": round(ms * 1e3, 2),
                    "GBps": round(nbytes / (ms * 1e-3) / 1e9, 1),
                }
            )
            del w, y, dst, scratch
    return rows


def bench_upload(be, mib: int, repeat: int) -> dict:
    """Pinned double-buffered staging from host memory (no socket): the device side of
    SET_TENSOR's pipeline."""
    payload = np.random.default_rng(0).integers(0, 256, mib << 20, dtype=np.uint8)
    buf = be.allocate(mib << 20)
    assert buf is not None
    best = float("inf")
    for _ in range(repeat):
        pos = 0

        def fill(view, payload=payload):
            nonlocal pos
            np.frombuffer(view, np.uint8)[:] = payload[pos : pos + len(view)]
            pos += len(view)

        t0 = time.perf_counter()
        be.upload(buf, 0, mib << 20, fill)
        be.synchronize()
        best = min(best, time.perf_counter() - t0)
    return {"MiB": mib, "GBps": round((mib << 20) / best / 1e9, 2)}


def bench_prefill(be, type_name: str, n: int, iters: int, repeat: int) -> dict:
    from rpcnet.compute.cuda import launch

    cp = be.cp
    k, m = 4096, 14336
    w_bytes, y_bytes = launch.prefill_scratch_bytes(type_name, k, m, n)
    with be.device:
        w = cp.zeros(launch.row_bytes(type_name, k) * m, cp.uint8)
        y = cp.random.standard_normal((n, k), dtype=cp.float32)
        out = cp.empty((n, m), cp.float32)
        w16 = cp.empty(max(w_bytes, 1), cp.uint8)
        y16 = cp.empty(max(y_bytes, 1), cp.uint8)
    ms = time_ms(
        be,
        lambda: launch.matmul_prefill(be, type_name, w, y, out, k, m, w16, y16),
        iters,
        repeat,
    )
    return {
        "type": type_name,
        "n": n,
        "k": k,
        "m": m,
        "ms": round(ms, 3),
        "TFLOPs": round(2 * n * k * m / (ms * 1e-3) / 1e12, 1),
    }


def bench_launch_overhead(be, n_kernels: int = 300, repeat: int = 5) -> dict:
    """µs per kernel of a decode-sized step (n_kernels small launches): eager vs one replayed
    captured CUDA graph (the plan-replay path of compute/cuda/capture.py)."""
    from rpcnet.compute.cuda import launch
    from rpcnet.compute.cuda.capture import GraphReplayCache
    from rpcnet.compute.cuda.device import CupyCapturer

    cp = be.cp
    with be.device:
        x = cp.random.standard_normal((1, 2048), dtype=cp.float32)
        out = cp.empty_like(x)

    def step():
        for _ in range(n_kernels):
            launch.rms_norm(be, x, out, 1e-6)

    cache = GraphReplayCache(CupyCapturer(be.stream))
    result = {"kernels": n_kernels}
    for mode in ("eager", "replayed"):
        best = float("inf")
        for _ in range(repeat + 2):
            be.synchronize()
            t0 = time.perf_counter()
            got = cache.run("bench", "step", frozenset(), mode == "replayed", step)
            be.synchronize()
            if got == mode:
                best = min(best, time.perf_counter() - t0)
        result[f"{mode}_us_per_kernel"] = round(best / n_kernels * 1e6, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    from rpcnet.compute.cuda import sources
    from rpcnet.compute.cuda.device import CudaBackend

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON here too")
    ap.add_argument("--types", default=",".join(sources.WEIGHT_TYPES))
    ap.add_argument("--ncols", type=int, default=1)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    be = CudaBackend(0)
    t0 = time.perf_counter()
    be.kernels.warm()
    result = {
        "gpu": be.info.name,
        "capability": list(be.info.capability),
        "compile_s": round(time.perf_counter() - t0, 1),
        "matvec": bench_matvec(be, args.types.split(","), args.ncols, args.iters, args.repeat),
        "matvec_model": [
            row
            for split in (False, True)
            for row in bench_matvec(
                be, MODEL_TYPES, args.ncols, args.iters, args.repeat, MODEL_SHAPES, split
            )
        ],
        "upload": [bench_upload(be, mib, args.repeat) for mib in (64, 256)],
        "prefill": [bench_prefill(be, t, 512, 5, args.repeat) for t in ("Q8_0", "Q4_K", "F16")],
        "launch": bench_launch_overhead(be),
    }
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
