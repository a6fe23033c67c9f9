"""Engine benchmark: rpcnet vs the REAL reference rpc-server, same client, same run.

The REAL v8 llama.cpp client (probe ``bench/probes/engine_speed.py``, llama-bench's method)
puts every layer and the output head on the server, 2 threads each side. Sections:

- ``speed``: prefill pp64 / pp256 (one batch) and decode tg32 (single tokens), in rounds on one
  fresh server of each kind; in each round both probes run at once and take turns, every timed
  repetition of one side between two of the other's (a drift of a shared host's speed hits
  both alike), who goes first alternating by round; medians and ratios;
- ``depth``: in the same probe runs, a prompt of ``--depth`` (1536) tokens and tg32 after it,
  flash attention off and on (KV cache f16);
- ``memory``: a fresh server of each kind, one client loads the model and runs pp64 + tg32:
  peak RSS (VmHWM), and RSS once the client has left vs the server's baseline;
- ``profile``: rpcnet with ``RPCNET_PROFILE``: per-kernel time of single-token decode steps,
  kernel vs outside-kernel time per step;
- ``multi``: N clients (3) load the same model into one rpcnet server and decode at once (they
  start their timed decodes together, ``--multi-tg`` 128 tokens each, so that the sharing is
  measured rather than the start and stop skew of a one-second run); the slowest client's
  speed × N / the solo speed (the same decodes, one client, median of ``--reps``; the mean of
  the solo runs right before and after). ``--multi-runs`` (3) shared runs, each between two solo
  runs; the median run by that ratio is shown.
Achieved GB/s (decode) and GFLOP/s (prefill) are set against the machine's measured copy
bandwidth and AVX2 FMA peak (``engine_machine.py``). Models: random llamas (336 M and ~1 B)
in f16, quantized by the REAL quantizer; GGUFs are cached in ``--model-cache``.

Full run (writes bench/results/engine.json and regenerates docs/benchmarks.md, bench/report.py):
    python bench/bench_engine.py
Smoke test (336 M, q8_0, pp64 + tg32, one round; writes only the JSON in /tmp):
    python bench/bench_engine.py --quick
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path

import engine_machine
import engine_report
import engine_servers
import report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv  # noqa: E402
from support.models import (  # noqa: E402
    BENCH_LLAMA,
    LLAMA_1024,
    ModelSpec,
    ensure_model,
    harness_model,
)

PROBE = Path(__file__).resolve().parent / "probes" / "engine_speed.py"
SECTIONS = ("speed", "depth", "memory", "profile", "multi")
PROBE_TIMEOUT_S = 3600

_LLAMA = BENCH_LLAMA
MODELS: dict[str, ModelSpec] = {
    "336m": dataclasses.replace(_LLAMA, name="bench336m-f16", n_layer=24, **LLAMA_1024),
    "1b": dataclasses.replace(
        _LLAMA, name="bench1b-f16", n_embd=2048, n_layer=16, n_head=16, n_head_kv=8, n_ff=5632
    ),
    "tiny": harness_model(_LLAMA, "benchtiny-f16"),  # for checking the harness itself
}


def spec_for(base: ModelSpec, kind: str) -> ModelSpec:
    if kind == "f16":
        return base
    return dataclasses.replace(
        base, name=base.name.replace("-f16", f"-{kind}"), quant=kind, base=base
    )


def ensure_bench_model(spec: ModelSpec, cache: Path) -> Path:
    """ensure_model(), with room for the REAL quantizer to take its time on the 1 B model."""
    path = cache / f"{spec.name}-{spec.digest()}.gguf"  # ensure_model's naming: one cache
    if spec.quant is not None and spec.base is not None and not path.is_file():
        base = ensure_model(spec.base, cache)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        refenv.run_probe(
            "v8", "quantize", "--model", base, "--out", tmp, "--type", spec.quant, timeout=3600
        )
        os.replace(tmp, path)
    return ensure_model(spec, cache)


def params_of(spec: ModelSpec) -> int:
    head_dim = spec.n_embd // spec.n_head
    attn = 2 * spec.n_embd * spec.n_head * head_dim + 2 * spec.n_embd * spec.n_head_kv * head_dim
    return spec.n_layer * (attn + 3 * spec.n_embd * spec.n_ff) + 2 * spec.n_vocab * spec.n_embd


def probe(model: Path, endpoint: str, *args: object) -> dict:
    return refenv.run_probe("v8", PROBE, model, endpoint, *args, timeout=PROBE_TIMEOUT_S)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pp = ",".join(str(n) for n in args.pp)

    def log(self, *parts: object) -> None:
        print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)

    def speed(self, model: Path) -> dict:
        a = self.args
        extra = []
        if "depth" in a.sections and a.depth:
            extra += ["--depth", a.depth, "--depth-fa", "0,1"]
        if "speed" not in a.sections:
            extra.append("--no-plain")
        runs: dict[str, dict[str, list[float]]] = {side: {} for side in engine_servers.SIDES}
        with (
            engine_servers.running("ref", a.threads) as ref,
            engine_servers.running("ours", a.threads) as ours,
        ):
            for rnd in range(a.rounds):
                # Both probes run at once and take turns: every timed repetition of one side
                # sits between two of the other's, seconds apart, so a drift of a shared host's
                # speed hits both alike. Who goes first alternates by round (ABBA).
                order = (ref, ours) if rnd % 2 == 0 else (ours, ref)
                with (
                    tempfile.TemporaryDirectory() as turns,
                    concurrent.futures.ThreadPoolExecutor(2) as pool,
                ):
                    jobs = [
                        pool.submit(
                            probe,
                            model,
                            server.endpoint,
                            "--pp",
                            self.pp,
                            "--tg",
                            a.tg,
                            "--threads",
                            a.threads,
                            "--reps",
                            a.reps,
                            "--turns",
                            turns,
                            "--turn-id",
                            turn_id,
                            *extra,
                        )
                        for turn_id, server in enumerate(order)
                    ]
                    results = [job.result() for job in jobs]
                for server, r in zip(order, results, strict=True):
                    self.log(f"speed round {rnd + 1}/{a.rounds}", server.side, json.dumps(r))
                    into = runs[server.side]
                    for n, v in r["pp"].items():
                        into.setdefault(f"pp{n}", []).append(v)
                    if "tg" in r:
                        into.setdefault(f"tg{a.tg}", []).append(r["tg"])
                    for fa, d in r["depth"].items():
                        into.setdefault(f"pp{a.depth}_{fa}", []).append(d["pp"])
                        if "tg" in d:
                            into.setdefault(f"tg{a.tg}@{a.depth}_{fa}", []).append(d["tg"])
        return runs

    def memory(self, model: Path) -> dict:
        a = self.args
        out = {}
        for side in engine_servers.SIDES:
            with engine_servers.running(side, a.threads) as server:
                pid = server.proc.pid
                time.sleep(1.0)
                baseline = engine_servers.rss_mib(pid)
                r = probe(
                    model, server.endpoint, "--pp", min(a.pp), "--tg", a.tg, "--threads", a.threads
                )
                peak = engine_servers.peak_rss_mib(pid)
                after = engine_servers.settled_rss_mib(pid, baseline)
                out[side] = {
                    "baseline_mib": baseline,
                    "peak_mib": peak,
                    "after_mib": after,
                    "run": r,
                }
                self.log("memory", side, json.dumps(out[side]))
        return out

    def profile(self, model: Path) -> dict:
        a = self.args
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "profile.txt"
            with engine_servers.running("ours", a.threads, {"RPCNET_PROFILE": str(path)}) as s:
                r = probe(
                    model,
                    s.endpoint,
                    "--pp",
                    "",
                    "--tg",
                    a.profile_steps,
                    "--warm-prompt",
                    1,
                    "--threads",
                    a.threads,
                )
            # stopped with SIGTERM: the server drains and writes the file at exit
            rows = parse_profile(path.read_text() if path.exists() else "")
        steps = a.profile_steps + 2  # the 1-token warm-up prompt and warm-up token, then tg
        kernel_ms = 1000 * sum(row["seconds"] for row in rows) / steps
        step_ms = 1000 / r["tg"]
        out = {
            "steps": steps,
            "tg": r["tg"],
            "metric": f"tg{a.tg}",
            "rows": rows,
            "kernel_ms": kernel_ms,
            "step_ms": step_ms,
            "outside_ms": step_ms - kernel_ms,
        }
        self.log("profile", json.dumps({k: v for k, v in out.items() if k != "rows"}))
        return out

    def multi(self, model: Path) -> dict:
        a = self.args
        n = a.clients
        with engine_servers.running("ours", a.threads) as s:
            tg = a.multi_tg
            solo_args = ("--pp", "", "--tg", tg, "--threads", a.threads, "--reps", a.reps)
            solos = [probe(model, s.endpoint, *solo_args)["tg"]]
            shared: list[list[float]] = []
            for _ in range(a.multi_runs):
                shared.append(self.shared_decodes(model, s.endpoint, n, tg))
                # a solo run after each shared one: each shared run is bracketed in time
                solos.append(probe(model, s.endpoint, *solo_args)["tg"])
            peak = engine_servers.peak_rss_mib(s.proc.pid)
        runs = [
            {"each": each, "solo": (solos[i] + solos[i + 1]) / 2} for i, each in enumerate(shared)
        ]
        for run in runs:
            run["ratio"] = min(run["each"]) * n / run["solo"]
        # the median run by ratio (runs are odd in number by default)
        median = sorted(runs, key=lambda run: run["ratio"])[len(runs) // 2]
        out = {
            "n": n,
            "tg": tg,
            "solo": median["solo"],
            "solo_runs": solos,
            "each": median["each"],
            "ratio": median["ratio"],
            "ratios": [run["ratio"] for run in runs],
            "peak_mib": peak,
        }
        self.log("multi", json.dumps(out))
        return out

    def shared_decodes(self, model: Path, endpoint: str, n: int, tg: int) -> list[float]:
        """tok/s of each of `n` clients decoding `tg` tokens at once on one server."""
        with tempfile.TemporaryDirectory() as barrier:
            with concurrent.futures.ThreadPoolExecutor(n) as pool:
                jobs = [
                    pool.submit(
                        probe,
                        model,
                        endpoint,
                        "--pp",
                        "",
                        "--tg",
                        tg,
                        "--threads",
                        self.args.threads,
                        "--barrier",
                        barrier,
                        "--barrier-n",
                        n,
                    )
                    for _ in range(n)
                ]
                return [job.result()["tg"] for job in jobs]

    def run_type(self, base: ModelSpec, kind: str) -> dict:
        a = self.args
        path = ensure_bench_model(spec_for(base, kind), a.model_cache)
        cost = engine_machine.model_cost(path)
        ctx_tg = a.warm_prompt_ctx + a.tg // 2
        entry: dict = {
            "gguf": str(path),
            "cost": {
                **dataclasses.asdict(cost),
                "decode_bytes": cost.decode_bytes(ctx_tg),
                "prefill_flops": {str(n): cost.prefill_flops(n) for n in a.pp},
            },
        }
        self.log(f"{base.name} {kind}: {path.name}, {cost.weight_bytes / 2**20:.0f} MiB/token")
        sections = {
            "speed": lambda: self.speed(path),
            "memory": lambda: self.memory(path),
            "profile": lambda: self.profile(path),
            "multi": lambda: self.multi(path),
        }
        wanted = {"speed" if s == "depth" else s for s in a.sections}
        for name, run in sections.items():
            if name not in wanted:
                continue
            try:
                entry[name] = run()
            except Exception as exc:  # one failing section must not lose the others' numbers
                entry.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"[:2000]
                self.log(f"{base.name} {kind}: {name} FAILED:", entry["errors"][name])
        return entry


def merge_entry(old: dict, new: dict, sections: list[str]) -> dict:
    """An earlier run's results for one model and type, updated by a (partial) new run."""
    rerun = {"speed" if s == "depth" else s for s in sections}
    errors = {k: v for k, v in old.get("errors", {}).items() if k not in rerun}
    errors.update(new.get("errors", {}))
    merged = {**old, **{k: v for k, v in new.items() if k not in ("errors", "speed")}}
    if "speed" in new:  # metric by metric: a depth-only run keeps the earlier pp/tg numbers
        speed = {side: dict(m) for side, m in old.get("speed", {}).items()}
        for side, metrics in new["speed"].items():
            speed.setdefault(side, {}).update(metrics)
        merged["speed"] = speed
    merged.pop("errors", None)
    if errors:
        merged["errors"] = errors
    return merged


def parse_profile(text: str) -> list[dict]:
    """Rows of compute/profile.py's report: label (may hold spaces), calls, seconds, share."""
    rows = []
    for line in text.splitlines()[1:]:
        parts = line.rsplit(None, 3)
        if len(parts) != 4:
            continue
        try:
            rows.append({"label": parts[0], "calls": int(parts[1]), "seconds": float(parts[2])})
        except ValueError:
            continue
    return rows


#: the integer options: flag, default, help
INT_OPTIONS: tuple[tuple[str, int, str | None], ...] = (
    ("--tg", 32, None),
    ("--reps", 3, "runs of each pp/tg measurement inside a probe (median kept; multi's solo too)"),
    ("--depth", 1536, None),
    ("--clients", 3, None),
    (
        "--multi-runs",
        3,
        "shared runs of the multi section, each between two solo runs; the median is shown",
    ),
    (
        "--multi-tg",
        128,
        "decodes per client in the multi section (steady sharing, not start/stop skew)",
    ),
    ("--profile-steps", 64, None),
    ("--threads", 2, None),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 336m, q8_0, pp64 + tg32, speed only, one round",
    )
    p.add_argument("--models", default=None, help=f"comma list of {', '.join(MODELS)}")
    p.add_argument("--types", default=None, help="comma list of f16 and llama ftypes")
    p.add_argument("--sections", default=None, help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--pp", default=None, help="prefill batch sizes (default 64,256)")
    for flag, default, text in INT_OPTIONS:
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument(
        "--model-cache", type=Path, default=Path.home() / ".cache" / "rpcnet" / "bench-models"
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="benchmarks page regenerated from bench/results (full runs: docs/benchmarks.md; "
        "--quick: none unless given)",
    )
    p.add_argument("--no-doc", action="store_true")
    p.add_argument(
        "--merge",
        action="store_true",
        help="add to the results already in --json (run models/types/sections separately)",
    )
    args = p.parse_args(argv)
    quick = args.quick
    args.models = (args.models or ("336m" if quick else "336m,1b")).split(",")
    args.types = (args.types or ("q8_0" if quick else "q8_0,Q4_K_M,f16")).split(",")
    args.sections = (args.sections or ("speed" if quick else ",".join(SECTIONS))).split(",")
    args.rounds = args.rounds or (1 if quick else 4)
    args.pp = [int(x) for x in (args.pp or ("64" if quick else "64,256")).split(",") if x]
    args.warm_prompt_ctx = 8  # the probe's warm-up prompt before the timed decodes
    for name in args.models:
        if name not in MODELS:
            p.error(f"unknown model {name!r}")
    for name in args.sections:
        if name not in SECTIONS:
            p.error(f"unknown section {name!r}")
    if args.json is None:
        args.json = (
            Path(tempfile.gettempdir()) / "rpcnet-bench-engine-quick.json"
            if quick
            else report.RESULTS / "engine.json"
        )
    if args.doc is None and not quick:
        args.doc = report.DOC
    if args.no_doc:
        args.doc = None
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not refenv.available("v8"):
        print(f"reference env v8 missing: run {refenv.INSTALL_SCRIPT}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    bench = Bench(args)
    busy = engine_machine.busy_cores()
    if busy >= engine_report.BUSY_CORES:
        bench.log(f"warning: {busy:.2f} cores busy before the run: timings will be noise")
    _, steal0, total0 = engine_machine.cpu_times()
    machine = engine_machine.measure(args.threads)
    machine_doc = {
        **report.host_cpu(),
        **dataclasses.asdict(machine),
        "bandwidth_gbs": machine.bandwidth_gbs,
        "fma_peak_gflops": machine.fma_peak_gflops(args.threads),
        "effective_mhz": machine.effective_mhz(),
    }
    bench.log("machine", json.dumps(machine_doc))
    command = "python bench/bench_engine.py " + shlex.join(argv)
    results: dict = {
        "date": datetime.date.today().isoformat(),
        "config": {
            "commands": [command],
            "threads": args.threads,
            "rounds": args.rounds,
            "reps": args.reps,
            "pp": args.pp,
            "tg": args.tg,
            "depth": args.depth,
            "clients": args.clients,
            "multi_tg": args.multi_tg,
            "multi_runs": args.multi_runs,
            "sections": args.sections,
        },
        "machine": machine_doc,
        "models": {},
    }
    # one record per invocation (--merge adds to the list): the host's state during it
    run = {"command": command, "busy_cores_start": round(busy, 3)}
    runs = [run]
    before = 0.0
    if args.merge and args.json.exists():  # add to an earlier run's results (split runs)
        old = json.loads(args.json.read_text())
        results["models"] = old.get("models", {})
        results["config"]["commands"] = old["config"].get("commands", []) + [command]
        results["config"]["pp"] = sorted(set(old["config"].get("pp", [])) | set(args.pp))
        before = old.get("duration_min", 0.0)
        runs = old.get("runs", []) + runs
        for key in ("tg", "depth", "threads"):
            if old["config"].get(key) != results["config"][key]:
                print(f"warning: --merge with another {key} than the earlier run", file=sys.stderr)

    def save() -> None:
        results["duration_min"] = before + (time.monotonic() - t0) / 60
        _, steal, total = engine_machine.cpu_times()
        run["steal_share"] = round((steal - steal0) / max(total - total0, 1), 4)
        results["runs"] = runs
        args.json.write_text(json.dumps(results, indent=1) + "\n")

    for name in args.models:
        base = MODELS[name]
        shape = {
            k: getattr(base, k)
            for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "n_ff", "n_vocab")
        }
        model = results["models"].setdefault(name, {"types": {}})
        model["shape"] = {**shape, "params": params_of(base)}
        for kind in args.types:
            entry = bench.run_type(base, kind)
            old = model["types"].get(kind, {})
            model["types"][kind] = merge_entry(old, entry, args.sections)
            save()  # partial results survive an interrupted run
    save()
    text = engine_report.render(results)
    print(text)
    if args.doc is not None:
        report.write(args.doc)
        bench.log("wrote", args.doc)
    bench.log("wrote", args.json, f"({results['duration_min']:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
