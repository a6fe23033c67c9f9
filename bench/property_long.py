"""The property tests with fresh random draws and many more examples than CI runs.

CI runs them derandomized (the ``ci`` hypothesis profile: the same examples every run). This
script runs them with the ``long`` profile: a new random draw each time, every test's example
count multiplied by ``--scale``. A failure prints its falsifying example (and a reproduction
blob); add it to that test as an explicit ``@example(...)`` so CI checks it from then on.

Usage: python bench/property_long.py [--scale 20] [--seed N] [MODULE ...]
(modules default to every test module that uses hypothesis; the ops modules need tools/refenv.sh)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"


def property_modules() -> list[Path]:
    return sorted(p for p in TESTS.glob("test_*.py") if "from hypothesis import" in p.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", type=Path, help="test modules (default: all)")
    parser.add_argument("--scale", type=int, default=20, help="example count multiplier")
    parser.add_argument("--seed", type=int, help="hypothesis seed (default: random)")
    args = parser.parse_args()

    modules = args.modules or property_modules()
    env = dict(os.environ, HYPOTHESIS_PROFILE="long", RPCNET_HYPOTHESIS_SCALE=str(args.scale))
    env.pop("CI", None)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=0"]
    if args.seed is not None:
        command.append(f"--hypothesis-seed={args.seed}")
    command += [str(m) for m in modules]
    print("+", " ".join(command), f"(scale {args.scale})", flush=True)
    return subprocess.run(command, cwd=REPO, env=env, check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
