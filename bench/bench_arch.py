"""Architecture table: rpcnet against the reference rpc-server per model family and weight type.

Random-weight models generated here (f16, quantized by the REAL quantizer), every layer and the
output head on the server, 2 threads on each side, pp256 (one batch) and tg32 (single tokens),
flash attention off and on:

- ``llama``, ``qwen3``, ``gemma2``, ``phi3``: n_embd 1024, 24 layers, 16 heads / 4 KV heads,
  head_dim 64, n_ff 2816, vocab 32000 (the engine benchmark's 336 M llama and its siblings);
- ``moe32x4``, ``moe64x8``: bench_moe's qwen3moe models (32 experts with 4 used, 64 with 8);
- ``llama4096``: an f16 llama with 4096-wide layers (32 heads / 8 KV heads, n_ff 11008, 3 layers,
  1.6 GB), f16 only.

Two pairings, each server pair measured alternately:

- ``wheel``: the REAL v8 client (probe ``bench/probes/engine_speed.py``, Python bindings) against
  the v8 wheel's rpc-server and ``rpcnet serve`` with ``RPCNET_NO_AVX512=1`` (the wheel's CPU
  backend is an AVX2 build), the two probes taking turns as in bench_moe;
- ``native``: llama.cpp's own ``llama-bench`` against its ``rpc-server`` (protocol 7, built with
  GGML_NATIVE by bench/build_llama_server.sh into .llama-build/bin) and ``rpcnet serve --proto 7``
  in full; skipped, with a line saying so, while those binaries are missing.

Per row: decode and prefill ratios (rpcnet / reference), the peak RSS ratio (VmHWM of both
servers), and rpcnet's decode GB/s (weight bytes read per token × tok/s) with its share of the
host's memory read bandwidth, measured here. Writes bench/results/arch.json (bench/report.py's
table format) and regenerates docs/benchmarks.md.

    python bench/bench_arch.py [--models llama,qwen3,...] [--types q8_0,Q4_K_M,f16] [--fa 0,1]
                               [--pairings wheel,native] [--rounds 1] [--reps 3] [--quick]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import bench_moe
import engine_servers
import numpy as np
import report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv, serve  # noqa: E402
from support.models import BENCH_LLAMA, LLAMA_1024, ModelSpec  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "probes" / "engine_speed.py"
RESULT = Path(__file__).resolve().parent / "results" / "arch.json"
LLAMA_BIN = Path(os.environ.get("RPCNET_LLAMA_BUILD", REPO / ".llama-build")) / "bin"
TIMEOUT_S = 3600

_DENSE = dataclasses.replace(BENCH_LLAMA, n_layer=24, **LLAMA_1024)
MODELS: dict[str, ModelSpec] = {
    # the engine benchmark's 336 M llama: the same spec, the same cached files
    "llama": dataclasses.replace(_DENSE, name="bench336m-f16"),
    "qwen3": dataclasses.replace(_DENSE, name="archqwen3-f16", arch="qwen3", head_dim=64, seed=43),
    "gemma2": dataclasses.replace(_DENSE, name="archgemma2-f16", arch="gemma2", seed=44),
    "phi3": dataclasses.replace(_DENSE, name="archphi-f16", arch="phi3", seed=45),
    "moe32x4": bench_moe.MODELS["32x4"],
    "moe64x8": bench_moe.MODELS["64x8"],
    "llama4096": dataclasses.replace(
        BENCH_LLAMA,
        name="arch4096-f16",
        n_embd=4096,
        n_layer=3,
        n_head=32,
        n_head_kv=8,
        n_ff=11008,
        seed=46,
    ),
}
#: weight types per model (the 4096-wide model is the f16 case alone)
TYPES = {name: ("q8_0", "Q4_K_M", "f16") for name in MODELS} | {"llama4096": ("f16",)}
#: rpcnet / reference targets: decode, prefill, peak RSS (at most), decode share of read bandwidth
TARGET = {"decode": 1.0, "prefill": 1.2, "rss": 1.05, "bandwidth": 0.90}
PAIRINGS = ("wheel", "native")


def log(*parts: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *parts, flush=True)


def spec_of(name: str, quick: bool) -> ModelSpec:
    spec = MODELS[name]
    if quick:  # same family, 2 layers (1 for the wide one): for checking the harness
        n_layer = 1 if spec.n_embd > 1024 else 2
        spec = dataclasses.replace(
            spec, name=spec.name.replace("-f16", "-quick-f16"), n_layer=n_layer
        )
    return spec


# --------------------------------------------------------------------------- host and files


def bandwidth_line(raw: dict[str, dict]) -> str:
    """The read bandwidth the rows' shares rest on: one figure, or the range over the runs
    whose rows were merged (each row's share uses its own run's figure)."""
    figures = sorted({e["read_gbps"] for rows in raw.values() for e in rows.values()})
    how = "NumPy, 1 GiB, 2 threads"
    if len(figures) == 1:
        return f"memory read bandwidth {figures[0]:.1f} GB/s ({how})"
    return (
        f"memory read bandwidth {figures[0]:.1f}–{figures[-1]:.1f} GB/s ({how}, measured by each "
        "run; a row's share of it uses its own run's figure)"
    )


def read_bandwidth_gbps(size: int = 1 << 30, threads: int = 2, tries: int = 5) -> float:
    """The host's memory read bandwidth: a NumPy OR-reduction over `size` bytes, split in
    `threads` parts on a thread pool (NumPy releases the GIL), best of `tries`."""
    data = np.ones(size // 8, dtype=np.uint64)
    parts = np.array_split(data, threads)
    best = 0.0
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for _ in range(tries):
            t0 = time.perf_counter()
            list(pool.map(np.bitwise_or.reduce, parts))
            best = max(best, size / (time.perf_counter() - t0) / 1e9)
    return best


def bytes_per_token(path: Path, spec: ModelSpec) -> int:
    """Weight bytes one decoded token reads: every tensor but the token embeddings (whose rows
    are gathered, except where they are also the output head: gemma2 ties them), experts in the
    share used per token."""
    import gguf

    tensors = gguf.GGUFReader(str(path)).tensors
    names = {t.name for t in tensors}
    total = 0.0
    for t in tensors:
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        share = spec.n_expert_used / spec.n_expert if "_exps." in t.name else 1.0
        total += int(t.n_bytes) * share
    return int(total)


def model_params(spec: ModelSpec) -> tuple[float, float]:
    """(weights in the file, weights one token multiplies) of `spec`, counted from its shapes:
    for the run-time estimate, before the files exist."""
    head_dim = spec.head_dim or spec.n_embd // spec.n_head
    attn = spec.n_embd * head_dim * 2 * (spec.n_head + spec.n_head_kv)
    if spec.n_expert:
        ffn = 3 * spec.n_embd * spec.n_ff_exp
        total = spec.n_layer * (attn + ffn * spec.n_expert)
        active = spec.n_layer * (attn + ffn * spec.n_expert_used)
    else:
        total = active = spec.n_layer * (attn + 3 * spec.n_embd * spec.n_ff)
    head = spec.n_vocab * spec.n_embd
    return total + 2 * head, active + head


#: bytes per weight of the big matrices, for the estimate
_TYPE_BYTES = {"f16": 2.0, "q8_0": 34 / 32, "Q4_K_M": 0.61}


def estimate_s(args: argparse.Namespace, pairings: list[str]) -> float:
    """A rough run time: loads at 0.5 GB/s, prefill at 120 GFLOP/s (a quarter of it for MoE
    batches), decode at 15 GB/s plus 4 ms a token; constants from the engine and MoE tables."""
    total = 0.0
    for name in args.models.split(","):
        spec = spec_of(name, args.quick)
        weights, active = model_params(spec)
        for kind in (k for k in args.types.split(",") if k in TYPES[name]):
            size = weights * _TYPE_BYTES[kind]
            load = 1.0 + size / 0.5e9
            pp = args.pp * 2 * active / 120e9 * (4 if spec.n_expert else 1)
            tg = args.tg * (active * _TYPE_BYTES[kind] / 15e9 + 0.004)
            nfa = len(args.fa.split(","))
            for pairing in pairings:
                total += 6.0  # two fresh servers
                if pairing == "wheel":  # per round and FA: both probes start, load and run
                    one = 2.0 + 2 * load + 2 * (args.reps + 1) * pp + 2 * args.reps * (tg + 0.1)
                    total += args.rounds * nfa * one
                else:  # per round: one llama-bench run per server, every FA setting in each
                    total += args.rounds * 2 * (1.0 + load + nfa * (args.reps + 1) * (pp + tg))
    return total


# --------------------------------------------------------------------------- wheel pairing


def measure_wheel(path: Path, args: argparse.Namespace) -> dict:
    """The v8 client against the wheel's rpc-server and rpcnet (AVX2 kernels), both probes at
    once taking turns (bench_moe.in_turns). Fresh servers per model; their VmHWM read before
    stopping."""
    servers = [
        engine_servers.start("ref", args.threads),
        engine_servers.start("ours", args.threads, {"RPCNET_NO_AVX512": "1"}),
    ]
    entry: dict = {}
    try:
        for fa in args.fa.split(","):
            entry[f"fa{fa}"] = bench_moe.in_turns(path, servers, args, ("--fa", fa), f"  fa{fa} ")
        entry["rss_mib"] = {s.side: engine_servers.peak_rss_mib(s.proc.pid) for s in servers}
    finally:
        for server in servers:
            engine_servers.stop(server)
    return entry


# --------------------------------------------------------------------------- native pairing


def native_missing() -> list[str]:
    return [
        str(LLAMA_BIN / b) for b in ("llama-bench", "rpc-server") if not (LLAMA_BIN / b).is_file()
    ]


def start_native(args: argparse.Namespace, ours: bool) -> engine_servers.Server:
    """llama.cpp's protocol-7 rpc-server (side "ref") or `rpcnet serve --proto 7` (side "ours",
    every kernel it has: the native build is GGML_NATIVE too)."""
    port = refenv.free_port()
    if ours:
        env_saved = os.environ.pop("RPCNET_NO_AVX512", None)
        try:
            proc = serve.start_rpcnet(port, "--threads", str(args.threads), "--proto", "7")
        finally:
            if env_saved is not None:
                os.environ["RPCNET_NO_AVX512"] = env_saved
        return engine_servers.Server("ours", proc, port)
    argv = [str(LLAMA_BIN / "rpc-server"), "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(
        [*argv, "-t", str(args.threads)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    # through /proc, not a connection: the single-client server sees only the benchmark's
    while not refenv._is_listening(proc.pid, "127.0.0.1", port):
        if proc.poll() is not None or time.monotonic() > deadline:
            refenv.stop_process(proc)
            raise RuntimeError(f"native rpc-server did not listen on {port} ({proc.returncode})")
        time.sleep(0.05)
    return engine_servers.Server("ref", proc, port)


def llama_bench(path: Path, server: engine_servers.Server, args: argparse.Namespace) -> dict:
    """One llama-bench run (every FA setting, pp and tg, `--reps` repetitions after its own
    warm-up): {"fa0": {"pp": median tok/s, "tg": ...}, ...}."""
    argv = [str(LLAMA_BIN / "llama-bench"), "-m", str(path), "--rpc", server.endpoint]
    argv += ["-ngl", "99", "-t", str(args.threads), "-p", str(args.pp), "-n", str(args.tg)]
    argv += ["-fa", args.fa, "-r", str(args.reps), "-o", "json"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL
    )
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench exited with {done.returncode}: {done.stderr[-2000:]}")
    out: dict[str, dict[str, float]] = {}
    for test in json.loads(done.stdout):
        fa = f"fa{int(test['flash_attn'])}"
        metric = "pp" if test["n_gen"] == 0 else "tg"
        out.setdefault(fa, {})[metric] = statistics.median(test["samples_ts"])
    return out


def measure_native(path: Path, args: argparse.Namespace) -> dict:
    """llama-bench against the native rpc-server and rpcnet, one run each in turn, who goes
    first alternating by round (ABBA...: a steady drift of the host's speed cancels)."""
    servers = [start_native(args, ours=False), start_native(args, ours=True)]
    entry: dict = {
        f"fa{fa}": {s.side: {"pp": [], "tg": []} for s in servers} for fa in args.fa.split(",")
    }
    try:
        for rnd in range(args.rounds):
            for server in servers if rnd % 2 == 0 else servers[::-1]:
                result = llama_bench(path, server, args)
                log(f"  round {rnd + 1}/{args.rounds}", server.side, json.dumps(result))
                for fa, speeds in result.items():
                    for metric, value in speeds.items():
                        entry[fa][server.side][metric].append(value)
        entry["rss_mib"] = {s.side: engine_servers.peak_rss_mib(s.proc.pid) for s in servers}
    finally:
        for server in servers:
            engine_servers.stop(server)
    return entry


# --------------------------------------------------------------------------- table


def ratio_cell(ours: float, ref: float, digits: int = 1) -> str:
    return f"{ours / ref:.2f}× ({ours:.{digits}f} / {ref:.{digits}f})"


def table(raw: dict, pairing: str, pp: int, tg: int) -> dict:
    captions = {
        "wheel": "Wheel pairing: the REAL v8 client (Python bindings) against the v8 wheel's "
        "rpc-server (AVX2 build) and `rpcnet serve` with `RPCNET_NO_AVX512=1`.",
        "native": "Native pairing: llama.cpp's `llama-bench` (b11434) against its own "
        "`rpc-server` (GGML_NATIVE build) and `rpcnet serve --proto 7`, every kernel on.",
    }
    columns = [
        "model",
        "type",
        "FA",
        f"decode tg{tg}, rpcnet / ref (≥ {TARGET['decode']:.1f}×)",
        f"prefill pp{pp} (≥ {TARGET['prefill']:.1f}×)",
        f"peak RSS, MiB (≤ {TARGET['rss']:.2f}×)",
        f"rpcnet decode GB/s, share of read bandwidth (≥ {TARGET['bandwidth']:.0%})",
        "targets missed",
    ]
    rows = []
    for key, entry in raw.items():
        model, kind = key.split(" ", 1)
        rss = entry["rss_mib"]
        rss_ratio = rss["ours"] / rss["ref"]
        for fa in sorted(k for k in entry if k.startswith("fa")):
            med = {
                s: {m: statistics.median(v) for m, v in runs.items()}
                for s, runs in entry[fa].items()
            }
            decode = med["ours"]["tg"] / med["ref"]["tg"]
            prefill = med["ours"]["pp"] / med["ref"]["pp"]
            gbps = entry["bytes_per_token"] * med["ours"]["tg"] / 1e9
            share = gbps / entry["read_gbps"]
            missed = [
                name
                for name, bad in (
                    ("decode", decode < TARGET["decode"]),
                    ("prefill", prefill < TARGET["prefill"]),
                    ("RSS", rss_ratio > TARGET["rss"]),
                    ("GB/s", share < TARGET["bandwidth"]),
                )
                if bad
            ]
            rows.append(
                [
                    model,
                    kind,
                    "on" if fa == "fa1" else "off",
                    ratio_cell(med["ours"]["tg"], med["ref"]["tg"]),
                    ratio_cell(med["ours"]["pp"], med["ref"]["pp"]),
                    ratio_cell(rss["ours"], rss["ref"], 0),
                    f"{gbps:.1f} ({share:.0%})",
                    ", ".join(missed) or "—",
                ]
            )
    return {"caption": captions[pairing], "columns": columns, "rows": rows}


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def description(args: argparse.Namespace, estimate: float) -> list[str]:
    return [
        "Random-weight models written by the benchmark in f16 and quantized by the REAL "
        "quantizer (q8_0, Q4_K_M): `llama`, `qwen3`, `gemma2` and `phi3` with n_embd 1024, 24 "
        "layers, 16 heads / 4 KV heads, head_dim 64, n_ff 2816, vocab 32000 (gemma2: soft-capped "
        "logits, a tied output head, a 5-token sliding window on alternate layers; phi3: fused "
        "QKV and gate|up matrices; qwen3: q/k norms, NEOX RoPE); `moe32x4` and `moe64x8` are "
        "bench_moe's qwen3moe models (n_embd 1024, 12 layers, expert ff 512; 32 experts with 4 "
        "used, 64 with 8); `llama4096` is an f16 llama with 4096-wide layers (32 heads / 8 KV "
        "heads, n_ff 11008, 3 layers, 1.6 GB), f16 only.",
        f"Every layer and the output head on the server, `--threads {args.threads}` on each "
        f"side; pp{args.pp} is one batch, tg{args.tg} single tokens (after an 8-token prompt in "
        "the wheel pairing, after none in llama-bench), flash attention off and on. Wheel "
        "pairing: the REAL v8 client (bench/probes/engine_speed.py) against the v8 wheel's "
        "rpc-server and rpcnet with `RPCNET_NO_AVX512=1` (the wheel's CPU backend is an AVX2 "
        "build: like with like); both probes run at once and take turns, every timed "
        "repetition of one side between two of the other's. Native pairing: llama.cpp's "
        "`llama-bench` (b11434, protocol 7) against its own `rpc-server`, both built with "
        "GGML_NATIVE, and `rpcnet serve --proto 7` with every kernel; one llama-bench run per "
        "server in turn, who goes first alternating by round. Medians of "
        f"{plural(args.rounds, 'round')} of {plural(args.reps, 'repetition')}; fresh servers "
        "per model and type.",
        "Peak RSS: VmHWM of each server process over its whole life (one model, every "
        "measurement). Decode GB/s: the weight bytes one token reads (every tensor of the file "
        "but the token embeddings, which are the output head where gemma2 ties them; experts in "
        "the share used per token) × rpcnet's tg tok/s, against the host's memory read "
        "bandwidth measured by the benchmark (a NumPy OR-reduction over 1 GiB split across 2 "
        "threads, best of 5). The default table (both pairings, every model and type, FA off "
        f"and on) is sized to run within an hour on 2 cores (estimate {estimate / 60:.0f} min, "
        "model files generated once and cached): one round of 3 repetitions per pair, so a "
        "row's ratio rests on few samples; `--rounds 3` narrows it at three times the cost.",
    ]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--types", default="q8_0,Q4_K_M,f16")
    p.add_argument("--fa", default="0,1", help="flash attention settings, 0 and/or 1")
    p.add_argument("--pairings", default=",".join(PAIRINGS))
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--pp", type=int, default=256)
    p.add_argument("--tg", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2-layer models, pp32 tg8, 1 rep")
    p.add_argument(
        "--model-cache", type=Path, default=Path.home() / ".cache" / "rpcnet" / "bench-models"
    )
    p.add_argument("--json", type=Path, default=RESULT)
    p.add_argument("--no-doc", action="store_true")
    p.add_argument("--merge", action="store_true", help="keep --json's other rows")
    args = p.parse_args(argv)
    if args.quick:
        args.pp, args.tg, args.rounds, args.reps = 32, 8, 1, 1
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown or not set(args.fa.split(",")) <= {"0", "1"}:
        p.error(f"unknown models {unknown} (known: {', '.join(MODELS)}) or --fa not 0/1")
    pairings = [x for x in args.pairings.split(",") if x]
    notes = []
    if "native" in pairings and native_missing():
        where = LLAMA_BIN.relative_to(REPO) if LLAMA_BIN.is_relative_to(REPO) else LLAMA_BIN
        missing = ", ".join(f"{where}/{Path(m).name}" for m in native_missing())
        line = f"Native pairing skipped: {missing} missing (bench/build_llama_server.sh)."
        log(line)
        notes.append(line)
        pairings.remove("native")
    estimate = estimate_s(args, pairings)
    log(f"estimated run time {estimate / 60:.0f} min (±50%; model files not yet cached add more)")
    default = estimate_s(p.parse_args([]), list(PAIRINGS))
    load_before = os.getloadavg()[1]
    read_gbps = read_bandwidth_gbps()
    log(f"memory read bandwidth {read_gbps:.1f} GB/s (NumPy, 1 GiB, 2 threads, best of 5)")
    raw: dict[str, dict] = {pairing: {} for pairing in PAIRINGS}
    for name in args.models.split(","):
        spec = spec_of(name, args.quick)
        for kind in args.types.split(","):
            if kind not in TYPES[name]:
                continue
            path = bench_moe.model_path(spec, kind, args.model_cache)
            per_token = bytes_per_token(path, spec)
            log(f"{name} {kind}: {path.name}, {per_token / 1e6:.0f} MB read per token")
            for pairing in pairings:
                measure = measure_wheel if pairing == "wheel" else measure_native
                entry = measure(path, args)
                entry.update(bytes_per_token=per_token, read_gbps=read_gbps)
                raw[pairing][f"{name} {kind}"] = entry
    command = ("python bench/bench_arch.py " + " ".join(argv)).strip()
    if args.merge and args.json.is_file():
        # rows measured by an earlier run and not now are kept (from its raw samples), and
        # the commands of every run that wrote rows are listed in order
        earlier = json.loads(args.json.read_text())
        old = earlier["raw"]
        raw = {pairing: {**old.get(pairing, {}), **raw[pairing]} for pairing in PAIRINGS}
        command = f"{earlier['command']}`, then `{command}"
    tables = [
        table(raw[pairing], pairing, args.pp, args.tg) for pairing in PAIRINGS if raw[pairing]
    ]
    for t in tables:
        print("\n".join(report.table_lines(t)))
    machine = {
        **report.host_cpu(),
        "cores": os.cpu_count(),
        "memory": bandwidth_line(raw),
    }
    doc = {
        "title": "Architecture table against the reference rpc-server",
        "script": "bench/bench_arch.py",
        "command": command,
        "machine": machine,
        "description": description(args, default),
        "tables": tables,
        "notes": notes + [report.load_note(load_before)],
        "raw": raw,
    }
    report.save(args.json, doc, render_doc=not args.no_doc)
    log("wrote", args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
