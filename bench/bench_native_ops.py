"""Native non-matmul kernels: decode tok/s of the REAL llama.cpp client on rpcnet with the NumPy
kernels (`RPCNET_NATIVE_OPS=0`) vs the native ones, FA on/off, at an empty cache and after a
prompt; then the same runs with `RPCNET_PROFILE` for the server's host time per plan run.

MUL_MAT runs on the same kernels in both columns, so the difference is the other ops and the
per-node overhead. Small q8_0 model so one run takes well under a minute on 2 cores.

Usage: PYTHONPATH=python:tests python bench/bench_native_ops.py [--depth 1024] [--tg 32]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv, serve  # noqa: E402
from support.models import ModelSpec, ensure_model  # noqa: E402

BASE = ModelSpec(
    "bench-native-f16",
    dtype="f16",
    n_vocab=4096,
    n_embd=512,
    n_layer=8,
    n_head=8,
    n_head_kv=2,
    n_ff=1408,
    n_ctx_train=2048,
    seed=42,
)
PLAN = re.compile(r"\(plan: host time of whole runs\)\s+(\d+)\s+([\d.]+)")


def run(model: Path, native: bool, fa: int, depth: int, tg: int, profile: str | None) -> float:
    env = {"RPCNET_NATIVE_OPS": "1" if native else "0"}
    if profile:
        env["RPCNET_PROFILE"] = profile
    saved = dict(os.environ)
    os.environ.update(env)
    port = refenv.free_port()
    try:
        proc = serve.start_rpcnet(port, "--threads", "2")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        r = refenv.run_probe(
            "v8",
            "speed",
            str(model),
            f"127.0.0.1:{port}",
            "--pp",
            "",
            "--tg",
            tg,
            "--flash-attn",
            fa,
            "--depth",
            depth,
            timeout=900,
        )
    finally:
        proc.terminate()
        proc.wait(30)
    return float(r["tg"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--depth", type=int, default=1024)
    parser.add_argument("--tg", type=int, default=32)
    parser.add_argument(
        "--models", type=Path, default=Path(tempfile.gettempdir()) / "rpcnet-bench-models"
    )
    args = parser.parse_args()
    spec = dataclasses.replace(BASE, name=f"{BASE.name}-q8_0", quant="q8_0", base=BASE)
    model = ensure_model(spec, args.models)
    lines = [
        "| FA | depth | NumPy ops tok/s | native tok/s | native / NumPy |"
        " host ms/step NumPy | host ms/step native |",
        "|---|---|---|---|---|---|---|",
    ]
    for fa, depth in ((1, 0), (0, 0), (1, args.depth), (0, args.depth)):
        speed, host = {}, {}
        for native in (False, True):
            speed[native] = run(model, native, fa, depth, args.tg, None)
            with tempfile.NamedTemporaryFile(suffix=".txt") as prof:
                run(model, native, fa, depth, args.tg, prof.name)
                m = PLAN.search(Path(prof.name).read_text())
            host[native] = float(m.group(2)) / int(m.group(1)) * 1e3 if m else float("nan")
        lines.append(
            f"| {'on' if fa else 'off'} | {depth} | {speed[False]:.2f} | {speed[True]:.2f} "
            f"| {speed[True] / speed[False]:.2f}× | {host[False]:.1f} | {host[True]:.1f} |"
        )
        print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
