"""One `rpcnet tunnel` connection: the client's plain TCP side and the server's TLS side.

The TLS side is an `ssl.SSLObject` over memory BIOs on a non-blocking socket watched by the event
loop (`add_reader` / `add_writer`), not a TLS transport: the socket is written and read in large
pieces (`SEND_PIECE` of plaintext encrypted at a time, reads of up to `READ_SIZE`), not a TLS
record (16 KiB) per syscall. On loopback the kernel's per-call and per-segment cost, more than
the cipher, is what an upload pays for; no Python `bytes` is made per record.

- client -> server: the plain side is a `BufferedProtocol` receiving into one buffer; what
  arrives goes through the `RequestScanner` and is encrypted from that buffer a piece at a time,
  each piece once the socket took the last. While any of it is not sent, the plain side stops
  reading: the tunnel holds the buffer and one piece of ciphertext per connection.
- server -> client: ciphertext is read when the socket is readable and decrypted into one reused
  buffer (up to `READ_BURST` bytes per turn), copied once per `READ_SIZE` to the plain
  transport; past its high-water mark, the TLS side stops reading.

Set-up (connect, handshake, verification, token) runs on a thread with a blocking socket and a
deadline (`open_tls`): a few per client, off the forwarding path.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rpcnet.server.tokens import ACCEPTED, ANSWER_HEAD, encode_request, parse_answer_head
from rpcnet.transport import tls as tlsmod
from rpcnet.transport.tlssocket import read_buffer
from rpcnet.tunnelwire import (
    HEADER,
    STATUS,
    Deferred,
    RequestScanner,
    parse_status,
    status_frame,
)

RECEIVE = 1 << 20  # the plain side's receive buffer
SEND_PIECE = 256 << 10  # plaintext encrypted at a time, sent before the next is encrypted
READ_SIZE = 256 << 10  # decrypted server bytes per copy to the client
READ_BURST = 4 << 20  # TLS bytes read per event-loop turn before other connections run
WRITE_HIGH = 4 << 20  # bytes queued for the client before the TLS side stops reading
JOIN_MAX = 256 << 10  # small parts sent together go out as one record and one segment
WOULD_BLOCK = (BlockingIOError, InterruptedError)


class TlsChannel:
    """A connected socket and the TLS state over it: an `ssl.SSLObject` on memory BIOs."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, server_name: str | None):
        self.sock = sock
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.tls = context.wrap_bio(self.incoming, self.outgoing, server_hostname=server_name)

    def fill(self) -> int:
        """One socket read into the incoming BIO: the bytes read, 0 at EOF (BlockingIOError
        on a non-blocking socket with nothing to read)."""
        view = read_buffer()
        n = self.sock.recv_into(view)
        if n:
            self.incoming.write(view[:n])
        return n

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class TunnelError(Exception):
    """The server could not be reached, verified, or refused the token."""


def open_tls(
    address: tuple[str, int],
    context: ssl.SSLContext,
    server_name: str | None,
    pinned: str | None,
    token: bytes,
    timeout: float,
) -> tuple[TlsChannel, dict[str, Any]]:
    """Blocking (run it on a thread): TCP, TLS 1.3, the server verified (CA or `pinned`
    fingerprint) before the token leaves, the token's answer. Returns the channel, its socket
    non-blocking, and what the tunnel reports of it."""
    deadline = time.monotonic() + timeout
    try:
        raw = socket.create_connection(address, timeout=timeout)
    except TimeoutError as exc:
        raise TunnelError(f"no answer within {timeout:.0f} s") from exc
    channel = TlsChannel(raw, context, server_name)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            _handshake(channel, deadline)
        except ssl.SSLError as exc:
            why = getattr(exc, "verify_message", None) or exc.reason or str(exc)
            raise TunnelError(f"TLS handshake failed: {why}") from exc
        except TimeoutError as exc:
            raise TunnelError(f"no TLS handshake within {timeout:.0f} s") from exc
        except OSError as exc:
            raise TunnelError(f"TLS handshake failed: {exc or type(exc).__name__}") from exc
        tls = channel.tls
        der = tls.getpeercert(binary_form=True)
        if pinned is not None:
            fp = tlsmod.check_fingerprint(der, pinned)  # before the token leaves
        else:
            fp = tlsmod.fingerprint(der or b"")
        tls.write(encode_request(token))
        raw.sendall(channel.outgoing.read())
        status, length = parse_answer_head(_recv_exactly(channel, ANSWER_HEAD.size, deadline))
        tenant = _recv_exactly(channel, length, deadline).decode(errors="replace")
        if status != ACCEPTED:
            raise TunnelError("the server refused the token")
        cipher = tls.cipher()
        info: dict[str, Any] = {
            "server": f"{address[0]}:{address[1]}",
            "tls_version": tls.version(),
            "cipher": cipher[0] if cipher else "?",
            "fingerprint": fp,
            "verified_by": "pinned fingerprint" if pinned else "CA",
            "tenant": tenant,
        }
        raw.setblocking(False)
        return channel, info
    except BaseException:
        channel.close()
        raise


def _handshake(channel: TlsChannel, deadline: float) -> None:
    """The client handshake over the blocking socket, each read within the deadline."""
    while True:
        try:
            channel.tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            channel.sock.sendall(channel.outgoing.read())
            channel.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            if not channel.fill():
                raise ConnectionResetError("the server closed the connection") from None
    channel.sock.sendall(channel.outgoing.read())


def _recv_exactly(channel: TlsChannel, n: int, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < n:
        try:
            out += channel.tls.read(n - len(out))
            continue
        except ssl.SSLWantReadError:
            pass
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            raise TunnelError("the server closed the connection (wrong token?)") from None
        channel.sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            got = channel.fill()
        except TimeoutError as exc:
            raise TunnelError("the server did not answer the token") from exc
        if not got:
            raise TunnelError("the server closed the connection (wrong token?)")
    return bytes(out)


class PlainSide(asyncio.BufferedProtocol):
    """The llama.cpp side. Until the TLS side is attached, what arrives stays in the buffer (a
    HELLO, typically) and reading pauses."""

    def __init__(
        self,
        opened: Callable[[PlainSide], None],
        rewrite: Callable[[bytes], bytes | None],
        complete: Callable[[bytes], Awaitable[bytes]] | None = None,
    ) -> None:
        self._opened = opened
        self._complete = complete  # a deferred COMM_INIT's payload, looked up
        self._held: list[Any] | None = None  # what waits behind a deferred COMM_INIT
        self._resolving: asyncio.Task[None] | None = None
        self._buffer = memoryview(bytearray(RECEIVE))
        self._early = 0  # bytes received before the TLS side was attached
        self.transport: Any = None
        self.secure: TlsSide | None = None
        self.closed = False
        self.status: dict[str, Any] = {}  # this connection's TLS facts, for STATUS
        self.who = "?"
        self.scanner = RequestScanner(rewrite, self._answer_status)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.who = f"{peer[0]}:{peer[1]}" if peer else "?"
        self._opened(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer[self._early :] if self.secure is None else self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.secure is None:
            self._early += nbytes
            self.transport.pause_reading()  # until the TLS side is attached
            return
        self._forward(self.scanner.feed(self._buffer[:nbytes]))

    def _forward(self, parts: list[Any]) -> None:
        """Send `parts` in order; from a `Deferred` on, hold them (and stop reading: they may
        be views of the buffer) until its lookup is done."""
        secure = self.secure
        if secure is None or secure.closed:
            return
        if self._held is not None:
            self._held.extend(parts)
            return
        for i, part in enumerate(parts):
            if isinstance(part, Deferred):
                secure.send(parts[:i])
                self._held = parts[i + 1 :]
                self.transport.pause_reading()
                self._resolving = asyncio.get_running_loop().create_task(self._resolve(part))
                return
        secure.send(parts)

    async def _resolve(self, deferred: Deferred) -> None:
        payload = deferred.payload
        if self._complete is not None:
            try:
                payload = await self._complete(payload)
            except Exception:  # noqa: BLE001 - unchanged then: the link fails, the client copes
                payload = deferred.payload
        held, self._held = self._held or [], None
        self._forward([deferred.header + payload, *held])
        self.may_resume()

    def may_resume(self) -> None:
        """Read the client again once nothing references the buffer."""
        secure = self.secure
        if self._held is None and secure is not None and not secure.busy and not self.closed:
            self.transport.resume_reading()

    def attach(self, secure: TlsSide) -> None:
        """The TLS side is open and accepted: send what came early, then forward as it comes."""
        self.secure = secure
        early, self._early = self._early, 0
        secure.start()
        if early:
            self._forward(self.scanner.feed(self._buffer[:early]))
        self.may_resume()

    def _answer_status(self) -> None:
        self.transport.write(status_frame(self.status))

    def eof_received(self) -> bool | None:
        return False  # close; connection_lost closes the TLS side

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.secure is not None:
            self.secure.close()

    def pause_writing(self) -> None:
        if self.secure is not None:
            self.secure.reading(False)

    def resume_writing(self) -> None:
        if self.secure is not None:
            self.secure.reading(True)


class TlsSide:
    """The server side: TLS over memory BIOs on a non-blocking socket, driven by the event
    loop's fd callbacks."""

    def __init__(self, channel: TlsChannel, plain: PlainSide) -> None:
        self.channel = channel
        self.tls = channel.tls
        self.sock = channel.sock
        self.plain = plain
        self.loop = asyncio.get_running_loop()
        self.fd = self.sock.fileno()
        self.pending: list[memoryview] = []  # client bytes not yet encrypted
        self._cipher = memoryview(b"")  # encrypted, not yet taken by the socket
        self._read_view = memoryview(bytearray(READ_SIZE))  # server bytes, decrypted
        self._reading = False
        self._writing = False
        self._server_eof = False
        self.closed = False

    def start(self) -> None:
        self.reading(True)

    @property
    def busy(self) -> bool:
        """Client bytes (views of its buffer) or their ciphertext are not sent yet."""
        return bool(self.pending or self._cipher)

    # ------------------------------------------------------------ client -> server

    def send(self, parts: list[Any]) -> None:
        if self.closed:
            return
        views = [memoryview(p).cast("B") for p in parts]
        if len(views) > 1 and sum(v.nbytes for v in views) <= JOIN_MAX:
            # one TLS record and one segment, not one per frame header and payload piece
            views = [memoryview(b"".join(views))]
        self.pending.extend(views)
        self._flush()
        if self.busy and not self.closed:  # the plain buffer is still referenced
            self.plain.transport.pause_reading()

    def _flush(self) -> None:
        """Encrypt a piece, send it; the next piece only once the socket took the last."""
        pending = self.pending
        while self._send_cipher() and pending:
            head = pending[0]
            if head.nbytes <= SEND_PIECE:
                pending.pop(0)
                piece = head
            else:
                piece, pending[0] = head[:SEND_PIECE], head[SEND_PIECE:]
            try:
                self.tls.write(piece)
            except (ssl.SSLError, ValueError):
                self._lost()
                return

    def _send_cipher(self) -> bool:
        """Send what TLS produced; True once the socket took all of it."""
        if self.closed:
            return False
        if not self._cipher and self.channel.outgoing.pending:
            self._cipher = memoryview(self.channel.outgoing.read())
        while self._cipher:
            try:
                n = self.sock.send(self._cipher)
            except WOULD_BLOCK:
                self._want_write(True)
                return False
            except OSError:
                self._lost()
                return False
            self._cipher = self._cipher[n:]
        self._want_write(False)
        return True

    def _on_writable(self) -> None:
        self._flush()
        if not self.busy and not self.closed:
            self.plain.may_resume()

    # ------------------------------------------------------------ server -> client

    def reading(self, on: bool) -> None:
        if self.closed or on == self._reading:
            return
        self._reading = on
        if on:
            self.loop.add_reader(self.fd, self._on_readable)
            self._on_readable()  # ciphertext already in the BIO would not wake the loop
        else:
            self.loop.remove_reader(self.fd)

    def _on_readable(self) -> None:
        if self.closed or not self._reading:
            return
        got, more = 0, True
        while more and self._reading and got < READ_BURST:
            filled, more = self._decrypt()
            if filled:  # one copy per READ_SIZE: the buffer is reused
                self.plain.transport.write(bytes(self._read_view[:filled]))
                got += filled
            if self.closed:
                return
        if self._server_eof and not more:
            self._lost()
        elif more and self._reading:  # more may be waiting in the BIO or the socket
            self.loop.call_soon(self._on_readable)

    def _decrypt(self) -> tuple[int, bool]:
        """Decrypt server bytes into the read buffer: (bytes, whether more may come now)."""
        view, filled = self._read_view, 0
        read: Callable[[int, memoryview], int] = self.tls.read  # type: ignore[assignment]
        while filled < READ_SIZE:
            try:
                n = read(READ_SIZE - filled, view[filled:])  # a record at most per call
            except ssl.SSLWantReadError:
                if self._server_eof:
                    return filled, False
                try:
                    if not self.channel.fill():
                        self._server_eof = True
                except WOULD_BLOCK:
                    return filled, False
                except OSError:
                    self._server_eof = True
                continue
            except (ssl.SSLError, ValueError):  # close_notify, a broken record
                self._server_eof = True
                return filled, False
            if not n:
                self._server_eof = True
                return filled, False
            filled += n
        if self.channel.outgoing.pending:  # TLS itself answered something (a key update)
            self._flush()
        return filled, True

    # ------------------------------------------------------------ closing

    def _want_write(self, on: bool) -> None:
        if on != self._writing and not self.closed:
            self._writing = on
            if on:
                self.loop.add_writer(self.fd, self._on_writable)
            else:
                self.loop.remove_writer(self.fd)

    def _lost(self) -> None:
        self.close()
        if not self.plain.closed:
            self.plain.transport.close()  # after what was written to it

    def close(self) -> None:
        if self.closed:
            return
        self.reading(False)
        self._want_write(False)
        self.closed = True
        self.pending.clear()
        self._cipher = memoryview(b"")
        self.channel.close()


async def query_status(host: str, port: int, timeout: float) -> dict[str, Any] | None:
    """What the `rpcnet tunnel` listening at host:port says of its connection (its STATUS
    answer), or None when nothing answers it (not a tunnel)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return None
    try:
        writer.write(HEADER.pack(STATUS, 0))
        (size,) = struct.unpack("<Q", await asyncio.wait_for(reader.readexactly(8), timeout))
        if size > 1 << 16:
            return None
        return parse_status(await asyncio.wait_for(reader.readexactly(size), timeout))
    except (OSError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()
