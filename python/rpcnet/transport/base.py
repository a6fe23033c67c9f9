"""The transport interface: moves the bytes of one connection and nothing else (it never parses).

A transport mirrors the reference's `socket_t` (spec §1.2, §12): `send` is one `send_data()` call,
`recv_into` one `recv_data()`, `flush` the message-boundary hook. On TCP the call granularity is
invisible; on the Linux RDMA transport one `send` becomes one or more SEND messages of at most
256 KiB that end exactly where the call ends, and a reference receiver relies on that.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


class ConnectionClosed(Exception):
    """The peer closed (or reset) the connection: what the server's streams raise to its
    connection task (TCP's asyncio stream and the RDMA server stream alike)."""


class TransportError(ConnectionError):
    """The transport failed (completion error, protocol misuse); the connection is unusable."""


class TransportClosed(TransportError):
    """The peer went away, or this side closed the transport while an operation waited."""


class Transport(abc.ABC):
    """One connection's byte channel. Blocking; not thread-safe (one thread drives it)."""

    name: str = "?"

    @abc.abstractmethod
    def send(self, data: Any) -> None:
        """Send every byte of `data` (any buffer). One call is one reference `send_data()`."""

    @abc.abstractmethod
    def recv_into(self, dest: Any) -> None:
        """Fill the writable buffer `dest` completely, or raise TransportError/TransportClosed."""

    def recv(self, n: int) -> bytes:
        buf = bytearray(n)
        if n:
            self.recv_into(buf)
        return bytes(buf)

    def flush(self) -> None:  # noqa: B027 - deliberately a no-op by default
        """End of a message. A no-op on TCP and on the Linux RDMA transport (spec §1.2)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release everything; idempotent."""

    def describe(self) -> str:
        return self.name

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@runtime_checkable
class ByteStream(Protocol):
    """The asyncio server's view of one connection's bytes, whatever carries them.

    `rpcnet.server.stream.StreamProtocol` (TCP) and `rpcnet.transport.rdma.RdmaServerStream`
    satisfy it; the connection task is written against this and nothing else. Reads raise
    `ConnectionClosed` when the peer goes away; `drain()` returns once every written byte left.
    """

    # Run at a frame boundary while the reader waits; it may consume complete frames from
    # `staged()` (a no-op where nothing is staged, as on RDMA).
    fast_path: Callable[[], None] | None

    async def at_eof(self) -> bool:
        """Wait for the next byte; True when the peer closed cleanly instead."""
        ...

    async def readexactly(self, n: int) -> bytes: ...

    async def readinto(self, dest: Any) -> None:
        """Fill the writable buffer `dest` completely (straight into it where possible)."""
        ...

    def staged(self) -> memoryview:
        """Bytes already received and not yet consumed (may be empty)."""
        ...

    def consume(self, n: int) -> None: ...

    @property
    def write_ready(self) -> bool:
        """True while a write would not have to wait."""
        ...

    def write(self, data: Any) -> None: ...

    def writelines(self, parts: list[Any]) -> None:
        """Write `parts` in order (one gathered send where the transport can)."""
        ...

    def receive_into(self, dest: Any, on_filled: Callable[[], None]) -> bool:
        """From the fast path: fill `dest` from `staged()` and then the wire. True when full
        now; otherwise `on_filled` runs once it is."""
        ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...
