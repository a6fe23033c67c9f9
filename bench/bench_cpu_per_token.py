"""Server CPU time per token, rpcnet vs the REAL reference rpc-server.

Wall-clock ratios swing when other processes share the host (the reference's spinning threads
suffer most); CPU seconds do not. Both servers run with one thread (`-t 1` / `--threads 1`), the
REAL v8 client (probe ``bench/probes/engine_speed.py``) loads the model and runs a prompt batch
or single-token decodes; the server's utime + stime from /proc, minus a load-only run, divided
by the tokens, gives ms of CPU per token.

Usage: PYTHONPATH=python python bench/bench_cpu_per_token.py MODEL.gguf [--pp 64] [--tg 16]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv, serve  # noqa: E402

PROBE = Path(__file__).resolve().parent / "probes" / "engine_speed.py"
WARM_PROMPT = 8  # the probe's warm-up prompt before the timed decodes (+1 warm-up token)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(side: str, model: Path, pp: int, tg: int) -> tuple[float, float]:
    """(ms per prompt token, ms per decoded token) of server CPU."""
    port = refenv.free_port()
    if side == "ref":
        proc = refenv.start_reference_server("v8", port=port, threads=1)
    else:
        proc = serve.start_rpcnet(port, "--threads", "1")
    try:
        endpoint = f"127.0.0.1:{port}"

        def run(*args: str) -> float:
            before = cpu_seconds(proc.pid)
            refenv.run_probe("v8", PROBE, model, endpoint, *args, "--threads", "1", timeout=3600)
            return cpu_seconds(proc.pid) - before

        load = min(run("--no-plain") for _ in range(2))
        prompt = run("--pp", str(pp), "--tg", "0") - load  # a warm-up batch and a timed one
        decode = run("--pp", "", "--tg", str(tg)) - load
        return prompt / (2 * pp) * 1e3, decode / (tg + WARM_PROMPT + 1) * 1e3
    finally:
        refenv.stop_process(proc, timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("--pp", type=int, default=64)
    ap.add_argument("--tg", type=int, default=16)
    args = ap.parse_args()
    res = {side: measure(side, args.model, args.pp, args.tg) for side in ("ref", "ours")}
    print(f"{'':>6} {'pp' + str(args.pp) + ' ms/token':>16} {'tg ms/token':>12}")
    for side, (p, t) in res.items():
        print(f"{side:>6} {p:>16.2f} {t:>12.2f}")
    (rp, rt), (op, ot) = res["ref"], res["ours"]
    print(f"{'ratio':>6} {rp / op:>15.2f}x {rt / ot:>11.2f}x  (reference / rpcnet: > 1 is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
