"""TLS + tokens through `rpcnet tunnel` against plain TCP, on loopback.

Three processes per path: `rpcnet serve` (plain, or `--tls-self-signed --tokens`), for the TLS
path `rpcnet tunnel` in front of it, and the client (this script, or the REAL v8 llama.cpp
client). Measures:

- ``set``: one 64 MiB SET_TENSOR (then a DEVICE_COUNT round trip), GB/s, best of ``--reps``,
  plain and tunnel taking turns; with it the CPU time (user + system, from /proc) the tunnel and
  the TLS server spend per 64 MiB, the figure that other jobs on shared cores move least;
- ``decode``: tok/s of single-token decodes (tg) of the 336 M q8_0 random llama with every layer
  on the server (`bench/probes/engine_speed.py`, llama-bench's method), server ``--threads 2``;
  runs alternate between the paths, medians kept.

``--compare REV`` adds a third path: the tunnel and TLS server of git revision REV (its
python/rpcnet, with this tree's built extension), measured in the same rounds: before and after
in one run. The servers run with ``RPCNET_SHARE_WEIGHTS=0``: this bench measures the wire, not
the hashing of uploads for shared weights (the same cost on both paths).

Prints the ratios (tunnel / plain) and writes bench/results/tls.json with the CPU model and
flags. Loopback only.

    python bench/bench_tls.py            # both sections
    python bench/bench_tls.py --quick    # set only, 3 reps
    python bench/bench_tls.py --quick --compare HEAD~3
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import raw_upload  # noqa: E402
from rpcnet.transport import tls  # noqa: E402
from support import refenv  # noqa: E402
from support.raw import RawConn  # noqa: E402
from support.serve import wait_listening  # noqa: E402

MiB = 1 << 20
TOKEN = "bench-token-0123456789abcdef"
RESULTS = ROOT / "bench" / "results" / "tls.json"
PROBE = ROOT / "bench" / "probes" / "engine_speed.py"


def cpu_info() -> dict:
    model, flags = platform.processor(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = value.split()
                break
    except OSError:
        pass
    wanted = ("aes", "vaes", "avx2", "avx512f", "sha_ni", "pclmulqdq", "vpclmulqdq")
    return {"model": model, "cores": os.cpu_count(), "flags": [f for f in wanted if f in flags]}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def export_revision(rev: str, into: Path) -> Path:
    """REV's python/ tree in `into`, with this tree's built extension (a PYTHONPATH entry)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "python/rpcnet"],
        check=True,
        capture_output=True,
    ).stdout
    tar = into / "rev.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    for native in (ROOT / "python" / "rpcnet").glob("_native*.so"):
        shutil.copy2(native, into / "python" / "rpcnet" / native.name)
    return into / "python"


class Paths:
    """A plain server, a TLS + tokens server and a tunnel in front of it (`pythonpath`: the
    package tree the TLS server and the tunnel run from; without a plain server: `plain`
    False)."""

    def __init__(
        self, work: Path, threads: int | None, pythonpath: Path | None = None, plain: bool = True
    ) -> None:
        self.procs: list[subprocess.Popen] = []
        work.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, XDG_STATE_HOME=str(work / "state"), RPCNET_SHARE_WEIGHTS="0")
        if pythonpath is not None:
            env["PYTHONPATH"] = str(pythonpath)
        (work / "tokens").write_text(f"bench {TOKEN}\n")
        (work / "token").write_text(TOKEN + "\n")
        extra = ["--threads", str(threads)] if threads else []
        self.plain = refenv.free_port()
        self.secure = refenv.free_port()
        self.tunnel = refenv.free_port()
        base = [sys.executable, "-m", "rpcnet.cli"]
        mem = ["--mem", "4G", *extra]
        if plain:
            self._start(base + ["serve", "--port", str(self.plain), *mem], self.plain, env)
        tls_args = ["--tls-self-signed", "--tokens", str(work / "tokens")]
        self._start(base + ["serve", "--port", str(self.secure), *mem, *tls_args], self.secure, env)
        fp = tls.cert_fingerprint(work / "state" / "rpcnet" / "tls" / tls.CERT_NAME)
        tunnel = ["tunnel", "--listen", f"127.0.0.1:{self.tunnel}"]
        tunnel += ["--to", f"127.0.0.1:{self.secure}", "--token-file", str(work / "token")]
        self._start(base + tunnel + ["--fingerprint", fp], self.tunnel, env)
        self.server_pid, self.tunnel_pid = self.procs[-2].pid, self.procs[-1].pid

    def set_through_tunnel(self, size: int) -> tuple[float, float, float]:
        """(GB/s, tunnel CPU ms, server CPU ms) of one timed SET_TENSOR through the tunnel (CPU
        of the warm-up and the timed upload, halved)."""
        before = cpu_seconds(self.tunnel_pid), cpu_seconds(self.server_pid)
        rate = set_rate(self.tunnel, size)
        after = cpu_seconds(self.tunnel_pid), cpu_seconds(self.server_pid)
        return rate, (after[0] - before[0]) * 500, (after[1] - before[1]) * 500

    def _start(self, argv: list[str], port: int, env: dict) -> None:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.procs.append(proc)
        wait_listening(port, proc)

    def close(self) -> None:
        for proc in reversed(self.procs):
            refenv.stop_process(proc)


def set_rate(port: int, size: int) -> float:
    """GB/s of one SET_TENSOR of `size` bytes (+ a DEVICE_COUNT round trip)."""
    conn = RawConn(port)
    try:
        up = raw_upload.prepare(conn, size)
        raw_upload.upload(conn, up)  # warm: pages of the buffer touched once
        t0 = time.perf_counter()
        raw_upload.upload(conn, up)
        return size / (time.perf_counter() - t0) / 1e9
    finally:
        conn.close()


def decode_rate(model: Path, port: int, tg: int) -> float:
    """Single-token decode tok/s (llama-bench's tg), client threads 2, the median of 3."""
    out = refenv.run_probe(
        "v8",
        PROBE,
        model,
        f"127.0.0.1:{port}",
        "--pp",
        "8",
        "--tg",
        tg,
        "--reps",
        3,
        timeout=1800,
    )
    return float(out["tg"])


def set_summary(size: int, plain: list[float], tunnel: list[tuple[float, float, float]]) -> dict:
    rates = [r for r, _, _ in tunnel]
    return {
        "bytes": size,
        "plain_gbps": max(plain),
        "tunnel_gbps": max(rates),
        "ratio": max(rates) / max(plain),
        "tunnel_cpu_ms": statistics.median(t for _, t, _ in tunnel),
        "server_cpu_ms": statistics.median(s for _, _, s in tunnel),
        "plain_all": plain,
        "tunnel_all": rates,
    }


def load_note(result: dict) -> str:
    load = result.get("load")
    return "" if load is None else f" (load average {load:.1f} at the start)"


def as_report(result: dict) -> dict:
    """`result` in bench/report.py's table format (its raw figures kept alongside)."""
    cpu = result["cpu"]
    rows = []
    if "set" in result:
        st = result["set"]
        mib = st["bytes"] >> 20
        rows.append(
            [
                f"SET_TENSOR {mib} MiB, GB/s (best of {len(st['plain_all'])})",
                f"{st['plain_gbps']:.2f}",
                f"{st['tunnel_gbps']:.2f}",
                f"{st['ratio']:.2f}",
            ]
        )
        rows.append(
            [
                f"CPU per {mib} MiB upload, tunnel / TLS server, ms (median)",
                "",
                f"{st['tunnel_cpu_ms']:.0f} / {st['server_cpu_ms']:.0f}",
                "",
            ]
        )
    if "before" in result:
        bt = result["before"]
        rows.append(
            [
                f"SET_TENSOR, tunnel and TLS server of {bt['revision']}: GB/s; CPU ms",
                "",
                f"{bt['tunnel_gbps']:.2f}; {bt['tunnel_cpu_ms']:.0f} / {bt['server_cpu_ms']:.0f}",
                f"{bt['ratio']:.2f}",
            ]
        )
    if "decode" in result:
        dc = result["decode"]
        rows.append(
            [
                f"decode tg{dc['tg']}, 336 M q8_0, server --threads 2, tok/s "
                f"(median of {len(dc['plain_all'])})",
                f"{dc['plain_tok_s']:.2f}",
                f"{dc['tunnel_tok_s']:.2f}",
                f"{dc['ratio']:.3f}",
            ]
        )
        bt = result.get("before", {})
        if "decode_tok_s" in bt:
            rows.append(
                [
                    f"decode, tunnel and TLS server of {bt['revision']}, tok/s",
                    "",
                    f"{bt['decode_tok_s']:.2f}",
                    f"{bt['decode_ratio']:.3f}",
                ]
            )
    return {
        "title": "TLS and tokens through `rpcnet tunnel`",
        "script": "bench/bench_tls.py",
        "command": result["command"],
        "machine": {
            "cpu": cpu["model"],
            "flags": ", ".join(f.upper() for f in cpu["flags"]),
            "cores": cpu["cores"],
        },
        "description": [
            "The same client over plain TCP to `rpcnet serve`, and through `rpcnet tunnel` "
            "(TLS 1.3, TLS_AES_256_GCM_SHA384, pinned fingerprint, token preamble) to "
            "`rpcnet serve --tls-self-signed --tokens`; server, tunnel and client are separate "
            "processes on 127.0.0.1, the two paths measured in alternation. Ratios are "
            "tunnel / plain."
        ],
        "tables": [{"columns": ["measure", "plain TCP", "tunnel + TLS", "ratio"], "rows": rows}],
        "notes": [
            f"{cpu['cores']} cores shared with other jobs{load_note(result)}: an upload "
            "through the tunnel keeps three processes busy (client; tunnel: a receive, an "
            "encryption and a send; server: a receive and a decryption into the buffer), so its "
            "GB/s is the figure contention moves most. The CPU times depend less on the "
            "other jobs: 64 MiB over the larger of the two is what the path carries with a "
            "core each for tunnel and server.",
            "Servers run with RPCNET_SHARE_WEIGHTS=0: this measures the wire; with shared "
            "weights on, every upload of 256 KiB or more is also hashed (SHA-256) on both paths.",
        ],
        "raw": result,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--size", type=int, default=64 * MiB)
    parser.add_argument("--decode-runs", type=int, default=3)
    parser.add_argument("--tg", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="set only, 3 reps")
    parser.add_argument(
        "--model-cache", type=Path, default=Path(tempfile.gettempdir()) / "rpcnet-bench-models"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--compare", metavar="REV", help="also measure REV's tunnel and server")
    args = parser.parse_args()
    if args.quick:
        args.reps = 3
    result: dict = {
        "bench": "tls",
        "command": "python bench/bench_tls.py" + (" --quick" if args.quick else ""),
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_info(),
        "python": platform.python_version(),
        "load": os.getloadavg()[0],
    }
    with tempfile.TemporaryDirectory() as tmp:
        paths = Paths(Path(tmp) / "now", threads=2)
        before = None
        if args.compare:
            tree = export_revision(args.compare, Path(tmp))
            before = Paths(Path(tmp) / "before", threads=2, pythonpath=tree, plain=False)
        try:
            plain: list[float] = []
            tunnel: list[tuple[float, float, float]] = []
            earlier: list[tuple[float, float, float]] = []
            for i in range(args.reps):
                rounds = [lambda: plain.append(set_rate(paths.plain, args.size))]
                rounds.append(lambda: tunnel.append(paths.set_through_tunnel(args.size)))
                if before is not None:
                    rounds.append(lambda: earlier.append(before.set_through_tunnel(args.size)))
                for measure in rounds if i % 2 == 0 else rounds[::-1]:
                    measure()
            result["set"] = set_summary(args.size, plain, tunnel)
            st = result["set"]
            print(
                f"SET_TENSOR {args.size >> 20} MiB: plain {st['plain_gbps']:.2f} GB/s, "
                f"tunnel {st['tunnel_gbps']:.2f} GB/s, ratio {st['ratio']:.2f}; CPU per upload: "
                f"tunnel {st['tunnel_cpu_ms']:.0f} ms, TLS server {st['server_cpu_ms']:.0f} ms"
            )
            if before is not None:
                result["before"] = set_summary(args.size, plain, earlier)
                result["before"]["revision"] = args.compare
                bt = result["before"]
                print(
                    f"  {args.compare}: tunnel {bt['tunnel_gbps']:.2f} GB/s; CPU per upload: "
                    f"tunnel {bt['tunnel_cpu_ms']:.0f} ms, TLS server {bt['server_cpu_ms']:.0f} ms"
                )
            if not args.quick:
                sys.path.insert(0, str(ROOT / "bench"))
                import bench_engine

                spec = bench_engine.spec_for(bench_engine.MODELS["336m"], "q8_0")
                model = bench_engine.ensure_bench_model(spec, args.model_cache)
                dp, dt, db = [], [], []
                for i in range(args.decode_runs):
                    order = [(dp, paths.plain), (dt, paths.tunnel)]
                    if before is not None:
                        order.append((db, before.tunnel))
                    for out, port in order if i % 2 == 0 else order[::-1]:
                        out.append(decode_rate(model, port, args.tg))
                p, t = statistics.median(dp), statistics.median(dt)
                result["decode"] = {
                    "model": "336m q8_0",
                    "server_threads": 2,
                    "tg": args.tg,
                    "plain_tok_s": p,
                    "tunnel_tok_s": t,
                    "ratio": t / p,
                    "plain_all": dp,
                    "tunnel_all": dt,
                }
                print(f"decode tg{args.tg}: plain {p:.2f} tok/s, tunnel {t:.2f}, ratio {t / p:.3f}")
                if before is not None:
                    b = statistics.median(db)
                    result["before"].update(decode_tok_s=b, decode_ratio=b / p, decode_all=db)
                    print(f"  {args.compare}: tunnel {b:.2f} tok/s, ratio {b / p:.3f}")
        finally:
            paths.close()
            if before is not None:
                before.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(as_report(result), indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
