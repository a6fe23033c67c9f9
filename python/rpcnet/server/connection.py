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
from rpcnet.server.session import SIMPLE_HANDLERS, ProtocolViolation, Session
from rpcnet.server.stream import ConnectionClosed, StreamProtocol

if TYPE_CHECKING:
    from rpcnet.server.app import Server

log = logging.getLogger("rpcnet.server")

_HEADER = struct.Struct("<BQ")
_SIZE = struct.Struct("<Q")
CLIENT_ERRORS = (ProtocolViolation, ComputeError, _native.NativeError)
LARGE_WRITE = 1 << 20


class Connection:
    def __init__(self, server: Server, stream: StreamProtocol, peer: str) -> None:
        self.server = server
        self.stream = stream
        self.peer = peer
        self.session = Session(server.config.proto, server.devices, server.cache)
        self.current = "HELLO"

    async def run(self) -> None:
        try:
            await self._serve()
        except ConnectionClosed:
            log.debug("%s: disconnected", self.peer)
        except CLIENT_ERRORS as exc:
            log.warning("%s: closing connection: %s: %s", self.peer, self.current, exc)
        except Exception:  # a bug of ours must still cost only this connection
            log.exception("%s: closing connection after internal error in %s", self.peer, self.current)
        finally:
            self.stream.close()
            await self._finish_graphs()
            released = self.session.close()
            log.debug("%s: released %d bytes", self.peer, released)

    async def _serve(self) -> None:
        proto = self.server.config.proto
        cmd, size = await self._header()
        if cmd != Cmd.HELLO:
            raise ProtocolViolation(f"first command must be HELLO, got {_native.command_name(proto, cmd)}")
        _native.check_header(proto, cmd, size, self.server.config.max_data, self.server.config.max_graph)
        self._respond(self.session.hello(await self.stream.readexactly(size)))
        while True:
            if await self.stream.at_eof():
                return
            cmd, size = await self._header()
            self.current = _native.command_name(proto, cmd)
            _native.check_header(proto, cmd, size, self.server.config.max_data, self.server.config.max_graph)
            if cmd == Cmd.HELLO:
                raise ProtocolViolation("HELLO is only allowed as the first command")
            if cmd in WAITS_FOR_GRAPH:
                await self._wait_graphs()
            if cmd == Cmd.SET_TENSOR:
                await self._set_tensor(size)
            elif cmd == Cmd.SET_TENSOR_HASH:
                payload = await self.stream.readexactly(size)
                self._respond(await asyncio.to_thread(self.session.set_tensor_hash, payload))
            else:
                payload = await self.stream.readexactly(size)
                self._respond(SIMPLE_HANDLERS[Cmd(cmd)](self.session, payload))
                await self.stream.drain()

    async def _header(self) -> tuple[int, int]:
        return _HEADER.unpack(await self.stream.readexactly(HEADER_SIZE))

    def _respond(self, payload: object) -> None:
        if payload is None:
            return
        # Copy device memory out: the transport may hold on to the object after write() returns,
        # and a later graph could overwrite those bytes before they are sent.
        data = payload if isinstance(payload, bytes) else bytes(payload)  # type: ignore[call-overload]
        header = _SIZE.pack(len(data))
        if len(data) < LARGE_WRITE:
            self.stream.write(header + data)
        else:
            self.stream.write(header)
            self.stream.write(data)

    async def _set_tensor(self, size: int) -> None:
        prefix = await self.stream.readexactly(msg.SET_TENSOR_HEADER)
        target = self.session.begin_set_tensor(prefix, size - msg.SET_TENSOR_HEADER)
        await self.stream.readinto(target.view)  # straight into device memory
        if target.cache:
            await asyncio.to_thread(self.session.cache_store, target.view)

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
