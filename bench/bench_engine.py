"""Engine benchmark: prefill (pp64, pp256) and decode (tg32) tokens/s of the REAL llama.cpp client
with every layer on rpcnet vs on the reference rpc-server, same model, same run.

Rounds are interleaved (reference, rpcnet, reference, rpcnet, ...) and medians are reported with
the ratio rpcnet / reference. Models: a random-weight llama of about 0.30 B parameters in f16,
quantized by the REAL llama.cpp quantizer to q8_0 and Q4_K_M. Both servers use 2 threads.

Usage: PYTHONPATH=python:tests python bench/bench_engine.py [--rounds 3] [--types q8_0,Q4_K_M,f16]
       [--small] [--out docs/bench-engine.md] [--profile docs/profile-decode.txt]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv, serve  # noqa: E402
from support.models import ModelSpec, ensure_model  # noqa: E402

BASE = ModelSpec(
    "bench-llama-f16",
    dtype="f16",
    n_vocab=16384,
    n_embd=1024,
    n_layer=24,
    n_head=16,
    n_head_kv=4,
    n_ff=2816,
    n_ctx_train=2048,
    seed=42,
)
SMALL = dataclasses.replace(
    BASE,
    name="bench-small-f16",
    n_vocab=4096,
    n_embd=256,
    n_layer=4,
    n_ff=768,
    n_head=4,
    n_head_kv=2,
)


def spec_for(base: ModelSpec, kind: str) -> ModelSpec:
    if kind == "f16":
        return base
    return dataclasses.replace(base, name=f"{base.name}-{kind}", quant=kind, base=base)


def start_rpcnet(port: int, threads: int) -> subprocess.Popen:
    return serve.start_rpcnet(port, "--threads", str(threads))


def measure(model: Path, endpoint: str, pp: str, tg: int) -> dict:
    return refenv.run_probe(
        "v8", "speed", str(model), endpoint, "--pp", pp, "--tg", tg, timeout=3600
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--types", default="q8_0,Q4_K_M,f16")
    parser.add_argument("--pp", default="64,256")
    parser.add_argument("--tg", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="a tiny model, for a quick check")
    parser.add_argument(
        "--models", type=Path, default=Path(tempfile.gettempdir()) / "rpcnet-bench-models"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    base = SMALL if args.small else BASE
    lines = [
        f"model: random llama, n_embd {base.n_embd}, {base.n_layer} layers, vocab {base.n_vocab}; "
        f"{args.threads} threads each side; {args.rounds} interleaved rounds, medians",
        "",
        "| weights | metric | reference tok/s | rpcnet tok/s | rpcnet / reference |",
        "|---|---|---|---|---|",
    ]
    for kind in args.types.split(","):
        model = ensure_model(spec_for(base, kind), args.models)
        ref_port, our_port = refenv.free_port(), refenv.free_port()
        ref = refenv.start_reference_server("v8", port=ref_port, threads=args.threads)
        ours = start_rpcnet(our_port, args.threads)
        results: dict[str, dict[str, list[float]]] = {"ref": {}, "ours": {}}
        try:
            for _ in range(args.rounds):
                for side, port in (("ref", ref_port), ("ours", our_port)):
                    r = measure(model, f"127.0.0.1:{port}", args.pp, args.tg)
                    for n, v in r["pp"].items():
                        results[side].setdefault(f"pp{n}", []).append(v)
                    results[side].setdefault(f"tg{args.tg}", []).append(r["tg"])
                    print(side, kind, json.dumps(r), flush=True)
        finally:
            refenv.stop_process(ref)
            ours.terminate()
            ours.wait(30)
        for metric in results["ref"]:
            r = statistics.median(results["ref"][metric])
            o = statistics.median(results["ours"][metric])
            lines.append(f"| {kind} | {metric} | {r:.2f} | {o:.2f} | {o / r:.3f}× |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
