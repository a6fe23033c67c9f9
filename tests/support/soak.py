"""Soak: real llama.cpp clients load and decode against one `rpcnet serve` process, repeatedly,
with random SIGKILLs, for a fixed time. Afterwards the server's reported free memory and its RSS
must return to their baseline, and the server process must never have restarted.
"""

from __future__ import annotations

import random
import struct
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from support import refenv
from support.models import ZOO, ensure_model
from support.raw import RawConn
from support.serve import start_rpcnet


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def device_memory(port: int) -> tuple[int, int]:
    conn = RawConn(port)
    try:
        return struct.unpack("<QQ", conn.call(11, struct.pack("<I", 0), 16))
    finally:
        conn.close()


@dataclass
class ServerHealth:
    """What a run leaves in the server: its RSS before, at the peak of and after the run, its
    free and total device memory once the clients have left, and whether it stayed up."""

    baseline_rss: int = 0
    peak_rss: int = 0
    final_rss: int = 0
    free_total: tuple[int, int] = (0, 0)
    server_alive: bool = True

    def settle(self, server: subprocess.Popen, port: int, tries: int, pause: float) -> None:
        """After the last client: wait (``tries`` x 50 ms at most) for every byte of device
        memory to be free, record it, then RSS after ``pause`` seconds and whether the server
        is up."""
        for _ in range(tries):
            free, total = device_memory(port)
            if free == total:
                break
            time.sleep(0.05)
        self.free_total = device_memory(port)
        time.sleep(pause)
        self.final_rss = rss_bytes(server.pid)
        self.server_alive = server.poll() is None

    @property
    def recovered(self) -> bool:
        """The server stayed up and holds no device memory any more."""
        free, total = self.free_total
        return self.server_alive and free == total

    def table_rows(self) -> list[str]:
        """The Markdown rows of bench/soak.py's and bench/bench_attack_load.py's tables."""
        free, total = self.free_total
        state = "baseline" if free == total else "LEAK"
        rss = f"{self.baseline_rss >> 20} / {self.peak_rss >> 20} / {self.final_rss >> 20}"
        return [
            f"| server restarts | {0 if self.server_alive else 'server died'} |",
            f"| reported free memory after | {free} of {total} ({state}) |",
            f"| RSS baseline / peak / final | {rss} MiB |",
        ]


@dataclass
class SoakResult(ServerHealth):
    runs: int = 0
    completed: int = 0
    killed: int = 0
    failed: list[str] = field(default_factory=list)


def workdir_with_model(prefix: str) -> tuple[Path, Path]:
    """A fresh work directory and, in it, the model of the soak and load-under-attack runs."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    return workdir, ensure_model(ZOO["llama-gqa-f32"], workdir / "zoo")


def client_argv(model: Path, endpoint: str, out: Path, tokens: str) -> tuple[list[str], dict]:
    argv, env = refenv.python_command("v8")
    probe = refenv.probe_path("generate")
    return [
        *argv,
        str(probe),
        "--model",
        str(model),
        "--endpoint",
        endpoint,
        "--tokens",
        tokens,
        "--out",
        str(out),
        "--prefill",
        "4",
    ], env


def soak(
    model: Path,
    duration: float,
    clients: int = 4,
    kill_rate: float = 0.3,
    seed: int = 0,
    workdir: Path | None = None,
) -> SoakResult:
    rng = random.Random(seed)
    workdir = workdir or Path("/tmp")
    port = refenv.free_port()
    server = start_rpcnet(port, "--mem", "4G")
    result = SoakResult()
    lock = threading.Lock()
    try:
        endpoint = f"127.0.0.1:{port}"
        tokens = "1,5,9,13,17,21,25,29"
        # Warm-up: one full run, so imports, kernel tables and allocator arenas are in place.
        argv, env = client_argv(model, endpoint, workdir / "warm", tokens)
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=300)
        time.sleep(0.5)
        result.baseline_rss = rss_bytes(server.pid)
        deadline = time.monotonic() + duration

        def worker(idx: int) -> None:
            while time.monotonic() < deadline:
                argv, env = client_argv(model, endpoint, workdir / f"c{idx}", tokens)
                proc = subprocess.Popen(
                    argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
                )
                kill_at = rng.uniform(0.05, 1.5) if rng.random() < kill_rate else None
                try:
                    if kill_at is not None:
                        try:
                            proc.wait(kill_at)
                        except subprocess.TimeoutExpired:
                            proc.kill()
                            proc.wait()
                            with lock:
                                result.runs += 1
                                result.killed += 1
                            continue
                    rc = proc.wait(300)
                    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                    with lock:
                        result.runs += 1
                        if rc == 0:
                            result.completed += 1
                        else:
                            result.failed.append(f"rc={rc}: {err[-300:]}")
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                    with lock:
                        result.peak_rss = max(result.peak_rss, rss_bytes(server.pid))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # Give the server a moment to notice the last disconnects.
        result.settle(server, port, tries=100, pause=0.0)
        return result
    finally:
        refenv.stop_process(server, timeout=30)
