"""Soak for the record: 4 real clients load and decode for 10 minutes with random kills.

Usage: PYTHONPATH=python:tests python bench/soak.py [--minutes 10] [--out TABLE.md]
(--out: the table of docs/soak.md)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.soak import soak, workdir_with_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tmp, model = workdir_with_model("rpcnet-soak-")
    r = soak(model, duration=args.minutes * 60, clients=args.clients, workdir=tmp)
    report.print_table(
        [
            f"| duration | {args.minutes} min, {args.clients} clients |",
            "|---|---|",
            f"| client runs | {r.runs} ({r.completed} completed, {r.killed} killed at random) |",
            f"| failed runs | {len(r.failed)} |",
            *r.table_rows(),
        ],
        args.out,
    )
    return 0 if r.recovered and not r.failed else 1


if __name__ == "__main__":
    sys.exit(main())
