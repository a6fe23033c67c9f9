"""Start `rpcnet serve` as a real process on 127.0.0.1 and wait until it accepts connections."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rpcnet serve exited with {proc.returncode} during startup")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise TimeoutError(f"rpcnet serve not listening on port {port}")


def start_rpcnet(
    port: int,
    *args: str,
    python_args: tuple[str, ...] = (),
    capture: bool = False,
    preexec: Callable[[], None] | None = None,
) -> subprocess.Popen:
    """`python -m rpcnet.cli serve --port PORT ARGS...`; output piped (text) when `capture`."""
    argv = [sys.executable, *python_args, "-m", "rpcnet.cli", "serve", "--port", str(port), *args]
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    proc = subprocess.Popen(
        argv,
        stdout=out,
        stderr=subprocess.STDOUT if capture else subprocess.DEVNULL,
        text=True,
        preexec_fn=preexec,
    )
    wait_listening(port, proc)
    return proc
