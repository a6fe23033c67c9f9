"""The server's TLS transport: an `ssl.SSLObject` over memory BIOs on a non-blocking socket,
driven by the event loop's fd callbacks (`add_reader` / `add_writer`), feeding an
`asyncio.BufferedProtocol`.

The socket is read and written in large pieces, not a TLS record (16 KiB) at a time: on
loopback the per-call and per-segment cost of the kernel's TCP, not the cipher, is what a
record-sized syscall pays most for. Received ciphertext is decrypted straight into the buffer
the protocol hands out (`get_buffer`): a SET_TENSOR payload lands in device memory with no
plaintext copy in between. What a connection makes the server hold:

- receiving: the ciphertext of one socket read not yet decrypted (at most `READ_SIZE`, read
  only once the previous read is decrypted, and no more than the protocol's buffer takes);
- sending: views of the caller's bytes (no copy) plus the ciphertext of one `SEND_PIECE`,
  encrypted only once the socket took the previous piece, whether or not the peer reads.

`TlsSocketTransport.accept` takes over the socket of an accepted plain transport (a duplicate
of its descriptor; that transport is dropped before it read anything) and runs the handshake
with a deadline; `handshake` is the future of its outcome.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

READ_SIZE = 1 << 20  # one socket read at most
SEND_PIECE = 256 << 10  # plaintext encrypted at a time
READ_BURST = 4 << 20  # plaintext bytes per event-loop turn before other connections run
RECORD = 16 << 10  # a TLS record's plaintext, at most
JOIN_MAX = 64 << 10  # small parts written together go out as one record
HANDSHAKE_READ = 64 << 10  # one socket read during the handshake
WOULD_BLOCK = (BlockingIOError, InterruptedError)

_scratch = threading.local()  # one socket read buffer per event-loop thread


def read_buffer() -> memoryview:
    """This thread's socket read buffer: its bytes go into a BIO at once, so connections on
    one event loop share it."""
    view: memoryview | None = getattr(_scratch, "view", None)
    if view is None:
        view = _scratch.view = memoryview(bytearray(READ_SIZE))
    return view


class TlsHandshakeTimeout(TimeoutError):
    """No TLS handshake within the deadline."""


class TlsSocketTransport(asyncio.Transport):
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        context: ssl.SSLContext,
        protocol: asyncio.BufferedProtocol,
    ) -> None:
        super().__init__()
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._protocol = protocol
        self._pending: collections.deque[memoryview] = collections.deque()  # plaintext
        self._pending_size = 0
        self._cipher = memoryview(b"")  # encrypted, not yet taken by the socket
        self._high, self._low = 64 << 10, 16 << 10
        self._write_paused = False  # the protocol was told to pause writing
        self._reading = True  # the protocol wants bytes (from the handshake's end)
        self._read_watch = False  # add_reader is active
        self._write_watch = False  # add_writer is active
        self._socket_eof = False
        self._closing = False
        self._closed = False
        self._extra: dict[str, Any] = {"socket": sock, "ssl_object": self._tls}
        self.handshake: asyncio.Future[None] = loop.create_future()
        self._deadline: asyncio.TimerHandle | None = None

    @classmethod
    def accept(
        cls,
        plain: asyncio.Transport,
        context: ssl.SSLContext,
        protocol: asyncio.BufferedProtocol,
        timeout: float,
    ) -> TlsSocketTransport:
        """TLS (server side) on the socket of `plain`, a just-accepted transport that has not
        read yet; the handshake starts now and must end within `timeout` seconds."""
        loop = asyncio.get_running_loop()
        sock: socket.socket = plain.get_extra_info("socket").dup()
        names = {key: plain.get_extra_info(key) for key in ("peername", "sockname")}
        plain.set_protocol(asyncio.Protocol())  # its close is no event of ours
        plain.abort()  # the duplicate keeps the connection open
        sock.setblocking(False)
        self = cls(loop, sock, context, protocol)
        self._extra.update(names)
        self._deadline = loop.call_later(timeout, self._handshake_timeout, timeout)
        self._set_read_watch(True, self._on_handshake_readable)
        self._handshake_step()
        return self

    # ------------------------------------------------------------ handshake

    def _on_handshake_readable(self) -> None:
        try:
            if not self._fill(HANDSHAKE_READ):
                self._handshake_failed(ConnectionResetError("the client closed the connection"))
                return
        except WOULD_BLOCK:
            return
        except OSError as exc:
            self._handshake_failed(exc)
            return
        self._handshake_step()

    def _handshake_step(self) -> None:
        if self._closed:
            return
        try:
            self._tls.do_handshake()
        except ssl.SSLWantReadError:
            self._send_cipher()  # our flight, if any; then the client's answer
            return
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            self._send_cipher()  # the alert, best effort
            self._handshake_failed(exc)
            return
        if self._deadline is not None:
            self._deadline.cancel()
        self._extra["cipher"] = self._tls.cipher()
        self._set_read_watch(False)
        self._send_cipher()  # the end of the handshake (session tickets)
        if self._closed:
            return
        if not self.handshake.done():
            self.handshake.set_result(None)
        self._start_reading()

    def _handshake_timeout(self, timeout: float) -> None:
        self._handshake_failed(TlsHandshakeTimeout(f"no TLS handshake within {timeout:.0f} s"))

    def _handshake_failed(self, exc: BaseException) -> None:
        self._shut(close_notify=False)
        if not self.handshake.done():
            self.handshake.set_exception(exc)
            self.handshake.exception()  # retrieved here too: a cancelled waiter is no error

    # ------------------------------------------------------------ reading

    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        self._reading = False
        if self.handshake.done():
            self._set_read_watch(False)

    def resume_reading(self) -> None:
        if self._reading or self._closing:
            return
        self._reading = True
        self._start_reading()

    def _start_reading(self) -> None:
        if self._reading and self.handshake.done() and not self._closing:
            self._set_read_watch(True, self._on_readable)
            # ciphertext already in the BIO would not wake the loop
            self._loop.call_soon(self._on_readable)

    def _set_read_watch(self, on: bool, callback: Any = None) -> None:
        if on != self._read_watch and not self._closed:
            self._read_watch = on
            if on:
                self._loop.add_reader(self._fd, callback)
            else:
                self._loop.remove_reader(self._fd)

    def _fill(self, want: int) -> int:
        """One socket read of up to `want` bytes (within READ_SIZE) into the incoming BIO:
        the bytes read, 0 at EOF. Raises BlockingIOError when there are none."""
        view = read_buffer()
        n = self._sock.recv_into(view[: max(min(want, READ_SIZE), RECORD)])
        if n:
            self._incoming.write(view[:n])
        return n

    def _on_readable(self) -> None:
        """Decrypt into the protocol's buffers until the socket is empty, reading pauses, or
        `READ_BURST` bytes came this turn."""
        got, protocol = 0, self._protocol
        while self._reading and got < READ_BURST:
            buf = memoryview(protocol.get_buffer(-1))
            size = min(buf.nbytes, READ_BURST - got)
            filled, more = self._decrypt_into(buf, size)
            if filled:
                protocol.buffer_updated(filled)
                got += filled
            if not more:
                return
        if self._reading and not self._closing:
            self._loop.call_soon(self._on_readable)

    def _decrypt_into(self, buf: memoryview, size: int) -> tuple[int, bool]:
        """Fill `buf[:size]` as far as the socket allows: (bytes, whether to go on)."""
        read: Callable[[int, memoryview], int] = self._tls.read  # type: ignore[assignment]
        filled = 0
        while filled < size:
            try:
                n = read(size - filled, buf[filled:size])  # a record at most per call
            except ssl.SSLWantReadError:
                if self._socket_eof:
                    self._loop.call_soon(self._eof)
                    return filled, False
                try:
                    if not self._fill(size - filled + RECORD):
                        self._socket_eof = True
                except WOULD_BLOCK:
                    return filled, False
                except OSError as exc:
                    self._lose(exc)
                    return filled, False
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                self._loop.call_soon(self._eof)
                return filled, False
            except ssl.SSLError as exc:
                self._lose(exc)
                return filled, False
            if not n:
                self._loop.call_soon(self._eof)
                return filled, False
            filled += n
        if self._outgoing.pending:  # TLS itself answered something (a key update)
            self._flush()
        return filled, True

    def _eof(self) -> None:
        if self._closing:
            return
        self.pause_reading()
        keep_open = self._protocol.eof_received()
        if not keep_open:
            self.close()

    # ------------------------------------------------------------ writing

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._high = 64 << 10 if high is None else high
        self._low = self._high // 4 if low is None else low

    def get_write_buffer_size(self) -> int:
        """Plaintext handed to `write` and not yet taken by the socket (views, not copies)."""
        return self._pending_size

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._low, self._high

    def ciphertext_held(self) -> int:
        """Encrypted bytes the socket has not taken yet."""
        return self._cipher.nbytes + self._outgoing.pending

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if self._closing or not view.nbytes:
            return
        self._pending.append(view)
        self._pending_size += view.nbytes
        self._flush()

    def writelines(self, list_of_data: Any) -> None:
        if self._closing:
            return
        views = [memoryview(d).cast("B") for d in list_of_data]
        size = sum(v.nbytes for v in views)
        if len(views) > 1 and size <= JOIN_MAX:
            views = [memoryview(b"".join(views))]  # one record, not one per part
        self._pending.extend(v for v in views if v.nbytes)
        self._pending_size += size
        self._flush()

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        raise NotImplementedError("TLS has no half-close here")

    def _flush(self) -> None:
        """Encrypt a piece, send it; the next piece only once the socket took the last."""
        pending = self._pending
        while self._send_cipher() and pending:
            head = pending[0]
            if head.nbytes <= SEND_PIECE:
                pending.popleft()
                piece = head
            else:
                piece, pending[0] = head[:SEND_PIECE], head[SEND_PIECE:]
            try:
                self._tls.write(piece)
            except (ssl.SSLError, ValueError) as exc:
                self._lose(exc)
                return
            self._pending_size -= piece.nbytes
        if self._closed:
            return
        if not self._write_paused and self._pending_size >= self._high:
            self._write_paused = True
            self._protocol.pause_writing()
        elif self._write_paused and self._pending_size <= self._low and not self._cipher:
            self._write_paused = False
            self._protocol.resume_writing()

    def _send_cipher(self) -> bool:
        """Send what TLS produced; True once the socket took all of it."""
        if self._closed:
            return False
        if not self._cipher and self._outgoing.pending:
            self._cipher = memoryview(self._outgoing.read())
        while self._cipher:
            try:
                n = self._sock.send(self._cipher)
            except WOULD_BLOCK:
                self._set_write_watch(True)
                return False
            except OSError as exc:
                self._lose(exc)
                return False
            self._cipher = self._cipher[n:]
        self._set_write_watch(False)
        return True

    def _set_write_watch(self, on: bool) -> None:
        if on != self._write_watch and not self._closed:
            self._write_watch = on
            if on:
                self._loop.add_writer(self._fd, self._on_writable)
            else:
                self._loop.remove_writer(self._fd)

    def _on_writable(self) -> None:
        if self.handshake.done():
            self._flush()
        else:
            self._send_cipher()

    # ------------------------------------------------------------ closing

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Close after one last try to send what was written; what the socket does not take
        then is dropped (as the bytes of a response to a client that stopped reading)."""
        if self._closing:
            return
        self._closing = True
        self.pause_reading()
        self._flush()
        if self._closed:
            return
        self._shut(close_notify=not self._pending and not self._cipher)
        self._loop.call_soon(self._protocol.connection_lost, None)

    def abort(self) -> None:
        """Close at once, dropping what was not sent."""
        self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closing = True
        self._shut(close_notify=False)
        if self.handshake.done():
            self._loop.call_soon(self._protocol.connection_lost, exc)
        else:  # the connection was never handed to the protocol
            self.handshake.set_exception(exc or ConnectionAbortedError("closed before TLS"))
            self.handshake.exception()

    def _shut(self, *, close_notify: bool) -> None:
        if self._closed:
            return
        if close_notify:
            self._send_close_notify()
        self._closed = self._closing = True
        self._reading = False
        if self._deadline is not None:
            self._deadline.cancel()
        if self._read_watch:
            self._loop.remove_reader(self._fd)
        if self._write_watch:
            self._loop.remove_writer(self._fd)
        self._read_watch = self._write_watch = False
        self._pending.clear()
        self._pending_size = 0
        self._cipher = memoryview(b"")
        try:
            self._sock.close()
        except OSError:
            pass

    def _send_close_notify(self) -> None:
        """Best effort: one send, the peer's close_notify is not awaited."""
        try:
            self._tls.unwrap()
        except (ssl.SSLError, ValueError):
            pass
        try:
            self._sock.send(self._outgoing.read())
        except OSError:
            pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]
