"""Core transport benchmark: rpcnet vs the REAL reference rpc-server, same run, printed as ratios.

Measures, in rounds where the two servers take turns (medians reported), SET_TENSOR and
GET_TENSOR throughput (1 MiB, 64 MiB, 512 MiB), the median round trip of
a small command, FNV-1a GB/s next to a C loop, and the load time of a real llama.cpp client for a
model with > 10 MiB tensors, without and with a warm hash cache.

Usage: PYTHONPATH=python:tests python bench/bench_core.py [--quick] [--out docs/bench-core.md]
Needs the reference env (tools/refenv.sh). Both servers run as separate processes on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import raw_upload  # noqa: E402
from rpcnet import _native  # noqa: E402
from support import (
    refenv,  # noqa: E402
    serve,  # noqa: E402
)
from support.raw import RawConn, frame  # noqa: E402

MiB = 1 << 20


def start_rpcnet(port: int, cache: Path | None) -> subprocess.Popen:
    return serve.start_rpcnet(port, "--mem", "8G", *(["--cache", str(cache)] if cache else []))


def start_reference(port: int, cache: Path | None) -> subprocess.Popen:
    return refenv.start_reference_server("v8", port=port, cache_dir=cache)


def transfer_rates(port: int, size: int, reps: int) -> tuple[float, float]:
    """(SET GB/s, GET GB/s), best of `reps`."""
    conn = RawConn(port)
    try:
        up = raw_upload.prepare(conn, size)
        get = up.tensor.to_bytes() + struct.pack("<QQ", 0, size)
        set_best = get_best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            raw_upload.upload(conn, up)
            set_best = min(set_best, time.perf_counter() - t0)
            t0 = time.perf_counter()
            conn.call(8, get, size)
            get_best = min(get_best, time.perf_counter() - t0)
        raw_upload.free(conn, up)
        return size / set_best / 1e9, size / get_best / 1e9
    finally:
        conn.close()


def interleaved(
    measure: Callable[[int], tuple[float, ...]], ports: tuple[int, int], rounds: int
) -> tuple[list[tuple[float, ...]], list[tuple[float, ...]]]:
    """`measure(port)` of the reference and rpcnet in `rounds` rounds, who goes first alternating:
    a drift of the shared host's speed hits both sides alike."""
    out: tuple[list[tuple[float, ...]], list[tuple[float, ...]]] = ([], [])
    for r in range(rounds):
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            out[side].append(measure(ports[side]))
    return out


def median_of(values: list[tuple[float, ...]], i: int) -> float:
    return statistics.median(v[i] for v in values)


def round_trip_us(port: int, n: int) -> float:
    conn = RawConn(port)
    try:
        samples = []
        req = frame(1, struct.pack("<I", 0))
        for _ in range(n):
            t0 = time.perf_counter()
            conn.send(req)
            conn.read_response(8)
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e6
    finally:
        conn.close()


def fnv_rates(mib: int) -> tuple[float, float]:
    import bench_fnv  # type: ignore[import-not-found]

    with tempfile.TemporaryDirectory() as tmp:
        c_lib = bench_fnv.build_c(Path(tmp))
        import numpy as np

        data = np.random.default_rng(0).integers(0, 256, mib * MiB, dtype=np.uint8)
        t0 = time.perf_counter()
        _native.fnv1a64(data)
        native = data.nbytes / (time.perf_counter() - t0) / 1e9
        t0 = time.perf_counter()
        c_lib.fnv1a64(data.ctypes.data, data.nbytes)
        c = data.nbytes / (time.perf_counter() - t0) / 1e9
        return native, c


def model_load(model: Path, endpoint: str) -> float:
    os.sync()  # start from clean page cache: dirty-page throttling would skew the cache writes
    return refenv.run_probe("v8", "load", str(model), endpoint, timeout=600)["load_s"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sizes and fewer reps")
    parser.add_argument("--out", type=Path, help="write a markdown table here")
    parser.add_argument(
        "--rounds", type=int, default=0, help="rounds, the servers taking turns (default 5)"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    sizes = [1 * MiB, 64 * MiB] + ([] if args.quick else [512 * MiB])
    reps = 3 if args.quick else 5
    rounds = args.rounds or (3 if args.quick else 5)
    rows: list[tuple[str, float, float, str]] = []
    tmp = Path(tempfile.mkdtemp(prefix="rpcnet-bench-"))
    try:
        ref_port, our_port = refenv.free_port(), refenv.free_port()
        ref = start_reference(ref_port, tmp / "ref-cache")
        ours = start_rpcnet(our_port, tmp / "our-cache")
        try:
            ports = (ref_port, our_port)
            for size in sizes:
                rates = functools.partial(transfer_rates, size=size, reps=reps)
                ref_v, our_v = interleaved(rates, ports, rounds)
                for i, what in enumerate(("SET", "GET")):
                    name = f"{what}_TENSOR {size // MiB} MiB (GB/s)"
                    rows.append((name, median_of(ref_v, i), median_of(our_v, i), "higher"))
            n = (500 if args.quick else 3000) // rounds
            ref_v, our_v = interleaved(lambda port: (round_trip_us(port, n),), ports, rounds)
            rows.append(
                (
                    "round trip GET_ALIGNMENT (µs, median)",
                    median_of(ref_v, 0),
                    median_of(our_v, 0),
                    "lower",
                )
            )

            from support.models import LLAMA_1024
            from support.tinymodel import write_tiny_llama

            model = write_tiny_llama(
                tmp / "big.gguf", n_vocab=16384, n_layer=4, dtype="f32", **LLAMA_1024
            )
            loads: dict[str, tuple[list[float], list[float]]] = {"cold": ([], []), "warm": ([], [])}
            for r in range(rounds):
                shutil.rmtree(tmp / "ref-cache", ignore_errors=True)
                shutil.rmtree(tmp / "our-cache", ignore_errors=True)
                (tmp / "ref-cache").mkdir()
                (tmp / "our-cache").mkdir()
                for label in ("cold", "warm"):
                    order = (0, 1) if r % 2 == 0 else (1, 0)  # who goes first alternates
                    for side in order:
                        endpoint = f"127.0.0.1:{ports[side]}"
                        loads[label][side].append(model_load(model, endpoint))
            for label, (ref_s, our_s) in loads.items():
                name = f"real client model load, {label} cache (s)"
                rows.append((name, statistics.median(ref_s), statistics.median(our_s), "lower"))
        finally:
            refenv.stop_process(ref)
            ours.terminate()
            ours.wait(10)
        native, c = fnv_rates(64 if args.quick else 256)
        rows.append(("FNV-1a GB/s (C -O2 loop vs rpcnet native)", c, native, "higher"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    lines = [
        "| measurement | reference | rpcnet | rpcnet advantage |",
        "|---|---|---|---|",
    ]
    for name, ref_v, our_v, better in rows:
        ratio = our_v / ref_v if better == "higher" else ref_v / our_v
        lines.append(f"| {name} | {ref_v:.3f} | {our_v:.3f} | {ratio:.2f}× |")
    report.print_table(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
