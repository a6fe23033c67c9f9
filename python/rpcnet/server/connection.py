"""The per-connection task: reads frames, runs them through the session, writes responses.

Only byte movement and ordering live here. Every client error ends in one log line naming the
client, command and reason, and the session is freed; other connections never notice.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING

from rpcnet import _native
from rpcnet.compute.errors import ComputeError
from rpcnet.protocol import messages as msg
from rpcnet.protocol.commands import HEADER_SIZE, WAITS_FOR_GRAPH, Cmd
from rpcnet.server.session import SIMPLE_HANDLERS, ProtocolViolation, Session, SessionLimits
from rpcnet.server.stream import ConnectionClosed, StreamProtocol

if TYPE_CHECKING:
    from rpcnet.server.app import Server

log = logging.getLogger("rpcnet.server")

_HEADER = struct.Struct("<BQ")
_SIZE = struct.Struct("<Q")
CLIENT_ERRORS = (ProtocolViolation, ComputeError, _native.NativeError)
LARGE_WRITE = 64 * 1024
HELLO, SET_TENSOR, SET_TENSOR_HASH = int(Cmd.HELLO), int(Cmd.SET_TENSOR), int(Cmd.SET_TENSOR_HASH)
COMM_INIT, COMM_ALLREDUCE = int(Cmd.COMM_INIT), int(Cmd.COMM_ALLREDUCE)


# By plain int: building an IntEnum per frame costs more than most handlers.
HANDLERS = {int(cmd): handler for cmd, handler in SIMPLE_HANDLERS.items()}
WAITS = frozenset(int(cmd) for cmd in WAITS_FOR_GRAPH)


class Connection:
    def __init__(self, server: Server, stream: StreamProtocol, peer: str) -> None:
        self.server = server
        self.stream = stream
        self.peer = peer
        config = server.config
        limits = SessionLimits(graph_nodes=config.max_graph_nodes, client_mem=config.client_mem)
        self.negotiation = server.negotiation.connection(stream, peer)  # HELLO caps, spec §12
        self.session = Session(
            config.proto, server.devices, server.cache, limits, caps=self.negotiation
        )
        self.stats = server.stats.open_connection(peer, self.session)  # metrics, close log
        self.cmd = int(Cmd.HELLO)
        self._task: asyncio.Task[None] | None = None
        self._idle = False  # waiting for the next frame: safe to cancel
        self._stopping = False

    @property
    def current(self) -> str:
        return _native.command_name(self.server.config.proto, self.cmd)

    def stop_after_command(self) -> None:
        """Server drain: finish the command in progress (if any), then close."""
        self._stopping = True
        if self._idle and self._task is not None:
            self._task.cancel()

    async def run(self) -> None:
        self._task = asyncio.current_task()
        try:
            await self._serve()
        except ConnectionClosed:
            log.debug("%s: disconnected", self.peer)
        except asyncio.TimeoutError:
            log.warning(
                "%s: closing connection: no HELLO within %.0f s",
                self.peer,
                self.server.config.hello_timeout,
            )
        except CLIENT_ERRORS as exc:
            log.warning("%s: closing connection: %s: %s", self.peer, self.current, exc)
        except Exception:  # a bug of ours must still cost only this connection
            log.exception(
                "%s: closing connection after internal error in %s", self.peer, self.current
            )
        finally:
            self.stream.close()
            await self._finish_graphs()
            self.stats.close()
            released = self.session.close()
            log.debug("%s: released %d bytes", self.peer, released)

    async def _serve(self) -> None:
        config = self.server.config
        proto, max_data, max_graph = config.proto, config.max_data, config.max_graph
        stream, session = self.stream, self.session
        check_header = _native.check_header
        hello = await asyncio.wait_for(self._read_hello(), config.hello_timeout)
        self._respond(session.hello(hello))
        self.stats.end()
        stream = self.stream = await self.negotiation.after_hello(stream)  # RDMA or unchanged
        handlers, waits = HANDLERS, WAITS
        stream.fast_path = self._fast_path
        while True:
            self._idle = True
            try:
                if self._stopping or await stream.at_eof():
                    return
            finally:
                self._idle = False
            # Responses may reference device memory (GET_TENSOR): with a zero write high-water
            # mark, drain() returns only once every byte is with the kernel, so no later command
            # can change bytes still queued for sending.
            await stream.drain()
            cmd, size = await self._header()
            self.cmd = cmd
            check_header(proto, cmd, size, max_data, max_graph)
            if cmd == HELLO:
                raise ProtocolViolation("HELLO is only allowed as the first command")
            if cmd in waits:
                await self._wait_graphs()
            if cmd == SET_TENSOR:
                await self._set_tensor(size)
            elif cmd == SET_TENSOR_HASH:
                payload = await stream.readexactly(size)
                self._respond(await asyncio.to_thread(session.set_tensor_hash, payload))
            elif cmd == COMM_INIT:  # may wait for the peer server; other clients carry on
                payload = await stream.readexactly(size)
                self._respond(await session.comm_init(payload, self.server.comm))
            elif cmd == COMM_ALLREDUCE:  # this connection's graphs are done (WAITS_FOR_GRAPH)
                await session.comm_allreduce(await stream.readexactly(size))
            else:
                payload = await stream.readexactly(size)
                self._respond(handlers[cmd](session, payload))
            self.stats.end()

    async def _read_hello(self) -> bytes:
        config = self.server.config
        cmd, size = await self._header()
        if cmd != Cmd.HELLO:
            name = _native.command_name(config.proto, cmd)
            raise ProtocolViolation(f"first command must be HELLO, got {name}")
        _native.check_header(config.proto, cmd, size, config.max_data, config.max_graph)
        return await self.stream.readexactly(size)

    def _fast_path(self) -> None:
        """Handle complete, simple frames already staged, from the protocol callback.

        Same semantics as the coroutine loop; anything that must wait (payload not all here,
        SET_TENSOR's direct receive, cache I/O, an unfinished graph, a full socket) is left for it.
        """
        config, stream, session = self.server.config, self.stream, self.session
        while stream.write_ready:
            data = stream.staged()
            if len(data) < HEADER_SIZE:
                return
            cmd, size = _HEADER.unpack_from(data)
            handler = HANDLERS.get(cmd)
            if handler is None or len(data) - HEADER_SIZE < size:
                return
            if cmd in WAITS and session.has_pending():
                return
            self.cmd = cmd
            _native.check_header(config.proto, cmd, size, config.max_data, config.max_graph)
            payload = bytes(data[HEADER_SIZE : HEADER_SIZE + size])
            stream.consume(HEADER_SIZE + size)
            self.stats.begin(cmd, size)
            self._respond(handler(session, payload))
            self.stats.end()

    async def _header(self) -> tuple[int, int]:
        cmd, size = _HEADER.unpack(await self.stream.readexactly(HEADER_SIZE))
        self.stats.begin(cmd, size)
        return cmd, size

    def _respond(self, payload: object) -> None:
        if payload is None:
            return
        view = memoryview(payload)  # type: ignore[arg-type]
        self.stats.responded(view)
        header = _SIZE.pack(view.nbytes)
        if view.nbytes < LARGE_WRITE:
            self.stream.write(
                header + view.tobytes() if not isinstance(payload, bytes) else header + payload
            )
        else:
            self.stream.write(header)
            self.stream.write(view)  # zero-copy; see the drain() in _serve

    async def _set_tensor(self, size: int) -> None:
        prefix = await self.stream.readexactly(msg.SET_TENSOR_HEADER)
        target = self.session.begin_set_tensor(prefix, size - msg.SET_TENSOR_HEADER)
        await self.stream.readinto(target.view)  # straight into device memory
        cache = self.session.cache
        if target.cache and cache is not None and cache.writable:
            # Hash and store straight from device memory on a thread (GIL released while
            # hashing); this connection waits, so nothing can change those bytes meanwhile.
            await asyncio.to_thread(cache.store_hashed, target.view)

    async def _wait_graphs(self) -> None:
        for fut in self.session.take_pending():
            try:
                await asyncio.wrap_future(fut)
            except ComputeError:
                raise
            except Exception as exc:  # kernels failing on client data: close, do not crash
                raise ComputeError(f"graph execution failed: {type(exc).__name__}: {exc}") from exc

    async def _finish_graphs(self) -> None:
        # Memory a running plan still touches must outlive it; failures no longer matter.
        for fut in self.session.take_pending():
            try:
                await asyncio.wrap_future(fut)
            except Exception:
                pass
