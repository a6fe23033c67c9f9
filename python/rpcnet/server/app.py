"""Server assembly: configuration, devices, the listener and the connection tasks."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import ssl
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from rpcnet.compute.device import Device, cpu_device
from rpcnet.compute.trim import release_free_memory
from rpcnet.server.access import EVERYONE, AddressQuota, allowed, default_allow, is_loopback
from rpcnet.server.cache import HashCache
from rpcnet.server.comm import CommHub
from rpcnet.server.config import ServerConfig, size_bytes
from rpcnet.server.connection import Connection
from rpcnet.server.modeldir import ModelDirs, weight_sources
from rpcnet.server.namespaces import Namespaces, TenantCache
from rpcnet.server.peertls import PeerSecurity
from rpcnet.server.stats import ServerStats
from rpcnet.server.stream import StreamProtocol
from rpcnet.server.tenants import Tenants
from rpcnet.transport import tls as tlsmod
from rpcnet.transport.negotiate import ServerNegotiation

if TYPE_CHECKING:  # imported with --metrics only: prometheus_client costs ~2.4 MB resident
    from rpcnet.server.metrics import MetricsServer

log = logging.getLogger("rpcnet.server")
T = TypeVar("T")


def make_devices(config: ServerConfig) -> list[Device]:
    if config.device != "cpu":
        from rpcnet.compute.cuda.serve import make_cuda_devices  # one line if CuPy/GPU missing

        return make_cuda_devices(config.device, config.mem, config.threads, config.max_scratch)
    return [
        cpu_device(0, capacity=config.mem, threads=config.threads, max_scratch=config.max_scratch)
    ]


class Server:
    def __init__(self, config: ServerConfig, devices: list[Device] | None = None) -> None:
        self.config = config
        self.devices = devices if devices is not None else make_devices(config)
        self.stats = ServerStats(config.proto)  # rpcnet.server.metrics reads it
        for device in self.devices:  # each graph's wait for its turn on the device
            device.wait_observer = self.stats.graph_waited
        self.per_addr = AddressQuota(config.max_clients_per_addr)
        self.models = ModelDirs.open(config.model_dirs)  # --model-dir: weights from local GGUFs
        self.tls, self.fingerprint = make_tls(config)  # --tls-*: TLS 1.3 before anything else
        self.tenants = Tenants(config.tokens, size_bytes) if config.tokens else None
        self.secure = self.tls is not None and self.tenants is not None
        root = open_cache(config)
        self.cache = weight_sources(root, self.models)
        # --tokens with --cache: each tenant's uploads in its own namespace (server/namespaces.py)
        self.namespaces = (
            Namespaces(root.directory, config.cache_max, config.cache_shared, self.models)
            if root is not None and self.tenants is not None
            else None
        )
        self.metrics: MetricsServer | None = None
        # TLS and tokens authenticate: then, without --allow, every address may try.
        self.allow = (
            EVERYONE
            if self.secure and config.allow is None
            else default_allow(config.host, config.allow)
        )
        self.negotiation = ServerNegotiation.from_env()  # HELLO caps: RDMA via pyverbs, or TCP
        # Peer links (spec §11): rank 0 listens on our own host, admits only allowed peers;
        # TLS with the tenant's token on a TLS server (server/peertls.py).
        self.comm = CommHub(config.host, config.comm_timeout, self.allow, make_peer_security(self))
        self.connections: dict[asyncio.Task[None], Connection] = {}
        self._addresses: dict[asyncio.Task[None], str] = {}  # each connection's client address
        self.draining = False
        self._server: asyncio.Server | None = None
        self._poll: asyncio.Task[None] | None = None

    def cache_for(self, tenant: str | None) -> TenantCache | None:
        """The cache a tenant's SET_TENSOR_HASH and uploads use (its namespace, `--tokens`)."""
        if self.namespaces is None or tenant is None:
            return self.cache
        return self.namespaces.for_tenant(tenant)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        if not is_loopback(self.config.host) and not self.secure:
            log.warning(
                "binding %s: the ggml RPC protocol has no authentication or encryption; "
                "anyone allowed to reach this port can read and write its memory",
                self.config.host,
            )
        if self.config.metrics is not None:
            # imported before the port opens: once it accepts, /metrics answers too
            from rpcnet.server.metrics import MetricsServer
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol_factory,
            self.config.host,
            self.config.port,
            reuse_address=True,
            backlog=128,
        )
        if self.config.metrics is not None:
            self.metrics = await MetricsServer.start(self, *self.config.metrics)
        self.models.start()
        if self.tenants is not None:
            self._poll = loop.create_task(self._watch_tokens(self.tenants))

    async def _watch_tokens(self, tenants: Tenants) -> None:
        """Reload the tokens file when it changes; close connections whose token is gone."""
        while True:
            await asyncio.sleep(self.config.tokens_poll)
            if not tenants.poll():
                continue
            for conn in list(self.connections.values()):
                if conn.tenant is not None and not tenants.valid(conn.tenant):
                    conn.revoke(f"tenant {conn.tenant.name}'s token is no longer in --tokens")

    def _protocol_factory(self) -> StreamProtocol:
        stream = _AcceptingStream(self)
        return stream

    def _accepted(self, stream: StreamProtocol) -> None:
        transport = stream.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        name = f"{peer[0]}:{peer[1]}" if peer else "?"
        if peer is None or not allowed(peer[0], self.allow):
            log.warning("%s: refused: address not in the allowlist", name)
            self.stats.refuse("allowlist")
            transport.abort()
            return
        if self.draining or len(self.connections) >= self.config.max_clients:
            why = "shutting down" if self.draining else f"{self.config.max_clients} clients"
            log.warning("%s: refused: %s", name, why)
            self.stats.refuse("draining" if self.draining else "max_clients")
            transport.abort()
            return
        if not self.per_addr.admit(peer[0]):
            limit = self.config.max_clients_per_addr
            log.warning("%s: refused: %s connections from %s already", name, limit, peer[0])
            self.stats.refuse("max_clients_per_addr")
            transport.abort()
            return
        if self.tls is not None:  # TLS under the stream before any byte is read
            stream.begin_tls(self.tls, self.config.hello_timeout)
        log.debug("%s: connected", name)
        conn = Connection(self, stream, name)
        task = asyncio.get_running_loop().create_task(conn.run())
        self.connections[task] = conn
        self._addresses[task] = peer[0]
        task.add_done_callback(self._connection_done)

    def _connection_done(self, task: asyncio.Task[None]) -> None:
        self.connections.pop(task, None)
        self.per_addr.release(self._addresses.pop(task, ""))
        if not self.connections:  # the last client left: give its memory back to the OS
            asyncio.get_running_loop().run_in_executor(None, release_free_memory)

    async def serve_forever(self) -> None:
        assert self._server is not None
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(sig: signal.Signals) -> None:
            if stop.is_set():  # a second SIGINT/SIGTERM: leave now
                log.warning("second %s: exiting immediately", sig.name)
                os._exit(130)
            log.info("%s: draining (send it again to exit immediately)", sig.name)
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal, sig)
            except (NotImplementedError, RuntimeError):
                pass
        await stop.wait()
        await self.close()

    async def close(self) -> None:
        """Stop accepting, let every connection finish its current command, free everything."""
        self.draining = True
        if self._poll is not None:
            self._poll.cancel()
        if self._server is not None:
            self._server.close()
        if self.metrics is not None:
            await self.metrics.close()
        self.models.close()
        for conn in list(self.connections.values()):
            conn.stop_after_command()
        if self.connections:
            _, late = await asyncio.wait(list(self.connections), timeout=self.config.drain_timeout)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        if self._server is not None:
            await self._server.wait_closed()
        for device in self.devices:
            device.shutdown()


def make_tls(config: ServerConfig) -> tuple[ssl.SSLContext | None, str | None]:
    """The server's TLS context and certificate fingerprint (None, None without TLS)."""
    if config.tls_self_signed:
        cert, key = tlsmod.self_signed(hosts=(config.host,))
    elif config.tls_cert is not None:
        cert, key = config.tls_cert, config.tls_key or config.tls_cert
    else:
        return None, None
    return tlsmod.server_context(cert, key), tlsmod.cert_fingerprint(cert)


def make_peer_security(server: Server) -> PeerSecurity | None:
    """How a TLS server's peer links are secured (None without TLS)."""
    config = server.config
    if server.tls is None or server.fingerprint is None:
        return None
    pins = tuple(tlsmod.parse_fingerprint(p) for p in config.peer_fingerprints)
    return PeerSecurity(server.tls, server.fingerprint, config.peer_ca, pins, server.tenants)


def open_cache(config: ServerConfig) -> HashCache | None:
    if config.cache_dir is None:
        return None
    try:
        return HashCache(config.cache_dir, config.cache_max)
    except OSError as exc:
        log.warning(
            "cache directory %s unusable (%s): serving without a cache", config.cache_dir, exc
        )
        return None


class _AcceptingStream(StreamProtocol):
    def __init__(self, server: Server) -> None:
        super().__init__()
        self._owner = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._owner._accepted(self)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run `main` on a new uvloop event loop when uvloop is installed (the default), else on a
    plain asyncio one. Only this loop is affected: no global event-loop policy is set."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def freeze_startup_objects() -> None:
    """Move everything made at start-up (modules, numpy, the devices: ~10^5 objects) out of
    the garbage collector's reach. Its full collections walk every tracked object; a large
    upload or a decode step triggers several, and they cost ~10% of a TLS upload's CPU."""
    gc.collect()
    gc.freeze()


def event_loop_name() -> str:
    """The running loop's kind: "uvloop" or "asyncio"."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.split(".")[0] == "uvloop" else "asyncio"


def run(config: ServerConfig) -> None:
    async def main() -> None:
        server = Server(config)
        await server.start()
        freeze_startup_objects()
        dev = server.devices
        log.info(
            "rpcnet serving ggml RPC v%d.0.0 on %s:%d (%s), devices: %s, cache: %s, model dirs: %s",
            config.proto,
            config.host,
            server.port,
            event_loop_name(),
            ", ".join(f"{d.name} ({d.memory.capacity >> 20} MiB)" for d in dev),
            config.cache_dir or "off",
            ", ".join(map(str, config.model_dirs)) or "none",
        )
        if server.fingerprint is not None:
            log.info(
                "TLS 1.3; certificate SHA-256 fingerprint %s", tlsmod.colon_hex(server.fingerprint)
            )
        if server.tenants is not None:
            log.info("tokens: %d tenants from %s", len(server.tenants.table), config.tokens)
        await server.serve_forever()

    run_loop(main())
