"""`rpcnet status HOST:PORT`: a running server's /status (from `serve --metrics`), as a table."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from rpcnet.server.stats import human_bytes


def add_parser(sub: Any, parse_endpoint: Callable[[str], tuple[str, int]]) -> None:
    status = sub.add_parser("status", help="show a server's clients and memory (needs --metrics)")
    status.add_argument(
        "endpoint", type=parse_endpoint, metavar="HOST:PORT", help="the --metrics address"
    )
    status.add_argument("--json", action="store_true", help="the raw /status document")
    status.add_argument("--timeout", type=float, default=10.0)


def fetch(host: str, port: int, timeout: float = 10.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{host}:{port}/status", timeout=timeout) as resp:
        return json.loads(resp.read())


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"rpcnet {doc['version']}  ggml RPC {doc['dialect']}  on {doc['listen']}  "
        f"up {_duration(doc['uptime_s'])}",
    ]
    for dev in doc["devices"]:
        lines.append(
            f"device {dev['index']} {dev['name']}: {human_bytes(dev['held'])} held of "
            f"{human_bytes(dev['capacity'])} ({human_bytes(dev['free'])} free, "
            f"{human_bytes(dev['derived_bytes'])} derived)"
        )
    t = doc["totals"]
    lines.append(
        f"connections: {t['connections_open']} open, {t['connections_accepted']} accepted, "
        f"refused {sum(t['connections_refused'].values())}; "
        f"{human_bytes(t['bytes_in'])} in, {human_bytes(t['bytes_out'])} out, "
        f"{t['graphs']} graphs, {t['recomputes']} recomputes"
    )
    if doc.get("cache"):
        c = doc["cache"]
        lines.append(
            f"cache {c['directory']}: {c['hits']} hits, {c['misses']} misses, "
            f"{human_bytes(c['bytes_written'])} written, {c['evictions']} evictions"
        )
    if doc.get("model_dirs"):
        m = doc["model_dirs"]
        state = "ready" if m["ready"] else "indexing"
        lines.append(
            f"model dirs ({state}): {m['files']} files, {m['tensors']} tensors, "
            f"{m['hits']} hits, {human_bytes(m['bytes_served'])} served"
        )
    lines.append("")
    header = ("PEER", "SINCE", "BUFFERS", "HELD", "IN", "OUT", "GRAPHS", "WAIT", "COMMAND")
    rows = [header]
    for c in doc["clients"]:
        command = "-" if c["command"] is None else f"{c['command']} {c['command_s']:.3f}s"
        rows.append(
            (
                c["peer"],
                time.strftime("%H:%M:%S", time.localtime(c["connected_since"])),
                str(c["buffers"]),
                human_bytes(c["bytes_held"]),
                human_bytes(c["bytes_in"]),
                human_bytes(c["bytes_out"]),
                f"{c['graphs']}+{c['recomputes']}",
                _wait(c.get("device_wait")),
                command,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if not doc["clients"]:
        lines.append("(no clients connected)")
    else:
        lines.append("WAIT: each graph's wait for its device (its turn), mean/longest")
    return "\n".join(lines)


def _wait(wait: dict[str, Any] | None) -> str:
    """A client's wait for the device: mean and longest per graph (who is starved)."""
    if not wait or not wait["graphs"]:
        return "-"
    return f"{wait['mean_ms']:.1f}/{wait['max_ms']:.0f} ms"


def _duration(seconds: float) -> str:
    s = int(seconds)
    return (
        f"{s // 86400}d{s % 86400 // 3600:02d}h"
        if s >= 86400
        else time.strftime("%H:%M:%S", time.gmtime(s))
    )


def run(args: argparse.Namespace) -> int:
    host, port = args.endpoint
    try:
        doc = fetch(host, port, args.timeout)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        print(f"rpcnet status: {host}:{port}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else render(doc))
    return 0
