"""A BufferedProtocol stream: `readinto(view)` lets large payloads land directly in device memory.

The event loop asks `get_buffer()` where to put incoming bytes. While a coroutine waits in
`readinto`, that is the caller's destination itself (no intermediate copy); otherwise bytes go
to a small staging area, and reading pauses once it is full. Over TLS the transport is
`rpcnet.transport.tlssocket`'s: OpenSSL decrypts from the socket into those same buffers.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any

from rpcnet._native import MAX_CHUNK, chunk_plan
from rpcnet.transport.base import ConnectionClosed
from rpcnet.transport.tlssocket import TlsSocketTransport

STAGING = 256 * 1024
FIRST_READ = 16 * 1024


class StreamProtocol(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._staging = bytearray(STAGING)
        self._staged = memoryview(self._staging)
        self._start = 0  # unread staged bytes are _staging[_start:_end]
        self._end = 0
        self._target: memoryview | None = None  # destination of an active readinto
        self._filled = 0
        self._on_filled: Callable[[], None] | None = None  # completion of a fast-path receive
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._error: BaseException | None = None
        self._paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._write_paused = False
        # Optional callback run while the reader waits at a frame boundary: it may consume
        # complete frames straight from the staging area (no task switch per small command).
        self.fast_path: Callable[[], None] | None = None
        self._at_boundary = False
        self._fast_error: Exception | None = None
        self._tls: TlsSocketTransport | None = None  # begin_tls .. finish_tls

    # ------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transport is not an asyncio.Transport subclass, but has its methods.
        self.transport = transport  # type: ignore[assignment]
        # Pause as soon as anything is buffered: drain() then means "fully handed to the kernel".
        transport.set_write_buffer_limits(high=0, low=0)  # type: ignore[attr-defined]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._target is not None:
            # No single recv larger than 1 GiB, like the reference transport.
            return self._target[self._filled : self._filled + MAX_CHUNK]
        if self._start == self._end:
            self._start = self._end = 0
            # A frame starts here: read a little first, so that a large payload is copied out
            # of staging only for its first bytes and lands directly in its destination after.
            return self._staged[:FIRST_READ]
        if self._end == STAGING:  # compact so the free space is contiguous
            n = self._end - self._start
            self._staging[:n] = self._staging[self._start : self._end]
            self._start, self._end = 0, n
        return self._staged[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._target is not None:
            self._filled += nbytes
            if self._filled == len(self._target):
                self._target = None  # later bytes belong to the next request: stage them
                done, self._on_filled = self._on_filled, None
                if done is None:
                    self._wake()
                    return
                try:
                    done()
                except Exception as exc:  # handed to the waiting coroutine, which closes
                    self._fast_error = exc
                    self._wake()
            return
        self._end += nbytes
        if self._end == STAGING and self._start == 0 and not self._paused:
            self._paused = True
            self.transport.pause_reading()  # type: ignore[union-attr]
        if self._at_boundary and self.fast_path is not None:
            try:
                self.fast_path()
            except Exception as exc:  # handed to the waiting coroutine, which closes
                self._fast_error = exc
        if self._start != self._end or self._fast_error is not None:
            self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake()
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(ConnectionClosed("connection lost while writing"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    def begin_tls(self, context: ssl.SSLContext, timeout: float) -> None:
        """Put TLS (server side) under this protocol; call from `connection_made`.

        It must happen there, before the event loop starts reading: bytes of the client's
        handshake must never reach this protocol's staging. The handshake starts now, with
        `timeout` seconds to finish; `finish_tls` waits for it. Afterwards the same stream reads
        and writes plaintext, decrypted straight into `readinto` destinations.
        """
        transport = self.transport
        assert transport is not None
        self._tls = TlsSocketTransport.accept(transport, context, self, timeout)
        self.transport = self._tls

    async def finish_tls(self) -> None:
        """Wait for the handshake `begin_tls` started; raises what made it fail
        (`TlsHandshakeTimeout` past the deadline, `ssl.SSLError`, `OSError`)."""
        assert self._tls is not None
        tls, self._tls = self._tls, None
        try:
            await tls.handshake
        except BaseException:
            tls.abort()
            raise
        # Paused while any byte is not yet encrypted into the socket: drain() then means "the
        # response no longer references device memory" (the transport holds views, not copies).
        tls.set_write_buffer_limits(high=1, low=0)

    def abort(self) -> None:
        """Close at once, dropping unsent bytes."""
        self._target = self._on_filled = None
        if self.transport is not None:
            self.transport.abort()

    # ------------------------------------------------------------ reading

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def _wait(self) -> None:
        if self._eof:
            raise ConnectionClosed(
                "peer closed the connection" if self._error is None else str(self._error)
            )
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _take_staged(self, dest: memoryview) -> int:
        n = min(len(dest), self._end - self._start)
        if n:
            dest[:n] = self._staged[self._start : self._start + n]
            self._consume(n)
        return n

    def _consume(self, n: int) -> None:
        self._start += n
        if self._paused and self._end - self._start < STAGING:
            self._paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]

    def receive_into(self, dest: Any, on_filled: Callable[[], None]) -> bool:
        """From the fast path: fill `dest` from the staged bytes, then straight from the socket.

        True when it is already full (the caller completes now); otherwise `on_filled` runs
        from the protocol callback once it is, with no task switch.
        """
        view = memoryview(dest).cast("B")
        got = self._take_staged(view)
        if got == len(view):
            return True
        self._target, self._filled, self._on_filled = view, got, on_filled
        return False

    @property
    def receiving(self) -> bool:
        """A fast-path receive is in progress (the frame loop must not start a new frame)."""
        return self._on_filled is not None

    async def readinto(self, dest: Any) -> None:
        """Fill `dest` (any writable buffer) completely, or raise ConnectionClosed."""
        view = memoryview(dest).cast("B")
        got = self._take_staged(view)
        if got == len(view):
            return
        self._target, self._filled = view, got
        try:
            while self._target is not None:
                await self._wait()
        finally:
            self._target = None

    async def readexactly(self, n: int) -> bytes:
        if n <= self._end - self._start:
            data = bytes(self._staged[self._start : self._start + n])
            self._consume(n)
            return data
        out = bytearray(n)
        await self.readinto(out)
        return bytes(out)

    async def at_eof(self) -> bool:
        """Wait until at least one byte is available; True if the peer closed cleanly instead.

        Raises what the fast path raised, if it failed on a frame.
        """
        self._at_boundary = True
        try:
            while self._start == self._end and self._fast_error is None:
                if self._eof:
                    return True
                await self._wait()
        finally:
            self._at_boundary = False
        if self._fast_error is not None:
            raise self._fast_error
        return False

    def staged(self) -> memoryview:
        """The unread staged bytes (valid until the next consume or read)."""
        return self._staged[self._start : self._end]

    def consume(self, n: int) -> None:
        self._consume(n)

    @property
    def write_ready(self) -> bool:
        return not self._write_paused

    # ------------------------------------------------------------ writing

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes <= MAX_CHUNK:
            self.transport.write(view)  # type: ignore[union-attr]
            return
        for offset, length in chunk_plan(view.nbytes, MAX_CHUNK):
            self.transport.write(view[offset : offset + length])  # type: ignore[union-attr]

    def writelines(self, parts: list[Any]) -> None:
        views = [memoryview(part).cast("B") for part in parts]
        if any(view.nbytes > MAX_CHUNK for view in views):
            for view in views:
                self.write(view)
            return
        self.transport.writelines(views)  # type: ignore[union-attr]  # one gathered send

    async def drain(self) -> None:
        if self._eof and self._error is not None:
            raise ConnectionClosed(str(self._error))
        if not self._write_paused:
            return
        self._drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None

    def close(self) -> None:
        self._target = self._on_filled = None  # drop the view of device memory
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
