"""Core transport benchmark: rpcnet vs the REAL reference rpc-server, same run, printed as ratios.

Measures SET_TENSOR and GET_TENSOR throughput (1 MiB, 64 MiB, 512 MiB), the median round trip of
a small command, FNV-1a GB/s next to a C loop, and the load time of a real llama.cpp client for a
model with > 10 MiB tensors, without and with a warm hash cache.

Usage: PYTHONPATH=python:tests python bench/bench_core.py [--quick] [--out docs/bench-core.md]
Needs the reference env (tools/refenv.sh). Both servers run as separate processes on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

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


def sync(conn: RawConn) -> None:
    conn.call(15, b"", 4)


def transfer_rates(port: int, size: int, reps: int) -> tuple[float, float]:
    """(SET GB/s, GET GB/s), best of `reps`."""
    conn = RawConn(port)
    try:
        handle, _ = struct.unpack("<QQ", conn.call(0, struct.pack("<IQ", 0, size), 16))
        base = struct.unpack("<Q", conn.call(3, struct.pack("<Q", handle), 8))[0]
        t = _native.RpcTensor(id=1, type=24, buffer=handle, data=base, ne=(size, 1, 1, 1))
        payload = bytes(size)
        head = frame(6, size=305 + size) + t.to_bytes() + b"\0" + struct.pack("<Q", 0)
        set_best = get_best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            conn.send(head)
            conn.sock.sendall(payload)
            sync(conn)
            set_best = min(set_best, time.perf_counter() - t0)
            t0 = time.perf_counter()
            conn.call(8, t.to_bytes() + struct.pack("<QQ", 0, size), size)
            get_best = min(get_best, time.perf_counter() - t0)
        conn.send(frame(4, struct.pack("<Q", handle)))
        sync(conn)
        return size / set_best / 1e9, size / get_best / 1e9
    finally:
        conn.close()


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
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    sizes = [1 * MiB, 64 * MiB] + ([] if args.quick else [512 * MiB])
    reps = 3 if args.quick else 5
    rows: list[tuple[str, float, float, str]] = []
    tmp = Path(tempfile.mkdtemp(prefix="rpcnet-bench-"))
    try:
        ref_port, our_port = refenv.free_port(), refenv.free_port()
        ref = start_reference(ref_port, tmp / "ref-cache")
        ours = start_rpcnet(our_port, tmp / "our-cache")
        try:
            for size in sizes:
                r_set, r_get = transfer_rates(ref_port, size, reps)
                o_set, o_get = transfer_rates(our_port, size, reps)
                rows.append((f"SET_TENSOR {size // MiB} MiB (GB/s)", r_set, o_set, "higher"))
                rows.append((f"GET_TENSOR {size // MiB} MiB (GB/s)", r_get, o_get, "higher"))
            n = 500 if args.quick else 3000
            rows.append(
                (
                    "round trip GET_ALIGNMENT (µs, median)",
                    round_trip_us(ref_port, n),
                    round_trip_us(our_port, n),
                    "lower",
                )
            )

            from support.tinymodel import write_tiny_llama

            model = write_tiny_llama(
                tmp / "big.gguf",
                n_vocab=16384,
                n_embd=1024,
                n_layer=4,
                n_head=16,
                n_head_kv=4,
                n_ff=2816,
                dtype="f32",
            )
            for label, warm in (("cold cache", False), ("warm cache", True)):
                if not warm:
                    shutil.rmtree(tmp / "ref-cache", ignore_errors=True)
                    shutil.rmtree(tmp / "our-cache", ignore_errors=True)
                    (tmp / "ref-cache").mkdir()
                    (tmp / "our-cache").mkdir()
                rows.append(
                    (
                        f"real client model load, {label} (s)",
                        model_load(model, f"127.0.0.1:{ref_port}"),
                        model_load(model, f"127.0.0.1:{our_port}"),
                        "lower",
                    )
                )
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
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
