"""The RDMA byte channel: a `Transport` over one activated queue pair (spec §12).

Each `send` is cut into SEND messages of at most `RDMA_CHUNK` (256 KiB, inline up to the QP's
inline limit) that end where the call ends; the receiver keeps `RX_DEPTH` (24) buffers posted,
consumes whole messages and reposts each buffer as soon as its bytes are used. `flush` is a no-op.
Polling spins for `SPIN_TIME` after activity, then backs off to short sleeps.

Our receiver also accepts messages that do not line up with its reads (it reassembles a byte
stream); with `strict=True` it refuses them the way a reference receiver would break on them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rpcnet.transport.base import Transport, TransportClosed, TransportError
from rpcnet.transport.rdma.queuepair import RDMA_CHUNK, Completion, QueuePair

SPIN_TIME = 0.1  # seconds of busy polling after the last completion
IDLE_SLEEP_MIN = 50e-6  # then sleep between polls, doubling up to IDLE_SLEEP_MAX
IDLE_SLEEP_MAX = 1e-3


@dataclass
class RdmaStats:
    messages_sent: int = 0
    inline_sent: int = 0
    bytes_sent: int = 0
    messages_received: int = 0
    bytes_received: int = 0
    reposted: int = 0


class RdmaTransport(Transport):
    name = "RDMA"

    def __init__(
        self,
        qp: QueuePair,
        *,
        peer_closed: Callable[[], bool] | None = None,
        strict: bool = False,
        spin_time: float = SPIN_TIME,
        description: str = "",
    ) -> None:
        self.qp = qp
        self.peer_closed = peer_closed
        self.strict = strict
        self.spin_time = spin_time
        self.description = description
        self.stop = threading.Event()  # set from any thread: waits end with TransportClosed
        self.stats = RdmaStats()
        self._ready: deque[Completion] = deque()  # polled, not yet consumed receives
        self._leftover: tuple[int, int, int] | None = None  # (slot, start, end) of a message
        self._last_active = time.monotonic()
        self._closed = False

    def describe(self) -> str:
        return f"RDMA ({self.description})" if self.description else "RDMA"

    # ------------------------------------------------------------ polling

    def _wait(self, poll: Callable[[], Completion | None], what: str) -> Completion | None:
        """Next completion from `poll`; None when stopped or the peer is gone."""
        spins = 0
        sleep = IDLE_SLEEP_MIN
        while True:
            c = poll()
            if c is not None:
                self._last_active = time.monotonic()
                if not c.ok:
                    raise TransportError(f"RDMA {what} completion failed: {c.status}")
                return c
            spins += 1
            if self.stop.is_set():
                return None
            if spins % 64 == 0 and self.peer_closed is not None and self.peer_closed():
                return None
            if time.monotonic() - self._last_active < self.spin_time:
                time.sleep(0)  # spin, but let other Python threads (the event loop) run
            else:
                self.stop.wait(sleep)
                sleep = min(sleep * 2, IDLE_SLEEP_MAX)

    def _closed_error(self) -> TransportClosed:
        if self.stop.is_set():
            return TransportClosed("RDMA transport closed")
        return TransportClosed("peer closed the connection (TCP liveness socket)")

    # ------------------------------------------------------------ sending

    def send(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        total = view.nbytes
        tx = self.qp.tx_view()
        for off in range(0, total, RDMA_CHUNK):
            n = min(RDMA_CHUNK, total - off)
            tx[:n] = view[off : off + n]
            inline = n <= self.qp.max_inline
            self.qp.post_send(n, inline)
            if self._wait(self.qp.poll_send, "send") is None:
                raise self._closed_error()
            self.stats.messages_sent += 1
            self.stats.inline_sent += inline
            self.stats.bytes_sent += n

    # ------------------------------------------------------------ receiving

    def has_data(self) -> bool:
        return self._leftover is not None or bool(self._ready)

    def wait_readable(self) -> bool:
        """Block until a message is there (True), or the transport is stopped / the peer gone."""
        if self.has_data():
            return True
        c = self._wait(self.qp.poll_recv, "receive")
        if c is None:
            return False
        self._ready.append(c)
        return True

    def _repost(self, slot: int) -> None:
        self.qp.post_recv(slot)
        self.stats.reposted += 1

    def recv_into(self, dest: Any) -> None:
        view = memoryview(dest).cast("B")
        want = view.nbytes
        got = 0
        while got < want:
            if self._leftover is None:
                c = self._ready.popleft() if self._ready else None
                if c is None:
                    c = self._wait(self.qp.poll_recv, "receive")
                    if c is None:
                        raise self._closed_error()
                self.stats.messages_received += 1
                self.stats.bytes_received += c.byte_len
                if c.byte_len == 0:
                    self._repost(c.wr_id)
                    continue
                if self.strict and c.byte_len > want - got:
                    raise TransportError(
                        f"RDMA message of {c.byte_len} bytes where the reader wanted "
                        f"{want - got}: the peer's send() calls do not match the reads "
                        "(a reference receiver would overrun its buffer)"
                    )
                self._leftover = (c.wr_id, 0, c.byte_len)
            slot, start, end = self._leftover
            take = min(end - start, want - got)
            view[got : got + take] = self.qp.rx_view(slot)[start : start + take]
            got += take
            start += take
            if start == end:
                self._leftover = None
                self._repost(slot)  # the buffer is free again: keep the ring full
            else:
                self._leftover = (slot, start, end)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.stop.set()
            self.qp.close()
