"""`--metrics HOST:PORT`: Prometheus text at /metrics, a JSON snapshot at /status.

Served by a tiny HTTP/1.0 responder on the server's own event loop, so a scrape reads the
counters on the thread that writes them. The exposition format is prometheus_client's; the
values are collected at scrape time from ServerStats, the devices, the cache and the model
directories. The same --allow rules as the RPC port decide who may scrape.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
)

from rpcnet import __version__, _native
from rpcnet.compute import profile
from rpcnet.compute.shared_content import device_sharing
from rpcnet.server.access import allowed
from rpcnet.server.modeldir import hash_cache_of
from rpcnet.server.stats import LATENCY_BUCKETS, WAIT_BUCKETS

if TYPE_CHECKING:
    from rpcnet.compute.device import Device
    from rpcnet.server.access import Network
    from rpcnet.server.comm import CommHub
    from rpcnet.server.config import ServerConfig
    from rpcnet.server.modeldir import ModelDirs
    from rpcnet.server.stats import ServerStats


class Server(Protocol):
    """What the metrics endpoint reads of its server (`rpcnet.server.app.Server`)."""

    config: ServerConfig
    devices: list[Device]
    cache: Any
    comm: CommHub
    models: ModelDirs
    stats: ServerStats
    allow: tuple[Network, ...]

    @property
    def port(self) -> int: ...


log = logging.getLogger("rpcnet.metrics")
MAX_REQUEST = 8192
REQUEST_TIMEOUT = 5.0


def _counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None):
    fam = CounterMetricFamily(name, doc, labels=list(labels) if labels else None)
    fam.add_metric(list(labels.values()) if labels else [], value)
    return fam


# Per-device families, rpcnet_<key>: their help. Values per device from `_device_values`.
DEVICE_GAUGES = {
    "device_memory_held_bytes": "Device memory held (buffers and derived data)",
    "device_memory_capacity_bytes": "Device memory capacity reported to clients",
    "device_memory_free_bytes": "Device memory free",
    "derived_cache_bytes": "Dequantized weight copies held",
    "scratch_bytes": "Compute scratch memory held",
    "shared_bytes": "Weight bytes held once for several buffer ranges (identical uploads)",
    "shared_saved_bytes": (
        "Bytes the shared weights save: what their users would hold beyond one copy"
    ),
}
DEVICE_COUNTERS = {
    "joint_runs": "Decode passes that ran several clients' steps over one read of equal weights",
    "joint_plans": "Client decode steps that ran inside joint passes",
    "shared_collisions": "Uploads not shared: their FNV-1a names other content the server holds",
    "shared_identify_seconds": (
        "Time spent identifying uploads for sharing (sampled keys, byte comparisons)"
    ),
    "shared_hash_answers": (
        "SET_TENSOR_HASH lookups answered from weights held in memory (no cache read)"
    ),
}


class ServerCollector:
    """Builds every rpcnet_* family from the live server at scrape time."""

    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        srv, stats = self.server, self.server.stats
        info = InfoMetricFamily("rpcnet", "rpcnet build and dialect")
        info.add_metric([], {"version": __version__, "dialect": f"{srv.config.proto}.0.0"})
        yield info
        yield GaugeMetricFamily(
            "rpcnet_start_time_seconds", "Unix time the server started", value=stats.started
        )

        yield GaugeMetricFamily(
            "rpcnet_connections_open", "Client connections open now", value=len(stats.open)
        )
        yield CounterMetricFamily(
            "rpcnet_connections_accepted", "Client connections accepted", value=stats.accepted
        )
        refused = CounterMetricFamily(
            "rpcnet_connections_refused", "Connections refused, by reason", labels=["reason"]
        )
        for reason in ("allowlist", "max_clients", "max_clients_per_addr", "draining"):
            refused.add_metric([reason], stats.refused.get(reason, 0))
        yield refused

        commands = CounterMetricFamily(
            "rpcnet_commands", "Commands handled, by type", labels=["command"]
        )
        latency = HistogramMetricFamily(
            "rpcnet_command_seconds", "Command handling time, by type", labels=["command"]
        )
        for cmd, hist in sorted(stats.latency.items()):
            name = _native.command_name(srv.config.proto, cmd)
            commands.add_metric([name], hist.count)
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BUCKETS, float("inf")), hist.buckets, strict=True):
                cumulative += count
                buckets.append((_bound(bound), cumulative))
            latency.add_metric([name], buckets, hist.total)
        yield commands
        yield latency

        yield CounterMetricFamily(
            "rpcnet_received_bytes", "Bytes received from clients (frames)", value=stats.bytes_in
        )
        yield CounterMetricFamily(
            "rpcnet_sent_bytes", "Bytes sent to clients (responses)", value=stats.bytes_out
        )
        yield CounterMetricFamily(
            "rpcnet_graph_computes", "GRAPH_COMPUTE commands", value=stats.graphs
        )
        yield CounterMetricFamily(
            "rpcnet_graph_recomputes", "GRAPH_RECOMPUTE commands", value=stats.recomputes
        )

        yield from self._kernels()
        yield from self._devices()
        yield from self._clients()
        yield from self._cache()
        yield from self._comm()
        yield from self._models()

    def _kernels(self) -> Iterator[Any]:
        seconds = CounterMetricFamily(
            "rpcnet_kernel_seconds", "Kernel time by op and device", labels=["op", "device"]
        )
        calls = CounterMetricFamily(
            "rpcnet_kernel_calls", "Kernel runs by op and device", labels=["op", "device"]
        )
        by_op: dict[str, tuple[float, int]] = {}
        for label, (secs, n) in profile.totals().items():
            op = label.split(" ", 1)[0]
            total, calls_so_far = by_op.get(op, (0.0, 0))
            by_op[op] = (total + secs, calls_so_far + n)
        device = self.server.config.device  # plans are compiled for the served device kind
        for op, (secs, n) in sorted(by_op.items()):
            seconds.add_metric([op, device], secs)
            calls.add_metric([op, device], n)
        yield seconds
        yield calls

    def _devices(self) -> Iterator[Any]:
        families = {
            key: kind(f"rpcnet_{key}", doc, labels=["device"])
            for kind, docs in (
                (GaugeMetricFamily, DEVICE_GAUGES),
                (CounterMetricFamily, DEVICE_COUNTERS),
            )
            for key, doc in docs.items()
        }
        for dev in self.server.devices:
            for key, value in _device_values(dev).items():
                families[key].add_metric([dev.name], value)
        yield from families.values()

    def _clients(self) -> Iterator[Any]:
        held = GaugeMetricFamily(
            "rpcnet_client_buffer_bytes", "Buffer bytes held per client", labels=["peer"]
        )
        wait = HistogramMetricFamily(
            "rpcnet_client_device_wait_seconds",
            "Time each graph of a client waited for its device (its turn), per client",
            labels=["peer"],
        )
        for conn in self.server.stats.open.values():
            held.add_metric([conn.peer], conn.held())
            wait.add_metric([conn.peer], *_wait_buckets(conn.device_wait))
        yield held
        yield wait
        total = HistogramMetricFamily(
            "rpcnet_device_wait_seconds", "Time each graph waited for its device (its turn)"
        )
        total.add_metric([], *_wait_buckets(self.server.stats.device_wait))
        yield total

    def _cache(self) -> Iterator[Any]:
        cache = hash_cache_of(self.server.cache)
        values = (
            (0, 0, 0, 0)
            if cache is None
            else (cache.hits, cache.misses, cache.bytes_written, cache.evictions)
        )
        names = ("hits", "misses", "written_bytes", "evictions")
        docs = (
            "SET_TENSOR_HASH answered from the hash cache",
            "Hash cache lookups that missed",
            "Bytes written to the hash cache",
            "Hash cache files evicted by --cache-max",
        )
        for name, doc, value in zip(names, docs, values, strict=True):
            yield CounterMetricFamily(f"rpcnet_hash_cache_{name}", doc, value=value)

    def _comm(self) -> Iterator[Any]:
        comm = self.server.comm.stats
        yield CounterMetricFamily(
            "rpcnet_comm_allreduces", "Pairwise allreduces with peer servers", value=comm.allreduces
        )
        fam = CounterMetricFamily(
            "rpcnet_comm_bytes", "Bytes exchanged with peer servers", labels=["direction"]
        )
        fam.add_metric(["sent"], comm.bytes_sent)
        fam.add_metric(["received"], comm.bytes_received)
        yield fam

    def _models(self) -> Iterator[Any]:
        models = self.server.models
        for name, doc, value in (
            ("hits", "SET_TENSOR_HASH answered from --model-dir", models.lookups["hits"]),
            ("misses", "--model-dir lookups that missed", models.lookups["misses"]),
            (
                "served_bytes",
                "Bytes read from --model-dir files into buffers",
                models.lookups["bytes_served"],
            ),
        ):
            yield CounterMetricFamily(f"rpcnet_model_dir_{name}", doc, value=value)
        yield GaugeMetricFamily(
            "rpcnet_model_dir_tensors", "Tensors indexed in --model-dir", value=models.tensors
        )


def _wait_buckets(hist: Any) -> tuple[list[tuple[str, float]], float]:
    """A DeviceWait's cumulative buckets and sum, as HistogramMetricFamily takes them."""
    cumulative, buckets = 0, []
    for bound, count in zip((*WAIT_BUCKETS, float("inf")), hist.buckets, strict=True):
        cumulative += count
        buckets.append((_bound(bound), cumulative))
    return buckets, hist.total


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)


def _device_values(dev: Any) -> dict[str, float]:
    mem, sharing = dev.memory, device_sharing(dev)
    return {
        "device_memory_held_bytes": mem.held,
        "device_memory_capacity_bytes": mem.capacity,
        "device_memory_free_bytes": mem.free,
        "derived_cache_bytes": dev.derived.held,
        "scratch_bytes": _scratch_bytes(dev),
        "shared_bytes": sharing["shared"],
        "shared_saved_bytes": sharing["saved"],
        "joint_runs": dev.joint_runs,
        "joint_plans": dev.joint_plans,
        "shared_collisions": sharing["collisions"],
        "shared_identify_seconds": sharing["seconds"],
        "shared_hash_answers": sharing["answered"],
    }


def _scratch_bytes(dev: Any) -> int:
    """Scratch memory, where the device keeps such a pool (0 otherwise)."""
    scratch = getattr(dev, "scratch", None)
    for attr in ("held", "bytes_held", "nbytes"):
        value = getattr(scratch, attr, None)
        if isinstance(value, int):
            return value
    return 0


def status_snapshot(server: Server) -> dict[str, Any]:
    """The /status document: server, devices, cache, model dirs and every connected client."""
    stats, config = server.stats, server.config
    cache = hash_cache_of(server.cache)
    return {
        "version": __version__,
        "dialect": f"{config.proto}.0.0",
        "listen": f"{config.host}:{server.port}",
        "started": stats.started,
        "uptime_s": round(time.time() - stats.started, 3),
        "devices": [
            {
                "index": dev.index,
                "name": dev.name,
                "description": dev.description,
                "capacity": dev.memory.capacity,
                "held": dev.memory.held,
                "free": dev.memory_report()[0],
                "derived_bytes": dev.derived.held,
                "scratch_bytes": _scratch_bytes(dev),
                "shared_bytes": device_sharing(dev)["shared"],
                "shared_saved_bytes": device_sharing(dev)["saved"],
            }
            for dev in server.devices
        ],
        "totals": {
            "connections_open": len(stats.open),
            "connections_accepted": stats.accepted,
            "connections_refused": dict(stats.refused),
            "bytes_in": stats.bytes_in,
            "bytes_out": stats.bytes_out,
            "graphs": stats.graphs,
            "recomputes": stats.recomputes,
        },
        "cache": None
        if cache is None
        else {
            "directory": str(cache.directory),
            "max_bytes": cache.max_bytes,
            "hits": cache.hits,
            "misses": cache.misses,
            "bytes_written": cache.bytes_written,
            "evictions": cache.evictions,
        },
        "model_dirs": server.models.snapshot() if server.models else None,
        "clients": [conn.snapshot() for conn in stats.open.values()],
    }


class MetricsServer:
    """The HTTP endpoint; `start` binds it, `close` stops it."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ServerCollector(server))
        self._listener: asyncio.Server | None = None

    @classmethod
    async def start(cls, server: Server, host: str, port: int) -> MetricsServer:
        self = cls(server)
        profile.collect()  # kernel seconds by op: timed from the first plan on
        self._listener = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        log.info("metrics on http://%s:%d/metrics and /status", host, self.port)
        return self

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
            await self._listener.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            if peer is None or not allowed(peer[0], self.server.allow):
                self.server.stats.refuse("allowlist")
                log.warning("%s:%s: metrics request refused: not in the allowlist", *peer[:2])
                return
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            status, ctype, body = self._route(head[:MAX_REQUEST])
            writer.write(
                f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        except ConnectionError:
            pass
        finally:
            writer.close()

    def _route(self, head: bytes) -> tuple[str, str, bytes]:
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) < 2 or parts[0] not in (b"GET", b"HEAD"):
            return "405 Method Not Allowed", "text/plain", b"GET only\n"
        path = parts[1].split(b"?", 1)[0]
        if path == b"/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self.registry)
        if path == b"/status":
            body = json.dumps(status_snapshot(self.server), indent=1).encode()
            return "200 OK", "application/json", body
        return "404 Not Found", "text/plain", b"try /metrics or /status\n"
