"""Counters the server keeps for operators: per connection and server-wide.

Plain ints bumped on the event-loop thread; metrics.py turns them into Prometheus families and
the /status snapshot at scrape time, so the serving path never touches the exposition library.
A connection logs one INFO line with its totals when it closes, and a progress line every few
seconds while it uploads more than UPLOAD_REPORT_MIN bytes.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import Counter
from typing import Any

from rpcnet import _native
from rpcnet.logsetup import TRACE
from rpcnet.protocol.commands import HEADER_SIZE, Cmd

log = logging.getLogger("rpcnet.server")

# Upper bounds (seconds) of the command latency histogram.
LATENCY_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)
# Upper bounds (seconds) of the histogram of each graph's wait for its device (its turn).
WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
UPLOAD_REPORT_MIN = 256 << 20  # progress lines only for uploads larger than this
UPLOAD_REPORT_EVERY = 5.0  # seconds between progress lines
SET_TENSOR, SET_TENSOR_HASH = int(Cmd.SET_TENSOR), int(Cmd.SET_TENSOR_HASH)
GRAPH_COMPUTE, GRAPH_RECOMPUTE = int(Cmd.GRAPH_COMPUTE), int(Cmd.GRAPH_RECOMPUTE)
MEMORY_CHANGES = frozenset({int(Cmd.ALLOC_BUFFER), int(Cmd.FREE_BUFFER)})
UPLOADS = frozenset({SET_TENSOR, SET_TENSOR_HASH, int(Cmd.SET_TENSOR_2D)})


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class CommandLatency:
    """Histogram state of one command type (cumulative buckets are built at scrape time)."""

    __slots__ = ("buckets", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(LATENCY_BUCKETS) + 1)  # the last one is +Inf
        self.count = 0
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.count += 1
        self.total += seconds


class DeviceWait:
    """How long a client's (or every client's) graphs waited for the device before and between
    their slices. Observed on the device's worker thread (and on the loop for inline runs)."""

    def __init__(self) -> None:
        self.buckets = [0] * (len(WAIT_BUCKETS) + 1)  # the last one is +Inf
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self.last = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.buckets[bisect.bisect_left(WAIT_BUCKETS, seconds)] += 1
            self.count += 1
            self.total += seconds
            self.max = max(self.max, seconds)
            self.last = seconds

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            mean = self.total / self.count if self.count else 0.0
            return {
                "graphs": self.count,
                "total_s": round(self.total, 6),
                "mean_ms": round(mean * 1e3, 3),
                "max_ms": round(self.max * 1e3, 3),
                "last_ms": round(self.last * 1e3, 3),
            }


class ConnectionStats:
    """One client's totals; `begin`/`end` bracket every command the connection handles."""

    def __init__(self, server: ServerStats, peer: str, session: Any) -> None:
        self.server = server
        self.peer = peer
        self.session = session  # read at scrape time: buffers held
        self.since = time.time()
        self.started = time.monotonic()
        self.bytes_in = 0
        self.bytes_out = 0
        self.commands = 0
        self.graphs = 0
        self.recomputes = 0
        self.hash_hits = 0
        self.hash_misses = 0
        self.peak_held = 0
        self.device_wait = DeviceWait()
        self.cmd: int | None = None  # the command in progress, None while waiting for one
        self.cmd_started = 0.0
        self.uploaded = 0  # SET_TENSOR* payload bytes since the upload began
        self._upload_started = 0.0
        self._upload_reported = 0.0
        self._upload_hits = 0

    # ------------------------------------------------------------ per command

    def begin(self, cmd: int, size: int) -> None:
        now = time.perf_counter()
        self.cmd, self.cmd_started = cmd, now
        self.commands += 1
        nbytes = HEADER_SIZE + size
        self.bytes_in += nbytes
        self.server.bytes_in += nbytes
        if cmd in UPLOADS:
            self._upload(size, now)
        elif cmd == GRAPH_COMPUTE:
            self.graphs += 1
            self._upload_done(now)
        elif cmd == GRAPH_RECOMPUTE:
            self.recomputes += 1

    def responded(self, view: memoryview) -> None:
        nbytes = 8 + view.nbytes
        self.bytes_out += nbytes
        self.server.bytes_out += nbytes
        if self.cmd == SET_TENSOR_HASH and view.nbytes == 1:
            if view[0]:
                self.hash_hits += 1
                self._upload_hits += 1
            else:
                self.hash_misses += 1

    def end(self) -> None:
        cmd = self.cmd
        if cmd is None:
            return
        elapsed = time.perf_counter() - self.cmd_started
        self.cmd = None
        self.server.command_done(cmd, elapsed)
        if cmd in MEMORY_CHANGES:
            self.peak_held = max(self.peak_held, self.held())
        if log.isEnabledFor(TRACE):
            log.log(TRACE, "%s: %s in %.3f ms", self.peer, self.name(cmd), elapsed * 1e3)

    def name(self, cmd: int) -> str:
        return _native.command_name(self.server.proto, cmd)

    def held(self) -> int:
        buffers = getattr(self.session, "buffers", None)
        return buffers.bytes_held if buffers is not None else 0

    def buffer_count(self) -> int:
        buffers = getattr(self.session, "buffers", None)
        return len(buffers) if buffers is not None else 0

    # ------------------------------------------------------------ upload progress

    def _upload(self, size: int, now: float) -> None:
        if not self._upload_started:
            self._upload_started = self._upload_reported = now
            self._upload_hits = 0
        self.uploaded += size
        if self.uploaded > UPLOAD_REPORT_MIN and now - self._upload_reported >= UPLOAD_REPORT_EVERY:
            self._upload_reported = now
            log.info("%s: uploading: %s", self.peer, self._upload_summary(now))

    def _upload_done(self, now: float) -> None:
        if self._upload_started and self.uploaded > UPLOAD_REPORT_MIN:
            log.info("%s: upload done: %s", self.peer, self._upload_summary(now))
        self._upload_started = 0.0
        self.uploaded = 0

    def _upload_summary(self, now: float) -> str:
        elapsed = max(now - self._upload_started, 1e-6)
        mb = self.uploaded / 1e6
        return (
            f"{mb:.0f} MB received in {elapsed:.1f} s ({mb / elapsed:.0f} MB/s), "
            f"{self._upload_hits} weights served by the cache or --model-dir"
        )

    # ------------------------------------------------------------ close

    def close(self) -> None:
        self.end()
        self._upload_done(time.perf_counter())
        self.server.connection_closed(self)
        wait = self.device_wait.snapshot()
        log.info(
            "%s: closed after %.1f s: %s in, %s out, %d graphs (%d recomputes), "
            "peak %s held, hash hits %d/%d, device wait %.1f ms mean, %.0f ms longest",
            self.peer,
            time.monotonic() - self.started,
            human_bytes(self.bytes_in),
            human_bytes(self.bytes_out),
            self.graphs,
            self.recomputes,
            human_bytes(self.peak_held),
            self.hash_hits,
            self.hash_hits + self.hash_misses,
            wait["mean_ms"],
            wait["max_ms"],
        )

    def snapshot(self) -> dict[str, Any]:
        now = time.perf_counter()
        return {
            "peer": self.peer,
            "connected_since": self.since,
            "connected_s": round(time.monotonic() - self.started, 3),
            "buffers": self.buffer_count(),
            "bytes_held": self.held(),
            "peak_bytes_held": max(self.peak_held, self.held()),
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "commands": self.commands,
            "graphs": self.graphs,
            "recomputes": self.recomputes,
            "hash_hits": self.hash_hits,
            "hash_misses": self.hash_misses,
            "command": None if self.cmd is None else self.name(self.cmd),
            "command_s": None if self.cmd is None else round(now - self.cmd_started, 6),
            "device_wait": self.device_wait.snapshot(),
        }


class ServerStats:
    """Server-wide counters plus the open connections' stats."""

    def __init__(self, proto: int) -> None:
        self.proto = proto
        self.started = time.time()
        self.open: dict[int, ConnectionStats] = {}
        self.accepted = 0
        self.refused: Counter[str] = Counter()
        self.bytes_in = 0
        self.bytes_out = 0
        self.latency: dict[int, CommandLatency] = {}
        self.device_wait = DeviceWait()  # every graph's wait for its device
        self._by_owner: dict[int, ConnectionStats] = {}  # id(session) -> its connection's stats
        # Totals of closed connections, so per-client sums never go backwards.
        self.closed_graphs = 0
        self.closed_recomputes = 0

    def open_connection(self, peer: str, session: Any) -> ConnectionStats:
        conn = ConnectionStats(self, peer, session)
        self.open[id(conn)] = conn
        self._by_owner[id(session)] = conn
        self.accepted += 1
        return conn

    def connection_closed(self, conn: ConnectionStats) -> None:
        self._by_owner.pop(id(conn.session), None)
        if self.open.pop(id(conn), None) is not None:
            self.closed_graphs += conn.graphs
            self.closed_recomputes += conn.recomputes

    def graph_waited(self, owner: object, seconds: float) -> None:
        """A graph of `owner` (a session) waited `seconds` for its device (`Device.wait_observer`:
        called on the device's worker thread)."""
        self.device_wait.observe(seconds)
        conn = self._by_owner.get(id(owner))
        if conn is not None:
            conn.device_wait.observe(seconds)

    def refuse(self, reason: str) -> None:
        self.refused[reason] += 1

    def command_done(self, cmd: int, seconds: float) -> None:
        hist = self.latency.get(cmd)
        if hist is None:
            hist = self.latency[cmd] = CommandLatency()
        hist.observe(seconds)

    @property
    def graphs(self) -> int:
        return self.closed_graphs + sum(c.graphs for c in self.open.values())

    @property
    def recomputes(self) -> int:
        return self.closed_recomputes + sum(c.recomputes for c in self.open.values())
