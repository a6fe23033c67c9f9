"""Multi-host benchmark: tensor split (``--split-mode tensor --tensor-split 1,1``, flash attention
on) of the REAL llama.cpp v8 client over two rpcnet servers vs over two reference rpc-servers,
same model, same run, interleaved rounds; plus the allreduce traffic between the two servers.

* decode (tg) and prefill (pp) tokens/s from the ``speed`` probe, medians over the rounds, and
  the ratio rpcnet / reference;
* allreduce bytes per decoded token, measured (not computed): two extra runs over the rpcnet pair
  that differ only in the number of decoded tokens; the difference of the rank-0 server's peer
  link totals (logged when the link closes) divided by the difference in tokens. The reference
  pair moves the same bytes (same wire format, checked bit-exact by tests/test_multihost.py).

Each server gets ``--threads`` compute threads (default 1: two servers on a 2-core machine).
With ``--fallback`` the same is also measured with ``GGML_RPC_NO_COMM=1`` (the client reduces
the partial sums itself, through GET_TENSOR / SET_TENSOR).

Usage: PYTHONPATH=python:tests python bench/bench_multihost.py [--rounds 3] [--small]
       [--pp 64] [--tg 32] [--fallback] [--out docs/bench-multihost.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import report

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import refenv  # noqa: E402
from support.models import BENCH_LLAMA, LLAMA_1024, ensure_model  # noqa: E402

MODEL = dataclasses.replace(
    BENCH_LLAMA, name="bench-tp-llama-f16", n_vocab=8192, n_layer=8, n_ctx_train=2048, **LLAMA_1024
)
SMALL = dataclasses.replace(
    MODEL, name="bench-tp-small-f16", n_vocab=2048, n_embd=256, n_layer=4, n_ff=768, n_head=4,
    n_head_kv=2,
)  # fmt: skip
LINK_CLOSED = re.compile(r"rank 0 with \S+ closed: (\d+) allreduces, (\d+) bytes sent")


def port_pair() -> int:
    """A port P with P + 1000 (the client's comm port for rank 0) also free."""
    while True:
        port = refenv.free_port()
        if port + 1000 > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1000))
            except OSError:
                continue
        return port


def start_rpcnet(port: int, threads: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    argv = [sys.executable, "-m", "rpcnet.cli", "serve", "--port", str(port)]
    argv += ["--threads", str(threads), "-v"]  # -v: INFO, which has the peer link totals
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if refenv._is_listening(proc.pid, "127.0.0.1", port):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("rpcnet did not start")


def start_pair(kind: str, threads: int, logs: Path, stack: ExitStack) -> tuple[str, Path]:
    """Two servers of one kind; returns the endpoint list and the rank-0 server's log."""
    ports = [port_pair(), refenv.free_port()]
    for i, port in enumerate(ports):
        log = logs / f"{kind}-{i}.log"
        if kind == "rpcnet":
            proc = start_rpcnet(port, threads, log)
            stack.callback(lambda p=proc: (p.terminate(), p.wait(30)))
        else:
            proc = refenv.start_reference_server("v8", port=port, threads=threads, log_path=log)
            stack.callback(refenv.stop_process, proc)
    return ",".join(f"127.0.0.1:{p}" for p in ports), logs / f"{kind}-0.log"


def measure(model: Path, endpoints: str, pp: str, tg: int, no_comm: bool) -> dict:
    args = ["--pp", pp, "--tg", tg, "--threads", "1", "--flash-attn", "1"]
    args += ["--split-mode", "tensor", "--tensor-split", "1,1"]
    env = {"GGML_RPC_NO_COMM": "1"} if no_comm else None
    return refenv.run_probe(
        "v8", "speed", str(model), endpoints, *args, timeout=3600, extra_env=env
    )


def link_totals(log: Path, timeout: float = 10.0) -> tuple[int, int]:
    """(allreduces, bytes sent) of the last peer link the rank-0 rpcnet server closed."""
    deadline = time.monotonic() + timeout
    while True:
        found = LINK_CLOSED.findall(log.read_text(errors="replace"))
        if found or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not found:
        raise RuntimeError(f"no peer link totals in {log}")
    count, sent = found[-1]
    return int(count), int(sent)


def traffic_per_token(model: Path, endpoints: str, log: Path, tg: int) -> tuple[float, float]:
    totals = []
    for n in (tg, 2 * tg):
        before = len(LINK_CLOSED.findall(log.read_text(errors="replace")))
        measure(model, endpoints, "8", n, False)
        deadline = time.monotonic() + 10
        while len(LINK_CLOSED.findall(log.read_text(errors="replace"))) == before:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the peer link did not close ({log})")
            time.sleep(0.1)
        totals.append(link_totals(log))
    (c1, b1), (c2, b2) = totals
    return (c2 - c1) / tg, (b2 - b1) / tg


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pp", default="64")
    parser.add_argument("--tg", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="compute threads per server")
    parser.add_argument("--small", action="store_true", help="a tiny model, for a quick check")
    parser.add_argument("--fallback", action="store_true", help="also GGML_RPC_NO_COMM=1")
    parser.add_argument(
        "--models", type=Path, default=Path(tempfile.gettempdir()) / "rpcnet-bench-models"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    spec = SMALL if args.small else MODEL
    model = ensure_model(spec, args.models)
    modes = [False, True] if args.fallback else [False]
    results: dict[tuple[str, bool], dict[str, list[float]]] = {}
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        pairs = {kind: start_pair(kind, args.threads, logs, stack) for kind in ("ref", "rpcnet")}
        for _ in range(args.rounds):
            for no_comm in modes:
                for kind in ("ref", "rpcnet"):
                    r = measure(model, pairs[kind][0], args.pp, args.tg, no_comm)
                    row = results.setdefault((kind, no_comm), {})
                    for n, v in r["pp"].items():
                        row.setdefault(f"pp{n}", []).append(v)
                    row.setdefault(f"tg{args.tg}", []).append(r["tg"])
                    print(kind, "no-comm" if no_comm else "comm", json.dumps(r), flush=True)
        per_token, bytes_per_token = traffic_per_token(
            model, pairs["rpcnet"][0], pairs["rpcnet"][1], args.tg
        )
    expected = 2 * spec.n_layer * spec.n_embd * 4  # attention + FFN partial sums, f32 per token
    lines = [
        f"model: random llama f16, n_embd {spec.n_embd}, {spec.n_layer} layers, n_ff {spec.n_ff}, "
        f"vocab {spec.n_vocab}; tensor split 1,1 over two servers on one host (loopback), "
        f"flash attention on; {args.threads} thread(s) per server; {args.rounds} interleaved "
        "rounds, medians",
        "",
        "| reduction | metric | reference pair tok/s | rpcnet pair tok/s | rpcnet / reference |",
        "|---|---|---|---|---|",
    ]
    for no_comm in modes:
        label = "client (GGML_RPC_NO_COMM=1)" if no_comm else "server allreduce"
        for metric in results[("ref", no_comm)]:
            r = statistics.median(results[("ref", no_comm)][metric])
            o = statistics.median(results[("rpcnet", no_comm)][metric])
            lines.append(f"| {label} | {metric} | {r:.2f} | {o:.2f} | {o / r:.2f}× |")
    lines += [
        "",
        f"allreduce traffic per decoded token (measured on the rpcnet pair): "
        f"{per_token:.1f} allreduces, {bytes_per_token:.0f} bytes each direction "
        f"(expected 2 × {spec.n_layer} layers × {spec.n_embd} × 4 B = {expected} B: f32, "
        "below the bf16 threshold of 32768 elements)",
    ]
    report.print_table(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
