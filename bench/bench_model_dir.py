"""Cold start with `--model-dir`: a real llama.cpp client loading an f16 model, every layer on
the server, measured against the same load without a weight source and against the reference
rpc-server with a warm `-c` cache.

Reports, per configuration, the client's load time (the `load` probe: llama_model_load_from_file)
and the bytes the server received (rpcnet: its rpcnet_received_bytes_total; reference: a counting
relay on a separate, identical load). Also the time `--model-dir` takes to index the file cold.

Usage: PYTHONPATH=python:tests python bench/bench_model_dir.py [--layers N] [--out FILE]
The issue's figure is a ~1.6 GB f16 model (`--layers 28`); the default (6 layers, ~0.33 GB)
runs in about 2 minutes on a 2-core machine. Needs the reference env (tools/refenv.sh).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv, serve  # noqa: E402
from support.countproxy import CountingProxy  # noqa: E402
from support.tinymodel import write_tiny_llama  # noqa: E402


def status(mport: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/status", timeout=10) as resp:
        return json.loads(resp.read())


def load(model: Path, endpoint: str) -> float:
    return refenv.run_probe("v8", "load", str(model), endpoint, timeout=900)["load_s"]


def rpcnet_run(model: Path, *args: str) -> dict:
    """Index (when --model-dir), then one timed load; the server's received bytes."""
    port, mport = refenv.free_port(), refenv.free_port()
    t0 = time.perf_counter()
    proc = serve.start_rpcnet(port, "--mem", "16G", "--metrics", str(mport), *args)
    try:
        while (status(mport).get("model_dirs") or {"ready": True})["ready"] is False:
            time.sleep(0.05)
        index_s = time.perf_counter() - t0
        before = status(mport)["totals"]["bytes_in"]
        load_s = load(model, f"127.0.0.1:{port}")
        time.sleep(0.2)
        doc = status(mport)
        return {
            "load_s": load_s,
            "received": doc["totals"]["bytes_in"] - before,
            "index_s": index_s if "--model-dir" in args else None,
        }
    finally:
        proc.terminate()
        proc.wait(30)


def reference_warm(model: Path, cache: Path) -> dict:
    port = refenv.free_port()
    proc = refenv.start_reference_server("v8", port=port, cache_dir=cache)
    try:
        load(model, f"127.0.0.1:{port}")  # fills the cache
        proxy = CountingProxy(port)
        try:
            load(model, proxy.endpoint)  # warm, relayed: the bytes
            proxy.join()
            received = proxy.to_server
        finally:
            proxy.close()
        load_s = load(model, f"127.0.0.1:{port}")  # warm, direct: the time
    finally:
        refenv.stop_process(proc)
    return {"load_s": load_s, "received": received, "index_s": None}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--out", type=Path, help="append the markdown table here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-modeldir-"))
    try:
        models = work / "models"
        models.mkdir()
        model = write_tiny_llama(
            models / "f16.gguf",
            n_vocab=8192,
            n_embd=1024,
            n_layer=args.layers,
            n_head=8,
            n_head_kv=8,
            n_ff=8192,
            dtype="f16",
        )
        size = model.stat().st_size
        rows = {
            "rpcnet, no cache (cold)": rpcnet_run(model),
            "rpcnet --model-dir (cold, first index)": rpcnet_run(model, "--model-dir", str(models)),
            "rpcnet --model-dir (sidecar index)": rpcnet_run(model, "--model-dir", str(models)),
            "reference rpc-server -c (warm)": reference_warm(model, work / "refcache"),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [
        f"f16 model, {args.layers} layers, {size / 1e9:.2f} GB, every layer on the server",
        "",
        "| configuration | client load (s) | bytes the server received | index (s) |",
        "|---|---|---|---|",
    ]
    for name, r in rows.items():
        index = "" if r["index_s"] is None else f"{r['index_s']:.1f}"
        lines.append(f"| {name} | {r['load_s']:.2f} | {r['received'] / 1e6:,.1f} MB | {index} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
