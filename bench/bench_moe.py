"""MoE benchmark: qwen3moe-style models on rpcnet against the REAL reference rpc-server.

Random-weight qwen3moe models (n_embd 1024, 12 layers, 16 heads / 4 KV heads, expert ff 512,
vocab 32000): 32 experts with 4 used and 64 with 8 used, written in f16 and quantized by the REAL
quantizer. The REAL v8 client (probe ``bench/probes/engine_speed.py``) puts every layer and the
output head on the server, 2 threads each side, and measures pp256 (one batch) and tg32 (single
tokens after an 8-token prompt). Like with like: the reference wheel's CPU backend is an AVX2
build, so rpcnet runs with ``RPCNET_NO_AVX512=1``.

Sides, measured two at a time in turns (every timed repetition of one between two of the
other's, so a drift of a shared host's speed hits both alike): ``ours`` (rpcnet from this tree)
against ``ref`` (the reference rpc-server) and, with ``--before DIR``, against ``before`` (rpcnet
with the ``python/`` tree DIR first on PYTHONPATH: an earlier version's Python over the same
extension).
Writes bench/results/moe.json (one table, bench/report.py's format) and regenerates
docs/benchmarks.md.

    python bench/bench_moe.py [--types q8_0,Q4_K_M] [--rounds 3] [--before /tmp/old/python]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import engine_servers
import report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv  # noqa: E402
from support.models import ModelSpec, ensure_model  # noqa: E402

PROBE = Path(__file__).resolve().parent / "probes" / "engine_speed.py"
RESULT = Path(__file__).resolve().parent / "results" / "moe.json"

_MOE = ModelSpec(
    "benchmoe",
    arch="qwen3moe",
    dtype="f16",
    n_vocab=32000,
    n_embd=1024,
    n_layer=12,
    n_head=16,
    n_head_kv=4,
    head_dim=64,
    n_ff=512,
    n_ff_exp=512,
    n_ctx_train=4096,
    seed=35,
)
MODELS = {
    "32x4": dataclasses.replace(_MOE, name="benchmoe32x4-f16", n_expert=32, n_expert_used=4),
    "64x8": dataclasses.replace(_MOE, name="benchmoe64x8-f16", n_expert=64, n_expert_used=8),
}


def log(*parts: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


def model_path(base: ModelSpec, kind: str, cache: Path) -> Path:
    """The GGUF of `base` in `kind` (the REAL quantizer from the f16 one), cached."""
    if kind == "f16":
        return ensure_model(base, cache)
    spec = dataclasses.replace(base, name=base.name.replace("-f16", f"-{kind}"), quant=kind)
    spec = dataclasses.replace(spec, base=base)
    path = cache / f"{spec.name}-{spec.digest()}.gguf"
    if not path.is_file():
        source = ensure_model(base, cache)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        refenv.run_probe(
            "v8", "quantize", "--model", source, "--out", tmp, "--type", kind, timeout=3600
        )
        os.replace(tmp, path)
    return path


def start(side: str, threads: int, before: Path | None) -> engine_servers.Server:
    if side == "ref":
        return engine_servers.start("ref", threads)
    env = {"RPCNET_NO_AVX512": "1"}
    if side == "before":
        assert before is not None
        env["PYTHONPATH"] = f"{before}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    return engine_servers.start(side, threads, env)


def probe(
    path: Path,
    server: engine_servers.Server,
    turns: str,
    turn_id: int,
    args: argparse.Namespace,
    extra: tuple = (),
) -> dict:
    return refenv.run_probe(
        "v8",
        PROBE,
        path,
        server.endpoint,
        "--pp",
        args.pp,
        "--tg",
        args.tg,
        "--threads",
        args.threads,
        "--reps",
        args.reps,
        *extra,
        "--turns",
        turns,
        "--turn-id",
        turn_id,
        timeout=3600,
    )


def in_turns(
    path: Path,
    servers: list[engine_servers.Server],
    args: argparse.Namespace,
    extra: tuple = (),
    label: str = "",
) -> dict[str, dict[str, list[float]]]:
    """{side: {"pp": [tok/s per round], "tg": [...]}} of two running servers measured in turns.

    Both probes run at once and take turns (bench/probes/engine_speed.py): every timed
    repetition of one side sits between two of the other's, seconds apart, so a drift of a
    shared host's speed hits both alike; who goes first alternates by round. `extra`: more
    probe options (e.g. ``--fa 1``)."""
    runs: dict[str, dict[str, list[float]]] = {s.side: {"pp": [], "tg": []} for s in servers}
    for rnd in range(args.rounds):
        order = servers if rnd % 2 == 0 else servers[::-1]
        with (
            tempfile.TemporaryDirectory() as turns,
            concurrent.futures.ThreadPoolExecutor(2) as pool,
        ):
            jobs = [
                pool.submit(probe, path, server, turns, turn_id, args, extra)
                for turn_id, server in enumerate(order)
            ]
            results = [job.result() for job in jobs]
        for server, r in zip(order, results, strict=True):
            log(f"{label}round {rnd + 1}/{args.rounds}", server.side, json.dumps(r))
            runs[server.side]["pp"].append(r["pp"][str(args.pp)])
            runs[server.side]["tg"].append(r["tg"])
    return runs


def measure(path: Path, pair: tuple[str, str], args: argparse.Namespace) -> dict[str, dict]:
    """{side: {"pp": [tok/s per round], "tg": [...]}} for two sides measured in turns
    (`in_turns`) on fresh servers."""
    servers = [start(side, args.threads, args.before) for side in pair]
    try:
        return in_turns(path, servers, args)
    finally:
        for server in servers:
            engine_servers.stop(server)


def table(results: dict, args: argparse.Namespace) -> dict:
    """Per model, type and metric: rpcnet against the reference, and against `before` where
    measured (each ratio from its own pair of sides measured in turns)."""
    before = any("before" in runs for runs in results.values())
    columns = ["model", "type", "metric", "reference tok/s", "rpcnet tok/s", "rpcnet / ref"]
    if before:
        columns += ["before tok/s", "rpcnet tok/s (vs before)", "rpcnet / before"]
    rows = []
    for (model, kind), runs in results.items():
        for metric, label in (("pp", f"pp{args.pp}"), ("tg", f"tg{args.tg}")):
            ref = {s: statistics.median(v[metric]) for s, v in runs["ref"].items()}
            row = [
                model,
                kind,
                label,
                f"{ref['ref']:.2f}",
                f"{ref['ours']:.2f}",
                f"{ref['ours'] / ref['ref']:.2f}×",
            ]
            if "before" in runs:
                old = {s: statistics.median(v[metric]) for s, v in runs["before"].items()}
                row += [
                    f"{old['before']:.2f}",
                    f"{old['ours']:.2f}",
                    f"{old['ours'] / old['before']:.2f}×",
                ]
            rows.append(row)
    return {"columns": columns, "rows": rows}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="32x4,64x8")
    p.add_argument("--types", default="q8_0")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pp", type=int, default=256)
    p.add_argument("--tg", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--before", type=Path, default=None, help="an earlier python/ tree")
    p.add_argument("--before-label", default="", help="what --before is, for the notes")
    p.add_argument(
        "--model-cache", type=Path, default=Path.home() / ".cache" / "rpcnet" / "bench-models"
    )
    p.add_argument("--json", type=Path, default=RESULT)
    p.add_argument("--no-doc", action="store_true")
    p.add_argument("--merge", action="store_true", help="keep --json's other rows")
    args = p.parse_args(argv)
    load_before = os.getloadavg()[1]
    pairs = [("ref", "ours")] + ([("before", "ours")] if args.before else [])
    results: dict[tuple[str, str], dict] = {}
    for name in args.models.split(","):
        for kind in args.types.split(","):
            path = model_path(MODELS[name], kind, args.model_cache)
            log(f"{name} {kind}: {path.name}")
            results[(name, kind)] = {pair[0]: measure(path, pair, args) for pair in pairs}
    raw = {f"{m} {k}": runs for (m, k), runs in results.items()}
    if args.merge and args.json.is_file():
        # rows measured by an earlier run and not now are kept (from its raw medians' inputs)
        raw = {**json.loads(args.json.read_text())["raw"], **raw}
        results = {tuple(key.split(" ", 1)): runs for key, runs in raw.items()}
    machine = {**report.host_cpu(), "cores": os.cpu_count()}
    doc = {
        "title": "MoE (qwen3moe style) against the reference rpc-server",
        "script": "bench/bench_moe.py",
        "command": "python bench/bench_moe.py " + " ".join(argv),
        "machine": machine,
        "description": [
            "Random-weight qwen3moe models, n_embd 1024, 12 layers, 16 heads / 4 KV heads, "
            "expert ff 512, vocab 32000: `32x4` has 32 experts with 4 used per token, `64x8` 64 "
            "with 8 used; f16 quantized by the REAL quantizer. The REAL v8 client puts every "
            f"layer and the output head on the server, `--threads {args.threads}` on each side; "
            f"pp{args.pp} is one batch, tg{args.tg} single tokens after an 8-token prompt "
            "(flash attention off). rpcnet runs with `RPCNET_NO_AVX512=1`: the "
            "reference wheel's CPU backend is an AVX2 build, so both sides use AVX2 kernels. "
            f"Two sides at a time, measured in turns (every timed repetition of one between two "
            f"of the other's): rpcnet and the reference, then rpcnet and `before` where given; "
            f"medians of {args.rounds} rounds of {args.reps} repetitions, fresh servers per "
            "model.",
        ],
        "tables": [table(results, args)],
        "notes": [n for n in [args.before_label, report.load_note(load_before)] if n],
        "raw": raw,
    }
    report.save(args.json, doc, render_doc=not args.no_doc)
    log("wrote", args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
