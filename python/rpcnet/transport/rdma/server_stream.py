"""The asyncio server's side of a connection upgraded to RDMA: a `ByteStream` over `RdmaTransport`.

Verbs work runs on one thread per connection, in order; the TCP stream stays open as the liveness
signal (and as the fallback when the client stayed on TCP).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rpcnet.transport.base import ByteStream, ConnectionClosed, TransportClosed, TransportError
from rpcnet.transport.rdma.channel import RdmaTransport

log = logging.getLogger("rpcnet.transport")

_SIZE = struct.Struct("<Q")


class ResponseFramer:
    """Cuts the server's outgoing bytes into the reference's `send_data()` units.

    A reference RDMA receiver reads a response as `recv_data(&size, 8)` then
    `recv_data(payload, size)` and consumes whole messages, so the 8-byte size and the payload
    must be separate messages even when the connection layer writes them as one buffer.
    """

    def __init__(self) -> None:
        self._header = bytearray()
        self._remaining = 0

    def split(self, data: memoryview) -> list[memoryview | bytes]:
        pieces: list[memoryview | bytes] = []
        while data.nbytes:
            if self._remaining == 0:
                take = min(_SIZE.size - len(self._header), data.nbytes)
                self._header += data[:take]
                data = data[take:]
                if len(self._header) == _SIZE.size:
                    pieces.append(bytes(self._header))
                    (self._remaining,) = _SIZE.unpack(self._header)
                    self._header = bytearray()
            else:
                take = min(self._remaining, data.nbytes)
                pieces.append(data[:take])
                self._remaining -= take
                data = data[take:]
        return pieces


class RdmaServerStream:
    """What `rpcnet.server.connection.Connection` sees once its connection moved to RDMA.

    A `ByteStream`, like the TCP `StreamProtocol` (staged, consume, write_ready and fast_path only
    matter after a fallback). Verbs work runs on one
    thread per connection, in order. The TCP stream stays open as the liveness signal: its EOF
    ends the connection; bytes on it before any RDMA data mean the client stayed on TCP (its
    activation failed after we answered), and the connection falls back to TCP.
    """

    def __init__(self, link: RdmaTransport, tcp: ByteStream, peer: str) -> None:
        self.link = link
        self.tcp = tcp
        self.peer = peer
        self.fast_path: Callable[[], None] | None = None
        self._loop = asyncio.get_running_loop()
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rpcnet-rdma")
        self._framer = ResponseFramer()
        self._last_write: asyncio.Future[None] | None = None
        self._write_error: BaseException | None = None
        self._fallback: ByteStream | None = None
        self._used = False  # RDMA data has arrived
        self._closed = False
        self._tcp_watch = self._loop.create_task(tcp.at_eof())
        self._tcp_watch.add_done_callback(self._tcp_done)

    def _tcp_done(self, task: asyncio.Task[bool]) -> None:
        if task.cancelled() or task.exception() is not None or task.result():
            self.link.stop.set()  # the client is gone: end any RDMA wait

    def _tcp_eof(self) -> bool:
        t = self._tcp_watch
        return t.cancelled() or t.exception() is not None or bool(t.result())

    def _run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        return self._loop.run_in_executor(self._exec, fn, *args)

    def _closed_by(self, exc: BaseException) -> BaseException:
        """The connection layer's ConnectionClosed for a transport error (others unchanged)."""
        if isinstance(exc, TransportClosed):
            return ConnectionClosed(str(exc))
        if isinstance(exc, TransportError):
            log.warning("%s: RDMA transport failed: %s", self.peer, exc)
            return ConnectionClosed(f"RDMA: {exc}")
        return exc

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await self._run(fn, *args)
        except TransportError as exc:
            raise self._closed_by(exc) from exc

    # ------------------------------------------------------------ reading

    async def at_eof(self) -> bool:
        if self._fallback is not None:
            return await self._fallback.at_eof()
        if self.link.has_data():
            return False
        waiter = self._run(self.link.wait_readable)
        await asyncio.wait({waiter, self._tcp_watch}, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done() and waiter.exception() is None and waiter.result():
            self._used = True
            return False
        exc = waiter.exception() if waiter.done() else None
        if exc is not None:
            raise self._closed_by(exc) from exc
        if not self._tcp_watch.done():  # stopped by close()
            return True
        self.link.stop.set()
        await asyncio.wait({waiter})
        if self._tcp_eof():
            return True
        if self._used:
            log.warning("%s: closing: data on the TCP socket after the RDMA upgrade", self.peer)
            raise ConnectionClosed("data on the TCP socket after the RDMA upgrade")
        log.warning(
            "%s: transport TCP: the client stayed on TCP after both sides offered RDMA "
            "(its activation failed); falling back to TCP",
            self.peer,
        )
        self._exec.submit(self.link.close)
        self._fallback = self.tcp
        self.tcp.fast_path = self.fast_path
        return await self.tcp.at_eof()

    async def readexactly(self, n: int) -> bytes:
        if self._fallback is not None:
            return await self._fallback.readexactly(n)
        return await self._io(self.link.recv, n)

    async def readinto(self, dest: Any) -> None:
        if self._fallback is not None:
            return await self._fallback.readinto(dest)
        await self._io(self.link.recv_into, dest)

    def staged(self) -> memoryview:
        return self._fallback.staged() if self._fallback is not None else memoryview(b"")

    def consume(self, n: int) -> None:
        if self._fallback is not None:
            self._fallback.consume(n)

    def receive_into(self, dest: Any, on_filled: Callable[[], None]) -> bool:
        if self._fallback is None:  # the fast path only runs on staged bytes: none here
            raise RuntimeError("no fast-path receive on RDMA")
        return self._fallback.receive_into(dest, on_filled)

    @property
    def write_ready(self) -> bool:
        return self._fallback is not None and self._fallback.write_ready

    # ------------------------------------------------------------ writing

    def _send_all(self, pieces: list[Any]) -> None:
        if self._write_error is not None:
            return
        try:
            for piece in pieces:
                self.link.send(piece)
        except BaseException as exc:  # reported by drain()
            self._write_error = exc

    def write(self, data: Any) -> None:
        if self._fallback is not None:
            self._fallback.write(data)
            return
        pieces = self._framer.split(memoryview(data).cast("B"))
        if pieces:
            self._last_write = self._run(self._send_all, pieces)

    def writelines(self, parts: list[Any]) -> None:
        for part in parts:
            self.write(part)

    async def drain(self) -> None:
        if self._fallback is not None:
            await self._fallback.drain()
            return
        if self._last_write is not None and not self._last_write.done():
            await self._last_write
        if self._write_error is not None:
            exc = self._write_error
            raise self._closed_by(exc) from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.link.stop.set()
        if not self._tcp_watch.done():
            self._tcp_watch.cancel()
        self._exec.submit(self.link.close)  # after whatever the thread is finishing
        self._exec.shutdown(wait=False)
        self.tcp.close()
