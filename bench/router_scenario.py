"""The router scenario: a REAL llama-server in router mode, two models, every layer on one RPC
server — rpcnet (`--proto 7`) versus the reference rpc-server of the same llama.cpp build.

llama-server (protocol 7, built by bench/build_llama_server.sh) is started with `--models-dir`
holding two models and `--rpc` pointing at the backend. Completions for both models run one after
the other and then at the same time. Each router child opens its own RPC connection; rpc-server
serves one connection at a time, so the second child hangs at HELLO, while rpcnet serves both.
Greedy completions with top-5 probabilities are compared with a local run (no --rpc) of the same
router: tokens must agree, probabilities within 5e-2 absolute.

Usage: PYTHONPATH=python:tests python bench/router_scenario.py [--out TABLE.md]
(--out: the table of docs/router-scenario.md)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from support.models import ZOO, ensure_model  # noqa: E402

BUILD = Path(os.environ.get("RPCNET_LLAMA_BUILD", REPO / ".llama-build"))
PROMPT = "The quick brown fox"
TIMEOUT = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"port {port} not listening")


def http(port: int, path: str, body: dict | None = None, timeout: float = TIMEOUT) -> dict:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET"
    )
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as rsp:
        return json.loads(rsp.read())


def start_group(argv: list[str], log: Path) -> subprocess.Popen:
    fh = open(log, "wb")  # noqa: SIM115 - the child keeps its descriptor
    return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def stop_group(proc: subprocess.Popen) -> None:
    """Stop a process we started and the router children it spawned (its own session)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def complete(port: int, model: str) -> dict:
    body = {
        "model": model,
        "prompt": PROMPT,
        "n_predict": 8,
        "temperature": 0,
        "n_probs": 5,
        "cache_prompt": False,
        "seed": 1,
    }
    t0 = time.monotonic()
    try:
        rsp = http(port, "/completion", body)
        probs = rsp.get("completion_probabilities", [])
        return {
            "ok": True,
            "s": round(time.monotonic() - t0, 2),
            "tokens": [p.get("id") for p in probs],
            "top": [
                [
                    c.get("prob", c.get("logprob"))
                    for c in p.get("top_probs", p.get("top_logprobs", []))
                ]
                for p in probs
            ],
        }
    except Exception as exc:  # noqa: BLE001 - a hang or an error is the measurement
        return {
            "ok": False,
            "s": round(time.monotonic() - t0, 2),
            "error": f"{type(exc).__name__}: {exc}",
        }


def run_router(models_dir: Path, rpc: str | None, tmp: Path, tag: str) -> dict:
    port = free_port()
    argv = [
        str(BUILD / "bin" / "llama-server"),
        "--models-dir",
        str(models_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--models-max",
        "2",
        "-c",
        "256",
        "-t",
        "1",
        "-np",
        "1",
    ]
    if rpc:
        argv += ["--rpc", rpc, "-ngl", "99"]
    router = start_group(argv, tmp / f"router-{tag}.log")
    try:
        wait_port(port)
        ids = sorted(m["id"] for m in http(port, "/v1/models")["data"])
        out: dict = {"models": ids, "sequential": {}, "concurrent": {}}
        for mid in ids:
            out["sequential"][mid] = complete(port, mid)
        results: dict = {}
        threads = [
            threading.Thread(target=lambda m=m: results.__setitem__(m, complete(port, m)))
            for m in ids
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out["concurrent"] = results
        return out
    finally:
        stop_group(router)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not (BUILD / "bin" / "llama-server").exists():
        subprocess.run(["bash", str(REPO / "bench" / "build_llama_server.sh")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="rpcnet-router-"))
    models_dir = tmp / "models"
    models_dir.mkdir()
    for name, spec in (("model-a", "llama-gqa-f32"), ("model-b", "qwen3-f32")):
        src = ensure_model(ZOO[spec], tmp / "zoo")
        (models_dir / f"{name}.gguf").symlink_to(src)

    report: dict = {"local": run_router(models_dir, None, tmp, "local")}
    for backend in ("rpcnet", "reference"):
        port = free_port()
        if backend == "rpcnet":
            argv = [
                sys.executable,
                "-m",
                "rpcnet.cli",
                "serve",
                "--proto",
                "7",
                "--port",
                str(port),
            ]
        else:
            argv = [str(BUILD / "bin" / "rpc-server"), "-p", str(port), "-t", "1"]
        server = start_group(argv, tmp / f"{backend}.log")
        try:
            wait_port(port)
            report[backend] = run_router(models_dir, f"127.0.0.1:{port}", tmp, backend)
        finally:
            stop_group(server)

    lines = [
        "| backend | phase | model | outcome | seconds | tokens match local | max prob diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for backend in ("local", "rpcnet", "reference"):
        for phase in ("sequential", "concurrent"):
            for mid, r in sorted(report[backend][phase].items()):
                local = report["local"]["sequential"].get(mid, {})
                match = diff = "-"
                if r["ok"] and local.get("ok"):
                    match = "yes" if r["tokens"] == local["tokens"] else "NO"
                    pairs = [
                        abs(a - b)
                        for ra, la in zip(r["top"], local["top"], strict=False)
                        for a, b in zip(ra, la, strict=False)
                    ]
                    diff = f"{max(pairs):.2e}" if pairs else "-"
                outcome = "ok" if r["ok"] else f"failed ({r['error'][:60]})"
                lines.append(
                    f"| {backend} | {phase} | {mid} | {outcome} | {r['s']} | {match} | {diff} |"
                )
    text = "\n".join(lines)
    print(text)
    print(json.dumps(report, indent=1)[:4000])
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
