"""tg128 / pp512 of `rpcnet serve --device cuda` through the REAL v8 client (every layer and the
output head on the server, the client on the CPU), FA off, on the random 1.1 B llama of the GPU
acceptance (16 layers, n_embd 2048, 16 heads, 8 KV heads, n_ff 8192, vocab 32000).

The models are generated here (f16 by the gguf writer, q8_0 and Q4_K_M by the REAL quantizer).
Each type gets a fresh server whose log is kept next to the JSON.

Each server logs, per client, how its graphs ran (eager, captured, replayed; host µs and
kernels per run): those lines go into the JSON. `--profile TYPE` adds a run of that type with
`RPCNET_PROFILE` (every kernel waited for: its own GPU time) over `--profile-tg` decodes.

Usage: python bench/gpu_speed.py --out speed.json [--types q8_0,Q4_K_M,f16] [--tg 128]
       [--pp 512] [--model-cache DIR] [--threads 16] [--tiny] [--profile q8_0]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv  # noqa: E402
from support.models import BENCH_LLAMA, ModelSpec, ensure_model, harness_model  # noqa: E402
from support.serve import wait_listening  # noqa: E402

PROBE = Path(__file__).resolve().parent / "probes" / "engine_speed.py"

#: The acceptance model, and a tiny one of the same shape family for the dry run.
_GPU_LLAMA = dataclasses.replace(BENCH_LLAMA, seed=7)
MODEL_1B = dataclasses.replace(
    _GPU_LLAMA, name="gpu1b-f16", n_embd=2048, n_layer=16, n_head=16, n_head_kv=8, n_ff=8192
)
MODEL_TINY = harness_model(MODEL_1B, "gputiny-f16")
#: rpc-server (CUDA, b11434, protocol 7, FA off) on the H200: the acceptance baseline.
BASELINE = {"q8_0": (499.0, 23.4e3), "Q4_K_M": (512.0, 22.2e3), "f16": (510.0, 28.0e3)}


def model_for(base: ModelSpec, kind: str, cache: Path, threads: int) -> Path:
    if kind == "f16":
        return ensure_model(base, cache)
    spec = dataclasses.replace(base, name=base.name.replace("-f16", f"-{kind}"))
    path = cache / f"{spec.name}-{base.digest()}.gguf"
    if not path.is_file():
        src = ensure_model(base, cache)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        refenv.run_probe(
            "v8",
            "quantize",
            "--model",
            src,
            "--out",
            tmp,
            "--type",
            kind,
            "--threads",
            threads,
            timeout=600,
        )
        os.replace(tmp, path)
    return path


def serve(port: int, device: str, log: Path, profile: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, RPCNET_CUDA_EXPERIMENTAL="1", PYTHONUNBUFFERED="1")
    if profile is not None:
        env["RPCNET_PROFILE"] = str(profile)
        env["RPCNET_PROFILE_SHAPES"] = "1"
    argv = [sys.executable, "-m", "rpcnet.cli", "serve", "--port", str(port), "--device", device]
    if profile is not None:
        argv.append("-vv")  # every command with its latency, for the decode profile
    proc = subprocess.Popen(
        argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL
    )
    wait_listening(port, proc)
    return proc


def probe_fresh_server(
    args: argparse.Namespace, model: Path, log: Path, probe_args: list, profile: Path | None = None
) -> dict:
    """The speed probe against a fresh server (its log in `log`), stopped afterwards (a
    profile report is written at exit); {"error": ...} when the probe failed, "server_rc"."""
    port = refenv.free_port()
    proc = serve(port, args.device, log, profile=profile)
    try:
        r = refenv.run_probe(
            "v8",
            PROBE,
            model,
            f"127.0.0.1:{port}",
            *probe_args,
            "--threads",
            args.threads,
            timeout=300,
        )
    except Exception as exc:  # noqa: BLE001 - reported in the JSON
        r = {"error": str(exc)[-3000:]}
    finally:
        refenv.stop_process(proc, timeout=60)
    r["server_rc"] = proc.returncode
    return r


def profile_run(args: argparse.Namespace, base: ModelSpec, kind: str) -> dict:
    """Decode only (a warm prompt of 8, then `--profile-tg` tokens), every kernel timed."""
    model = model_for(base, kind, args.model_cache, args.threads)
    report = args.out.with_name(f"{args.out.stem}-{kind}-profile.txt")
    log = args.out.with_name(f"{args.out.stem}-{kind}-profile-server.log")
    r = probe_fresh_server(args, model, log, ["--pp", "", "--tg", args.profile_tg], report)
    r["report"] = report.read_text().splitlines()[:40] if report.is_file() else None
    r["commands_ms"] = command_latencies(log)
    return r


def command_latencies(log: Path) -> dict[str, list[float]]:
    """{command: [count, mean ms, max ms]} from a `-vv` server log."""
    seen: dict[str, list[float]] = {}
    for m in re.finditer(r": (\w+) in ([\d.]+) ms", log.read_text() if log.is_file() else ""):
        seen.setdefault(m.group(1), []).append(float(m.group(2)))
    return {k: [len(v), round(sum(v) / len(v), 3), max(v)] for k, v in seen.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--types", default="q8_0,Q4_K_M,f16")
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--model-cache", type=Path, default=Path("/tmp/rpcnet-gpu-models"))
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--tiny", action="store_true", help="the tiny model (dry run)")
    ap.add_argument("--profile", default="", help="a type to profile kernel by kernel")
    ap.add_argument("--profile-tg", type=int, default=16)
    args = ap.parse_args(argv)
    base = MODEL_TINY if args.tiny else MODEL_1B
    results: dict = {
        "model": dataclasses.asdict(base),
        "device": args.device,
        "client": "v8",
        "fa": 0,
        "types": {},
    }

    def save() -> None:
        args.out.write_text(json.dumps(results, indent=1, default=str) + "\n")

    for kind in args.types.split(","):
        entry: dict = {}
        results["types"][kind] = entry
        t0 = time.perf_counter()
        try:
            model = model_for(base, kind, args.model_cache, args.threads)
        except Exception as exc:  # noqa: BLE001 - reported in the JSON, next type goes on
            entry["error"] = f"model: {exc}"[:2000]
            save()
            continue
        entry["model_s"] = round(time.perf_counter() - t0, 1)
        log = args.out.with_name(f"{args.out.stem}-{kind}-server.log")
        probe_args = ["--pp", args.pp, "--tg", args.tg, "--reps", args.reps]
        entry.update(probe_fresh_server(args, model, log, probe_args))
        if kind in BASELINE and not args.tiny and "error" not in entry:
            tg_base, pp_base = BASELINE[kind]
            entry["tg_ratio"] = round(entry["tg"] / tg_base, 3)
            entry["pp_ratio"] = round(entry["pp"][str(args.pp)] / pp_base, 3)
        entry["runs"] = [
            ln.split("INFO ", 1)[-1] for ln in log.read_text().splitlines() if "cuda graphs" in ln
        ]
        save()
        print(kind, json.dumps(entry), flush=True)
    if args.profile:
        results["profile"] = profile_run(args, base, args.profile)
    save()
    ok = all("error" not in e for e in results["types"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
