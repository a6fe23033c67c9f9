"""Load under attack, for the record: 16 real llama.cpp clients decode against one rpcnet server
while 4 attackers send memory-amplification frames in a loop, for 2 minutes (loopback only).

Usage: PYTHONPATH=python:tests python bench/bench_attack_load.py [--minutes 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.attack_load import attack_load  # noqa: E402
from support.soak import workdir_with_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--attackers", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tmp, model = workdir_with_model("rpcnet-attack-")
    r = attack_load(
        model, args.minutes * 60, clients=args.clients, attackers=args.attackers, workdir=tmp
    )
    report.print_table(
        [
            f"| run | {r.duration:.0f} s, {args.clients} clients, {args.attackers} attackers |",
            "|---|---|",
            f"| honest client runs | {r.honest_runs} ({r.honest_ok} with correct logits) |",
            f"| failed honest runs | {len(r.failures)} |",
            f"| amplification frames | {r.attacks} ({r.attacks_closed} connections closed) |",
            f"| refusals logged | {r.refusals_logged} |",
            *r.table_rows(),
        ],
        args.out,
    )
    for failure in r.failures[:5]:
        print("failure:", failure)
    return 0 if r.recovered and not r.failures and r.attacks == r.attacks_closed else 1


if __name__ == "__main__":
    sys.exit(main())
