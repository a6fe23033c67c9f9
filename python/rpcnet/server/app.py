"""Server assembly: configuration, devices, the listener and the connection tasks."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from dataclasses import dataclass
from pathlib import Path

from rpcnet.compute.device import Device, cpu_device
from rpcnet.protocol.commands import DEFAULT_PROTOCOL
from rpcnet.server.cache import BackgroundWriter, HashCache
from rpcnet.server.connection import Connection
from rpcnet.server.stream import StreamProtocol

log = logging.getLogger("rpcnet.server")


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50052
    proto: int = DEFAULT_PROTOCOL
    device: str = "cpu"
    mem: int | None = None  # device capacity to report; default physical RAM
    threads: int | None = None
    cache_dir: Path | None = None
    cache_max: int | None = None
    max_data: int = 1 << 40  # SET_TENSOR payloads are also bounded by their buffer
    max_graph: int = 256 << 20


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def make_devices(config: ServerConfig) -> list[Device]:
    if config.device != "cpu":
        raise ValueError(f"unknown device {config.device!r} (available: cpu)")
    return [cpu_device(0, capacity=config.mem, threads=config.threads)]


class Server:
    def __init__(self, config: ServerConfig, devices: list[Device] | None = None) -> None:
        self.config = config
        self.devices = devices if devices is not None else make_devices(config)
        self.cache = HashCache(config.cache_dir, config.cache_max) if config.cache_dir else None
        self.cache_writer = BackgroundWriter(self.cache) if self.cache is not None else None
        self.connections: set[asyncio.Task[None]] = set()
        self._server: asyncio.AbstractServer | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self) -> None:
        if not is_loopback(self.config.host):
            log.warning(
                "binding %s: the ggml RPC protocol has no authentication or encryption; "
                "anyone who can reach this port can read and write its memory",
                self.config.host,
            )
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._protocol_factory,
            self.config.host,
            self.config.port,
            reuse_address=True,
            backlog=128,
        )

    def _protocol_factory(self) -> StreamProtocol:
        stream = _AcceptingStream(self)
        return stream

    def _accepted(self, stream: StreamProtocol) -> None:
        transport = stream.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            import socket

            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        name = f"{peer[0]}:{peer[1]}" if peer else "?"
        log.debug("%s: connected", name)
        task = asyncio.get_running_loop().create_task(Connection(self, stream, name).run())
        self.connections.add(task)
        task.add_done_callback(self.connections.discard)

    async def serve_forever(self) -> None:
        assert self._server is not None
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        await stop.wait()
        log.info("shutting down")
        await self.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.gather(*self.connections, return_exceptions=True)
        for device in self.devices:
            device.shutdown()
        if self.cache_writer is not None:
            self.cache_writer.shutdown()


class _AcceptingStream(StreamProtocol):
    def __init__(self, server: Server) -> None:
        super().__init__()
        self._owner = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._owner._accepted(self)


def install_event_loop_policy() -> str:
    """uvloop when available (the default), plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def run(config: ServerConfig) -> None:
    loop_name = install_event_loop_policy()

    async def main() -> None:
        server = Server(config)
        await server.start()
        dev = server.devices
        log.info(
            "rpcnet serving ggml RPC v%d.0.0 on %s:%d (%s), devices: %s, cache: %s",
            config.proto,
            config.host,
            server.port,
            loop_name,
            ", ".join(f"{d.name} ({d.memory.capacity >> 20} MiB)" for d in dev),
            config.cache_dir or "off",
        )
        await server.serve_forever()

    asyncio.run(main())
