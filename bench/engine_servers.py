"""The two servers under test, started fresh, and their memory read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support import refenv, serve  # noqa: E402

SIDES = ("ref", "ours")
SETTLE_S = 5.0  # how long RSS may take to come down after a client leaves


@dataclass
class Server:
    side: str
    proc: subprocess.Popen
    port: int

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


def start(side: str, threads: int, env: dict[str, str] | None = None) -> Server:
    port = refenv.free_port()
    if side == "ref":
        proc = refenv.start_reference_server("v8", port=port, threads=threads, extra_env=env)
    else:
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            proc = serve.start_rpcnet(port, "--threads", str(threads))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return Server(side, proc, port)


def stop(server: Server) -> None:
    refenv.stop_process(server.proc, timeout=60)


@contextmanager
def running(side: str, threads: int, env: dict[str, str] | None = None) -> Iterator[Server]:
    server = start(side, threads, env)
    try:
        yield server
    finally:
        stop(server)


def status_kib(pid: int, key: str) -> int:
    """A ``Vm*`` line of /proc/PID/status, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def rss_mib(pid: int) -> float:
    return status_kib(pid, "VmRSS") / 1024


def peak_rss_mib(pid: int) -> float:
    return status_kib(pid, "VmHWM") / 1024


def settled_rss_mib(pid: int, baseline: float) -> float:
    """RSS once it stops falling (or is back at ``baseline``), waiting at most SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    time.sleep(1.0)  # the server notices the closed connection and frees its buffers
    last = rss_mib(pid)
    while time.monotonic() < deadline and last > baseline:
        time.sleep(0.5)
        now = rss_mib(pid)
        if now == last:
            break
        last = now
    return last
