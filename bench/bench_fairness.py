"""Fair turns on one device: REAL v8 llama.cpp clients sharing one `rpcnet serve --threads 2`.

Each client is its own process (bench/probes/fair_client.py: every layer and the output head on
the server); all of a scenario's clients load the model and warm up, then start together.
- ``prefill``: one client decodes ``--tg`` tokens alone (p99 per token), then again while
  another client runs pp``--pp`` prompts back to back; the ratio of the two p99s (target ≤ 2),
  in ``--rounds`` rounds, the median round's reported.
- ``fairness``: N = 1, 2, 3 clients decode ``--tg`` tokens at once; each client's tok/s against
  the solo tok/s, times N (target ≥ 0.8).
- ``mixed``: ``--reps`` pp``--pp`` prompts and ``--tg`` decoded tokens, first one client at a
  time (solo walls summed), then by two clients at once; the solo sum over the mixed wall is
  the mixed load's share of one-at-a-time throughput (target ≥ 0.95), in ``--rounds`` rounds,
  the median round's reported.
Model: bench_engine's 336 M llama, q8_0. Writes bench/results/fairness.json (report.py's format)
and regenerates docs/benchmarks.md:
    python bench/bench_fairness.py
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import engine_servers
import report
from bench_engine import MODELS, ensure_bench_model, spec_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv  # noqa: E402

PROBE = Path(__file__).resolve().parent / "probes" / "fair_client.py"
RESULT = Path(__file__).resolve().parent / "results" / "fairness.json"


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.99 * (len(ordered) - 1))))]


class Bench:
    def __init__(self, args: argparse.Namespace, model: Path) -> None:
        self.args, self.model = args, model

    def log(self, *parts: object) -> None:
        print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)

    def together(self, endpoint: str, clients: list[list[object]]) -> list[dict]:
        """Run the probes (their mode arguments each) at once: all start when all are ready; a
        prefill client given no --reps runs until every other client is done."""
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            start, stop = work / "start", work / "stop"
            ready = [work / f"ready-{i}" for i in range(len(clients))]
            endless = [i for i, c in enumerate(clients) if c[:2] == ["--mode", "prefill"]]
            endless = [i for i in endless if "--reps" not in clients[i]]

            def run(i: int) -> dict:
                extra: list[object] = ["--ready", ready[i], "--start", start]
                if i in endless:
                    extra += ["--stop", stop]
                return refenv.run_probe(
                    "v8",
                    PROBE,
                    self.model,
                    endpoint,
                    *clients[i],
                    "--threads",
                    self.args.threads,
                    *extra,
                    timeout=1800,
                )

            with concurrent.futures.ThreadPoolExecutor(len(clients)) as pool:
                jobs = [pool.submit(run, i) for i in range(len(clients))]
                while not all(r.exists() for r in ready):
                    failed = [j for j in jobs if j.done()]
                    if failed:
                        failed[0].result()
                    time.sleep(0.05)
                start.touch()
                finite = [j for i, j in enumerate(jobs) if i not in endless]
                concurrent.futures.wait(finite)
                stop.touch()
                return [j.result() for j in jobs]

    def decode_args(self) -> list[object]:
        return ["--mode", "decode", "--tg", self.args.tg]

    def prefill_args(self, reps: int | None = None) -> list[object]:
        out: list[object] = ["--mode", "prefill", "--pp", self.args.pp]
        return out if reps is None else [*out, "--reps", reps]

    def prefill_scenario(self, endpoint: str) -> dict:
        """Rounds of (decode alone, decode beside prompts): a drift of a shared host's speed
        hits both runs of a round alike; the median round's ratio is reported."""
        rounds = []
        solo_all: list[float] = []
        beside_all: list[float] = []
        for _ in range(self.args.rounds):
            (solo,) = self.together(endpoint, [self.decode_args()])
            beside = self.together(endpoint, [self.decode_args(), self.prefill_args()])
            solo_all += solo["seconds"]
            beside_all += beside[0]["seconds"]
            entry = {
                "solo_p99_ms": p99(solo["seconds"]) * 1e3,
                "beside_p99_ms": p99(beside[0]["seconds"]) * 1e3,
                "prompts_meanwhile": len(beside[1]["seconds"]),
            }
            entry["ratio"] = entry["beside_p99_ms"] / entry["solo_p99_ms"]
            self.log("prefill round", json.dumps(entry))
            rounds.append(entry)
        median = sorted(rounds, key=lambda r: r["ratio"])[len(rounds) // 2]
        out = {
            **median,
            "rounds": rounds,
            "pooled_solo_p99_ms": p99(solo_all) * 1e3,
            "pooled_beside_p99_ms": p99(beside_all) * 1e3,
            "solo_median_ms": sorted(solo_all)[len(solo_all) // 2] * 1e3,
            "beside_median_ms": sorted(beside_all)[len(beside_all) // 2] * 1e3,
        }
        self.log("prefill", json.dumps(out))
        return out

    def fairness_scenario(self, endpoint: str) -> dict:
        (solo,) = self.together(endpoint, [self.decode_args()])
        solo_tps = solo["tokens"] / solo["wall_s"]
        out: dict[str, object] = {"solo_tok_s": solo_tps}
        for n in (2, 3):
            runs = self.together(endpoint, [self.decode_args()] * n)
            speeds = [r["tokens"] / r["wall_s"] for r in runs]
            out[str(n)] = {"tok_s": speeds, "worst_share_x_n": min(speeds) * n / solo_tps}
        self.log("fairness", json.dumps(out))
        return out

    def mixed_scenario(self, endpoint: str) -> dict:
        """Rounds of (decode alone, prompts alone, both at once); the median round's share."""
        reps, rounds = self.args.reps, []
        for _ in range(self.args.rounds):
            (decode,) = self.together(endpoint, [self.decode_args()])
            (prefill,) = self.together(endpoint, [self.prefill_args(reps)])
            both = self.together(endpoint, [self.decode_args(), self.prefill_args(reps)])
            # the clients' own walls: from the common start to each one's end
            mixed = max(r["wall_s"] for r in both)
            sequential = decode["wall_s"] + prefill["wall_s"]
            entry = {"sequential_s": sequential, "mixed_s": mixed, "share": sequential / mixed}
            self.log("mixed round", json.dumps(entry))
            rounds.append(entry)
        out = {**sorted(rounds, key=lambda r: r["share"])[len(rounds) // 2], "rounds": rounds}
        self.log("mixed", json.dumps(out))
        return out


def document(raw: dict, args: argparse.Namespace) -> dict:
    pre, fair, mixed = raw["prefill"], raw["fairness"], raw["mixed"]
    ratios = ", ".join(f"{r['ratio']:.2f}" for r in pre["rounds"])
    rows = [
        [
            f"decode p99 per token beside pp{args.pp} prompts back to back, ms "
            f"(median of {len(pre['rounds'])} rounds; each round's ratio: {ratios})",
            f"{pre['solo_p99_ms']:.1f}",
            f"{pre['beside_p99_ms']:.1f}",
            f"{pre['ratio']:.2f}×",
            "≤ 2×",
        ],
        [
            "decode median per token beside the prompts, all rounds, ms",
            f"{pre['solo_median_ms']:.1f}",
            f"{pre['beside_median_ms']:.1f}",
            f"{pre['beside_median_ms'] / pre['solo_median_ms']:.2f}×",
            "",
        ],
    ]
    for n in ("2", "3"):
        entry = fair[n]
        rows.append(
            [
                f"{n} clients decoding at once: slowest tok/s × {n} / solo",
                f"{fair['solo_tok_s']:.1f}",
                ", ".join(f"{v:.1f}" for v in entry["tok_s"]),
                f"{entry['worst_share_x_n']:.2f}",
                "≥ 0.8",
            ]
        )
    shares = ", ".join(f"{r['share']:.2f}" for r in mixed["rounds"])
    rows.append(
        [
            f"mixed load ({args.reps} × pp{args.pp} + tg{args.tg}): one at a time / together, s "
            f"(median of {len(mixed['rounds'])} rounds; each round's ratio: {shares})",
            f"{mixed['sequential_s']:.2f}",
            f"{mixed['mixed_s']:.2f}",
            f"{mixed['share']:.3f}",
            "≥ 0.95",
        ]
    )
    machine = {**report.host_cpu(), "cores": os.cpu_count()}
    return {
        "title": "Fair turns: clients sharing one device",
        "script": "bench/bench_fairness.py",
        "command": "python bench/bench_fairness.py",
        "machine": machine,
        "description": [
            "REAL v8 llama.cpp clients (separate processes, every layer and the output head on "
            "the server) against one `rpcnet serve --threads 2`, bench_engine's 336 M llama in "
            "q8_0; each scenario's clients load the model, warm up, then start together. A "
            "prompt's graph runs in slices of nodes between other clients' decode steps "
            f"(compute/turns.py); p99 is over each client's {args.tg} timed single-token decodes."
        ],
        "tables": [{"columns": ["measure", "alone", "shared", "ratio", "target"], "rows": rows}],
        "notes": [
            "The host's cores were shared with other jobs during the run (load average "
            f"{raw['load'][0]:.1f} at its start, {raw['load'][1]:.1f} at its end), besides each "
            "client's own threads: a p99 over 128 tokens moves by tens of ms between runs, so "
            "each round compares runs seconds apart and the median round is shown.",
            "Clients of one model decoding at once run their steps as one pass over the weights "
            "(compute/shared_decode.py), so each gets more than 1/N of the solo speed.",
            "Mixed load: the decoding client's steps go first and the prompts fill the time "
            "between them, so the two together take no longer than one after the other.",
        ],
        "raw": {"date": datetime.date.today().isoformat(), **raw},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tg", type=int, default=128)
    parser.add_argument("--pp", type=int, default=512)
    parser.add_argument("--reps", type=int, default=3, help="prompts of the mixed load")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of prefill and mixed")
    parser.add_argument("--quant", default="q8_0")
    parser.add_argument("--sections", default="prefill,fairness,mixed")
    parser.add_argument(
        "--model-cache", type=Path, default=Path.home() / ".cache" / "rpcnet" / "bench-models"
    )
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args(argv)
    model = ensure_bench_model(spec_for(MODELS["336m"], args.quant), args.model_cache)
    bench = Bench(args, model)
    raw: dict[str, Any] = {}
    load = os.getloadavg()[0]
    with engine_servers.running("ours", args.threads) as server:
        for section in args.sections.split(","):
            raw[section] = getattr(bench, f"{section}_scenario")(server.endpoint)
    raw["load"] = [load, os.getloadavg()[0]]
    if {"prefill", "fairness", "mixed"} <= set(raw):
        args.out.write_text(json.dumps(document(raw, args), indent=1) + "\n")
        if args.out == RESULT:
            report.write()
    else:
        print(json.dumps(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
