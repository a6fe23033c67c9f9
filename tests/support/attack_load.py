"""Load under attack: real llama.cpp clients decode against one `rpcnet serve` process while
attackers send memory-amplification frames in a loop (loopback only, bounded by a deadline).

Honest clients must finish with the logits of llama.cpp's own CPU backend, every attacker
connection must be closed by the server, the server's RSS must stay bounded throughout, and its
memory must return to the baseline once everyone has left.
"""

from __future__ import annotations

import json
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from rpcnet import _native

from support import refenv
from support.raw import RawConn
from support.serve import start_rpcnet
from support.soak import ServerHealth, client_argv, rss_bytes

TOKENS = "1,5,9,13,17,21,25,29,33,37,41,45"
REL_TOL = 2e-3  # f32 model: the e2e suite's tolerance class
MUL_MAT, F32, ALLOC, BASE, GRAPH_COMPUTE, GET_DEVICE_MEMORY = 29, 0, 0, 3, 10, 11


@dataclass
class AttackLoadResult(ServerHealth):
    honest_runs: int = 0
    honest_ok: int = 0
    failures: list[str] = field(default_factory=list)
    attacks: int = 0
    attacks_closed: int = 0
    refusals_logged: int = 0
    duration: float = 0.0


def amplification_frame(handle: int, base: int, batch: int = 1 << 20) -> bytes:
    """The issue's attack: 1024x1024 f32 weights broadcast over a zero-stride activation batch,
    into a zero-stride output. Repeating the weights would take batch x 4 MiB."""
    a = _native.RpcTensor(id=1, type=F32, buffer=handle, data=base, ne=(1024, 1024, 1, 1))
    # the activations and the output: `batch` rows of 1024, all on the same bytes (stride 0)
    zero_stride = {"type": F32, "buffer": handle, "ne": (1024, 1, batch, 1), "nb": (4, 4096, 0, 0)}
    b = _native.RpcTensor(id=2, data=base + (4 << 20), **zero_stride)
    out = _native.RpcTensor(
        id=3, data=base + (8 << 20), op=MUL_MAT, src=(1, 2), flags=16, **zero_stride
    )
    tensors = [a, b, out]
    return (
        struct.pack("<IQI", 0, 0, 1)
        + struct.pack("<Q", 3)
        + struct.pack("<I", len(tensors))
        + b"".join(t.to_bytes() for t in tensors)
    )


def attack_once(port: int) -> bool:
    """One attacker connection: 64 MiB buffer, one amplification frame. True if it was closed."""
    conn = RawConn(port)
    try:
        handle, _ = struct.unpack("<QQ", conn.call(ALLOC, struct.pack("<IQ", 0, 64 << 20), 16))
        if not handle:
            return False
        (base,) = struct.unpack("<Q", conn.call(BASE, struct.pack("<Q", handle), 8))
        payload = amplification_frame(handle, base)
        conn.send(struct.pack("<BQ", GRAPH_COMPUTE, len(payload)) + payload)
        try:
            conn.call(GET_DEVICE_MEMORY, bytes(4), 16)
        except (ConnectionError, OSError):
            return True
        return False
    except (ConnectionError, OSError):
        return True
    finally:
        conn.close()


def local_logits(model: Path, workdir: Path) -> np.ndarray:
    """llama.cpp's own CPU backend: the oracle for every honest client."""
    argv, env = client_argv(model, "local", workdir / "local", TOKENS)
    out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True, timeout=300)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    return np.load(info["logits_path"])


def check_logits(ref: np.ndarray, got: np.ndarray) -> str | None:
    if got.shape != ref.shape or not np.isfinite(got).all():
        return f"shape {got.shape} / finite {np.isfinite(got).all()}"
    rel = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-30))
    if rel > REL_TOL:
        return f"rel error {rel:.2e}"
    if not np.array_equal(ref.argmax(axis=1), got.argmax(axis=1)):
        return "argmax differs"
    return None


def attack_load(
    model: Path,
    duration: float,
    clients: int = 16,
    attackers: int = 4,
    workdir: Path | None = None,
    mem: str = "2G",
) -> AttackLoadResult:
    workdir = workdir or Path("/tmp")
    result = AttackLoadResult()
    ref = local_logits(model, workdir)
    port = refenv.free_port()
    server = start_rpcnet(port, "--mem", mem, capture=True)
    log_lines: list[str] = []
    assert server.stdout is not None
    drain = threading.Thread(target=lambda: log_lines.extend(server.stdout), daemon=True)
    drain.start()  # a full pipe would block the server's logging
    lock = threading.Lock()
    endpoint = f"127.0.0.1:{port}"
    try:
        argv, env = client_argv(model, endpoint, workdir / "warm", TOKENS)
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=300)
        time.sleep(0.5)
        result.baseline_rss = rss_bytes(server.pid)
        start = time.monotonic()
        deadline = start + duration

        def honest(idx: int) -> None:
            while time.monotonic() < deadline:
                out_dir = workdir / f"c{idx}"
                argv, env = client_argv(model, endpoint, out_dir, TOKENS)
                proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
                problem = None
                if proc.returncode != 0:
                    problem = f"rc={proc.returncode}: {proc.stderr[-300:]}"
                else:
                    info = json.loads(proc.stdout.strip().splitlines()[-1])
                    problem = check_logits(ref, np.load(info["logits_path"]))
                with lock:
                    result.honest_runs += 1
                    if problem is None:
                        result.honest_ok += 1
                    else:
                        result.failures.append(f"client {idx}: {problem}")

        def attacker() -> None:
            while time.monotonic() < deadline:
                closed = attack_once(port)
                with lock:
                    result.attacks += 1
                    result.attacks_closed += int(closed)
                time.sleep(0.01)

        def sample() -> None:
            while time.monotonic() < deadline + 1:
                result.peak_rss = max(result.peak_rss, rss_bytes(server.pid))
                time.sleep(0.1)

        threads = [threading.Thread(target=honest, args=(i,)) for i in range(clients)]
        threads += [threading.Thread(target=attacker) for _ in range(attackers)]
        threads.append(threading.Thread(target=sample))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result.duration = time.monotonic() - start
        result.settle(server, port, tries=200, pause=0.5)
    finally:
        refenv.stop_process(server, timeout=30)
        drain.join(5)
    result.refusals_logged = sum("compute scratch" in line for line in log_lines)
    return result
