"""Server-to-server allreduce links for tensor parallelism (spec §11, COMM_INIT/ALLREDUCE/FREE).

llama.cpp's tensor split (``--split-mode tensor`` over two RPC endpoints) gives each of two servers
half of every weight and asks them to sum their partial results directly: COMM_INIT pairs a
(connection, device) of one server (rank 0) with one of another server (rank 1) through a raw TCP
"peer link"; every COMM_ALLREDUCE then swaps the tensor's bytes over that link and adds the peer's
values in place.

Wire behaviour is the reference's (spec §11), so a peer may be another rpcnet or the reference
``rpc-server``:

* rank 0 listens on the given port, accepts one connection, closes the listener, reads the
  peer's 24 caps bytes and sends its own; rank 1 connects (100 attempts, 50 ms apart), sends its
  caps, reads the peer's. rpcnet's peer links are TCP only: its caps are 24 zero bytes, which
  keeps the link on TCP whatever the peer sends (§12);
* an allreduce of an F32 tensor of at least 32768 elements travels as bf16 (round to nearest
  even), everything else as the tensor's raw bytes; rank 0 sends, then receives; rank 1
  receives, then sends; the peer's values (widened back to f32 after bf16) are added into the
  tensor in its own type, the local operand at full precision.

Where rpcnet differs from the reference, on purpose:

* both ranks send and receive at once (whatever the socket takes, in either direction), so a
  decode-sized allreduce costs one one-way trip, not rank 0's bytes over and rank 1's back; the
  bytes on the wire are the same, and a reference peer that sends or receives first is served
  as well (neither side can block the other, whatever the size);

* every wait blocks only the connection that asked, never the server: rank 0 waiting for its
  peer and rank 1's connect retries are coroutines, an exchange waits on its link's thread;
* rank 0 waits at most ``ServerConfig.comm_timeout`` seconds (the reference waits forever),
  then answers ``ok = 0`` so the client falls back to its own reduction;
* rank 0 listens on the server's own host (``--host``), not on every interface, and accepts the
  peer only from an address the server's allowlist (``--allow``) admits;
* on a TLS server (``--tls-*``) the link is TLS 1.3 with the tenant's token before the caps
  (``server/peertls.py``); a peer that fails that is closed and rank 0 waits for the next;
* a peer that disappears, or a failed exchange, closes the one client connection whose link it
  was; the link of a connection that ends without COMM_FREE is closed with it.

The exchange and the add of COMM_ALLREDUCE run on the link's own thread, chained after the
connection's graphs (server/chain.py): a tensor-parallel decode step is graph, allreduce, graph,
... handed between the device worker and the link thread with no hop to the event loop; the loop
only launches them. The device worker never waits for a peer, so other clients keep computing
and two servers serving several tensor-split clients cannot deadlock on each other.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
import ssl
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from rpcnet.compute.views import bf16_to_f32, f32_to_bf16
from rpcnet.ggml_types import TYPE_TRAITS, GgmlType
from rpcnet.protocol.commands import HELLO_CAPS_SIZE, NO_CAPS
from rpcnet.server.access import Network, allowed
from rpcnet.server.config import ServerConfig
from rpcnet.server.peertls import PeerRefused, PeerSecurity

log = logging.getLogger("rpcnet.comm")

PEER_CAPS = NO_CAPS  # TCP only (spec §11.2, §12)
BF16_MIN_ELEMENTS = 32768  # F32 tensors with at least this many elements travel as bf16
CONNECT_ATTEMPTS = 100  # rank 1, like the reference: 100 tries, 50 ms apart (~5 s)
CONNECT_DELAY = 0.05
DEFAULT_TIMEOUT = ServerConfig.comm_timeout

# types an allreduce can add -> bytes per element
ELEMENT_SIZE = {t: TYPE_TRAITS[t].type_size for t in (GgmlType.F32, GgmlType.F16, GgmlType.BF16)}


class CommError(Exception):
    """The peer link failed (closed, reset, timed out); the session closes the connection."""


@dataclass
class CommStats:
    links: int = 0  # peer links established
    allreduces: int = 0
    bytes_sent: int = 0  # wire payload bytes over peer links (no framing exists)
    bytes_received: int = 0


# ---------------------------------------------------------------- arithmetic (no I/O)


def uses_bf16(type_id: int, ne: int) -> bool:
    return type_id == GgmlType.F32 and ne >= BF16_MIN_ELEMENTS


def wire_size(type_id: int, ne: int, nbytes: int) -> int:
    return ne * 2 if uses_bf16(type_id, ne) else nbytes


def encode(region: Any, type_id: int, ne: int) -> Any:
    """What this rank sends: bf16 bits for large F32 tensors, else the raw bytes (no copy)."""
    if uses_bf16(type_id, ne):
        return f32_to_bf16(region.view(np.float32))
    return region


def accumulate(region: Any, received: Any, type_id: int, ne: int) -> None:
    """``tensor += peer`` in place, in the tensor's type (ggml ADD semantics, spec §11.3)."""
    if type_id == GgmlType.F32:
        dst = region.view(np.float32)
        if uses_bf16(type_id, ne):
            dst += bf16_to_f32(received.view(np.uint16))
        else:
            dst += received.view(np.float32)
    elif type_id == GgmlType.F16:
        # NumPy adds halves through float32 and rounds once, like ggml's f16 ADD.
        dst = region.view(np.float16)
        dst += received.view(np.float16)
    elif type_id == GgmlType.BF16:
        dst = region.view(np.uint16)
        total = bf16_to_f32(dst) + bf16_to_f32(received.view(np.uint16))
        dst[...] = f32_to_bf16(total)
    else:  # the session checks the type before any byte moves
        raise ValueError(f"allreduce of ggml type {type_id}")


# ---------------------------------------------------------------- links


# An allreduce waits for the peer's matching graph piece; allow far longer than COMM_INIT's wait.
EXCHANGE_TIMEOUT_FACTOR = 10


# How long an exchange polls for the peer's bytes before it sleeps (PeerLink.wait), and how
# long the device worker tries an allreduce before handing it to the link's thread.
SPIN_SECONDS = 0.002

# One send of a TLS link at most (a TLS write that cannot finish must be retried with the same
# bytes); a plain socket takes what it takes.
TLS_SEND_CHUNK = 1 << 20
WOULD_BLOCK = (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


class PeerLink:
    """One established peer link of a (connection, device): socket, rank, receive scratch."""

    def __init__(
        self, hub: CommHub, sock: socket.socket, device: int, rank: int, peer: str
    ) -> None:
        self.hub, self.sock, self.device, self.rank, self.peer = hub, sock, device, rank, peer
        self.stats = CommStats(links=1)
        self.chunk = TLS_SEND_CHUNK if isinstance(sock, ssl.SSLSocket) else None
        self._scratch = np.empty(0, dtype=np.uint8)
        self.closed = False
        # Exchanges wait for the peer here, never on the device worker (see server/chain.py).
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"rpcnet-link{device}")

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        """Run `fn` on the link's thread. A job with `attempt_inline(until)` (an allreduce, see
        `Exchange`) is first tried on the calling thread when that is not an event loop (a
        device worker, right after the graph that produced the tensor): the peer's half
        usually arrives within that time, and the hand-off to this thread and back (two
        wake-ups) is saved. A peer slower than `SPIN_SECONDS` gets the rest done here."""
        attempt = getattr(fn, "attempt_inline", None)
        if attempt is not None and not _on_event_loop():
            done: Future[None] = Future()
            try:
                finished = attempt(time.monotonic() + SPIN_SECONDS)
            except BaseException as exc:  # noqa: BLE001 - the job's outcome, for its waiter
                done.set_exception(exc)
                return done
            if finished:
                done.set_result(None)
                return done
        return self._thread.submit(fn)

    def __repr__(self) -> str:
        return f"PeerLink(device {self.device}, rank {self.rank}, peer {self.peer})"

    def allreduce(self, region: Any, type_id: int, ne: int) -> None:
        """Swap `region` (the tensor's bytes, a uint8 array) with the peer and add its values,
        waiting for the peer up to the link's limit."""
        Exchange(self, region, type_id, ne).advance(None)

    def receive_buffer(self, nbytes: int) -> Any:
        """Scratch for the peer's bytes, kept between exchanges."""
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, dtype=np.uint8)
        return self._scratch[:nbytes]

    def poll_until(self, events: int, until: float) -> bool:
        """Whether the socket is ready for `events` before `until`, polling (yielding the
        CPU) instead of sleeping."""
        poller = select.poll()
        poller.register(self.sock, events)
        while True:
            if poller.poll(0):
                return True
            if time.monotonic() >= until:
                return False
            os.sched_yield()

    def wait(self, events: int, deadline: float) -> None:
        """Until the socket is ready for `events`; TimeoutError at `deadline`."""
        # The peer's half usually comes within a graph piece's time. Poll for it before
        # sleeping in poll(2): on a loaded virtual machine that wake-up costs hundreds of µs,
        # more than a piece's compute (the reference's comm threads spin too).
        if self.poll_until(events, min(deadline, time.monotonic() + SPIN_SECONDS)):
            return
        remaining = deadline - time.monotonic()
        poller = select.poll()
        poller.register(self.sock, events)
        if remaining <= 0 or not poller.poll(remaining * 1000):
            raise TimeoutError

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.hub.links.discard(self)
        self._scratch = np.empty(0, dtype=np.uint8)
        self._thread.shutdown(wait=False)  # queued exchanges still run, and fail at once
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes an exchange waiting for the peer
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass
        s = self.stats
        log.info(
            "device %d: pairwise comm rank %d with %s closed: %d allreduces, %d bytes sent, "
            "%d received",
            self.device,
            self.rank,
            self.peer,
            s.allreduces,
            s.bytes_sent,
            s.bytes_received,
        )


class Exchange:
    """One allreduce on a link (spec §11.3): our bytes out, the peer's in, then the add.

    Both directions move at once: each step sends what the socket takes and reads what has
    arrived. `advance(until)` moves bytes and, where neither direction can move, polls only
    until `until` (False: not finished, resume later, possibly on another thread);
    `advance(None)` finishes, waiting for the peer up to the link's limit.
    """

    def __init__(self, link: PeerLink, region: Any, type_id: int, ne: int) -> None:
        if link.closed:
            raise CommError("the peer link is closed")
        self.link, self.region, self.type_id, self.ne = link, region, type_id, ne
        self.wire = wire_size(type_id, ne, region.nbytes)
        self.received = link.receive_buffer(self.wire)
        self._out = memoryview(encode(region, type_id, ne)).cast("B")
        self._in = memoryview(self.received.data).cast("B")
        self._limit = link.hub.timeout * EXCHANGE_TIMEOUT_FACTOR
        self._deadline = time.monotonic() + self._limit

    def _move(self) -> bool:
        """Send and receive what the socket allows now; whether any byte moved."""
        sock, moved = self.link.sock, False
        if self._out.nbytes:
            out = self._out if self.link.chunk is None else self._out[: self.link.chunk]
            try:
                n = sock.send(out)
            except WOULD_BLOCK:
                n = 0
            self._out, moved = self._out[n:], n > 0
        if self._in.nbytes:
            try:
                n = sock.recv_into(self._in)
            except WOULD_BLOCK:
                n = -1
            if n == 0:
                raise CommError(f"peer {self.link.peer} closed the link")
            if n > 0:
                self._in, moved = self._in[n:], True
        return moved

    def advance(self, until: float | None) -> bool:
        link = self.link
        try:
            while self._out.nbytes or self._in.nbytes:
                if self._move():
                    continue
                events = (select.POLLOUT if self._out.nbytes else 0) | (
                    select.POLLIN if self._in.nbytes else 0
                )
                if until is None:
                    link.wait(events, self._deadline)
                elif not link.poll_until(events, until):
                    return False
        except TimeoutError as exc:
            # A peer that stalls without closing must not hold this connection forever.
            raise CommError(f"peer {link.peer} sent nothing for {self._limit:.0f} s") from exc
        except OSError as exc:
            if link.closed:
                raise CommError("the peer link is closed") from exc
            raise CommError(f"peer {link.peer}: {exc.strerror or exc}") from exc
        for stats in (link.stats, link.hub.stats):
            stats.allreduces += 1
            stats.bytes_sent += self.wire
            stats.bytes_received += self.wire
        accumulate(self.region, self.received, self.type_id, self.ne)
        return True


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class CommHub:
    """Creates peer links for a server and keeps the live ones (for stats and cleanup checks).

    `host` is where rank 0 listens (the server's own bind address), `timeout` bounds rank 0's
    wait for its peer and each side's whole handshake, `allow` filters the peer's address,
    `security` (a TLS server) makes every link TLS with the tenant's token.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        timeout: float = DEFAULT_TIMEOUT,
        allow: tuple[Network, ...] | None = None,
        security: PeerSecurity | None = None,
    ) -> None:
        self.host = host
        self.timeout = timeout
        self.allow = allow
        self.security = security
        self.links: set[PeerLink] = set()
        self.stats = CommStats()

    async def open(
        self,
        device: int,
        rank: int,
        port: int,
        host: str,
        tenant: str | None = None,
        token: bytes | None = None,
    ) -> PeerLink | None:
        """Establish the link for COMM_INIT (caps exchanged); None means answer ``ok = 0``.
        `tenant` and `token` are those of the connection that sent it (TLS links)."""
        if not 0 < port < 65536:
            log.warning("COMM_INIT rank %d refused: comm port %d out of range", rank, port)
            return None
        try:
            if rank == 0:
                sock, peer = await self._accept(port, tenant)
            else:
                sock, peer = await asyncio.wait_for(self._connect(host, port, token), self.timeout)
        except (OSError, CommError, PeerRefused, asyncio.TimeoutError) as exc:
            reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else str(exc)
            where = f"{self.host}:{port}" if rank == 0 else f"{host}:{port}"
            log.warning(
                "COMM_INIT device %d rank %d via %s failed: %s", device, rank, where, reason
            )
            return None
        link = PeerLink(self, sock, device, rank, peer)
        self.links.add(link)
        self.stats.links += 1
        log.info(
            "device %d joined pairwise comm as rank %d (peer %s%s)",
            device,
            rank,
            peer,
            ", TLS 1.3" + (f", tenant {tenant}" if tenant else "") if self.security else "",
        )
        return link

    async def _accept(self, port: int, tenant: str | None) -> tuple[socket.socket, str]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(
            self.host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first, like the client
        family, kind, proto, _, addr = infos[0]
        listener = socket.socket(family, kind, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(addr)
            listener.listen(1)
            listener.setblocking(False)
            deadline = loop.time() + self.timeout
            while True:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise asyncio.TimeoutError
                sock, peer_addr = await asyncio.wait_for(loop.sock_accept(listener), remaining)
                peer = _name(peer_addr)
                if not allowed(peer_addr[0], self.allow):
                    log.warning(
                        "comm port %d: refused %s: address not in the allowlist", port, peer
                    )
                    sock.close()
                    continue
                if self.security is None:
                    break
                try:  # a peer that fails TLS or the token is closed; wait for the next
                    return await self._secure_accept(sock, peer, tenant, deadline)
                except (OSError, PeerRefused) as exc:
                    log.warning("comm port %d: refused %s: %s", port, peer, exc)
        finally:
            listener.close()
        try:
            _prepare(sock)
            remaining = max(deadline - loop.time(), 1.0)
            caps = await asyncio.wait_for(_recv_caps(loop, sock, peer), remaining)
            await asyncio.wait_for(loop.sock_sendall(sock, PEER_CAPS), remaining)
        except BaseException:
            sock.close()
            raise
        _note_caps(peer, caps)
        return sock, peer

    async def _secure_accept(
        self, sock: socket.socket, peer: str, tenant: str | None, deadline: float
    ) -> tuple[socket.socket, str]:
        assert self.security is not None
        loop = asyncio.get_running_loop()
        # one peer's set-up may not take rank 0's whole wait
        until = time.monotonic() + min(max(deadline - loop.time(), 1.0), self.timeout)
        return await _secured(sock, peer, self.security.accept, tenant, PEER_CAPS, until)

    async def _connect(
        self, host: str, port: int, token: bytes | None = None
    ) -> tuple[socket.socket, str]:
        loop = asyncio.get_running_loop()
        if not host:
            raise CommError("no rank-0 host given")
        last: Exception | None = None
        for attempt in range(CONNECT_ATTEMPTS):
            if attempt:
                await asyncio.sleep(CONNECT_DELAY)
            try:  # IPv4 only, like the reference's resolver
                infos = await loop.getaddrinfo(
                    host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
                )
            except OSError as exc:
                last = exc
                continue
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, infos[0][4])
            except OSError as exc:
                sock.close()
                last = exc
                continue
            except BaseException:
                sock.close()
                raise
            break
        else:
            raise CommError(f"no connection after {CONNECT_ATTEMPTS} attempts ({last})")
        peer = _name(sock.getpeername())
        if self.security is not None:
            until = time.monotonic() + self.timeout
            connect = self.security.connect
            return await _secured(sock, peer, connect, host, token, PEER_CAPS, until)
        try:
            _prepare(sock)
            await loop.sock_sendall(sock, PEER_CAPS)
            caps = await _recv_caps(loop, sock, peer)
        except BaseException:
            sock.close()
            raise
        _note_caps(peer, caps)
        return sock, peer


async def _secured(
    sock: socket.socket, peer: str, handshake: Callable[..., tuple[Any, bytes]], *args: Any
) -> tuple[socket.socket, str]:
    """The peer handshake (`PeerSecurity.accept` or `connect`) on a thread; its TLS socket,
    made ready for exchanges. The plain socket is closed if it fails."""
    try:
        tls, caps = await asyncio.to_thread(handshake, sock, *args)
    except BaseException:
        sock.close()
        raise
    _prepare(tls)
    _note_caps(peer, caps)
    return tls, peer


def _prepare(sock: socket.socket) -> None:
    sock.setblocking(False)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def _recv_caps(loop: asyncio.AbstractEventLoop, sock: socket.socket, peer: str) -> bytes:
    caps = bytearray(HELLO_CAPS_SIZE)
    view = memoryview(caps)
    while view.nbytes:
        n = await loop.sock_recv_into(sock, view)
        if n == 0:
            raise CommError(f"peer {peer} closed the link during the caps exchange")
        view = view[n:]
    return bytes(caps)


def _note_caps(peer: str, caps: bytes) -> None:
    if any(caps):  # our zero caps keep the link on TCP (spec §12)
        log.debug("peer %s offered RDMA caps %s; staying on TCP", peer, caps.hex())


def _name(addr: Any) -> str:
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)
