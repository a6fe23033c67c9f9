"""The `rpcnet` command line run as a user runs it: a separate Python process."""

from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`python -m rpcnet.cli ARGS`, its output captured as text (not checked: callers do)."""
    return subprocess.run(
        [sys.executable, "-m", "rpcnet.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
