"""The per-connection task: reads frames, runs them through the session, executes its effects.

Each frame goes: header -> `_admit` (the codec's check) -> its row of the command table
(`rpcnet.server.command_table`: wait for this connection's graphs? how is the payload received?)
-> the row's session handler -> the `Effect` it returns (`rpcnet.server.effects`) -> the one
executor of that effect kind. Byte movement, ordering and every other I/O of a connection live
here: HELLO's transport activation, the direct receive of SET_TENSOR, cache-file reads and writes,
the COMM_* peer links, launching plans. The session (sans-I/O) decides; this module does. Every
client error ends in one log line naming the client, command and reason, and the session is
freed; other connections never notice.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import struct
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Protocol

from rpcnet import _native
from rpcnet.compute.backend import HostSink
from rpcnet.compute.device import Device
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.shared_content import SHARE_MIN
from rpcnet.compute.shared_content import enabled as sharing_enabled
from rpcnet.protocol import messages as msg
from rpcnet.protocol.commands import HEADER_SIZE, Cmd
from rpcnet.server.cache import HashCache
from rpcnet.server.comm import CommHub
from rpcnet.server.command_table import Command, Payload, rows
from rpcnet.server.config import ServerConfig
from rpcnet.server.effects import (
    CacheRead,
    Effect,
    LaunchPlan,
    PeerAllreduce,
    PeerClose,
    PeerOpen,
    ReceiveInto,
)
from rpcnet.server.peer_links import LinkFailed, PeerLinks
from rpcnet.server.session import ProtocolViolation, Session, SessionLimits
from rpcnet.server.stats import ConnectionStats, ServerStats
from rpcnet.server.tenants import Tenants
from rpcnet.server.tokens import (
    ACCEPTED,
    REFUSED,
    REQUEST_HEAD,
    PreambleError,
    Tenant,
    encode_answer,
    is_preamble_start,
    parse_request_head,
)
from rpcnet.transport.base import ByteStream, ConnectionClosed
from rpcnet.transport.negotiate import ServerNegotiation
from rpcnet.transport.tlssocket import TlsHandshakeTimeout

log = logging.getLogger("rpcnet.server")

# What a client's bad input raises: it closes that connection only, with one log line.
CLIENT_ERRORS = (ProtocolViolation, ComputeError, _native.NativeError)
_HEADER = struct.Struct("<BQ")
_SIZE = struct.Struct("<Q")
LARGE_WRITE = 64 * 1024
# A GPU's SET_TENSOR payloads up to this size are received whole in the protocol callback
# (a decode step's inputs), larger ones piece by piece through the bounded staging slots.
SMALL_STAGED_SET = 256 * 1024
HELLO = int(Cmd.HELLO)
UNCOUNTED = contextlib.nullcontext()  # a fixed payload: a few KiB at most, never counted


class Host(Protocol):
    """What a connection uses of its server (`rpcnet.server.app.Server`)."""

    config: ServerConfig
    devices: list[Device]
    cache: HashCache | None
    negotiation: ServerNegotiation
    comm: CommHub
    stats: ServerStats
    tls: ssl.SSLContext | None  # --tls-cert / --tls-self-signed: TLS 1.3 before anything else
    tenants: Tenants | None  # --tokens: a token preamble before the first command

    def cache_for(self, tenant: str | None) -> Any: ...


class Refused(Exception):
    """The connection did not pass TLS or the token check: closed with one log line."""

    def __init__(self, reason: str, metric: str) -> None:
        super().__init__(reason)
        self.metric = metric  # rpcnet_refused_connections_total{reason=...}


TLS_RECORD_START = 0x16  # a TLS handshake record: what a TLS client sends to a plain port first


class Connection:
    def __init__(self, server: Host, stream: ByteStream, peer: str) -> None:
        self.server = server
        self.stream = stream
        self.peer = peer
        config = server.config
        limits = SessionLimits(graph_nodes=config.max_graph_nodes, client_mem=config.client_mem)
        self.negotiation = server.negotiation.connection(stream, peer)  # HELLO caps, spec §12
        self.cache: Any = server.cache  # HashCache-like; a tenant's namespace once known
        self.session = Session(config.proto, server.devices, limits, caching=self.cache is not None)
        self.rows = rows(config.proto)  # the command table by plain int id
        self.peers = PeerLinks(server.comm, self.session, self._link_failed)  # COMM_* (§11)
        self.tenant: Tenant | None = None  # who presented which token (--tokens)
        self._gated = server.tls is not None or server.tenants is not None
        self.stats: ConnectionStats  # metrics and the close log line; opened once admitted
        self._opened = False
        if not self._gated:
            self._open_stats()
        # every device's memory is host memory: SET_TENSOR can land from the protocol callback
        self._host_resident = all(d.backend.host_resident for d in server.devices)
        self.cmd = int(Cmd.HELLO)
        self._task: asyncio.Task[None] | None = None
        self._idle = False  # waiting for the next frame: safe to cancel
        self._receiving = False  # a fast-path SET_TENSOR payload is still arriving
        self._failure: ProtocolViolation | None = None  # a launched allreduce failed
        self._stopping = False

    def _open_stats(self) -> None:
        self.stats = self.server.stats.open_connection(self.peer, self.session)
        self._opened = True

    def revoke(self, why: str) -> None:
        """Close now (the tenant's token is gone): logged here, the task ends quietly."""
        log.warning("%s: closing connection: %s", self.peer, why)
        self._stopping = True
        getattr(self.stream, "abort", self.stream.close)()
        if self._idle and not self._receiving and self._task is not None:
            self._task.cancel()

    @property
    def current(self) -> str:
        return _native.command_name(self.server.config.proto, self.cmd)

    def stop_after_command(self) -> None:
        """Server drain: finish the command in progress (if any), then close."""
        self._stopping = True
        if self._idle and not self._receiving and self._task is not None:
            self._task.cancel()

    async def run(self) -> None:
        self._task = asyncio.current_task()
        self.peers.loop = asyncio.get_running_loop()
        try:
            if self._gated:
                await self._admit_connection()
            await self._serve()
        except Refused as exc:
            log.warning("%s: refused: %s", self.peer, exc)
            self.server.stats.refuse(exc.metric)
        except asyncio.CancelledError:
            if self._stopping and self._opened:
                return  # drained or revoked
            if self._failure is None:
                raise
            log.warning("%s: closing connection: COMM_ALLREDUCE: %s", self.peer, self._failure)
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
            self.peers.close_all()
            await self._finish_graphs()
            if self._opened:
                self.stats.close()
            released = self.session.close()
            log.debug("%s: released %d bytes", self.peer, released)

    # ------------------------------------------------------------ TLS and the token

    async def _admit_connection(self) -> None:
        """TLS handshake (--tls-*), then the token preamble (--tokens); `Refused` otherwise."""
        server, timeout = self.server, self.server.config.hello_timeout
        tls = server.tls
        if tls is not None:
            finish_tls = getattr(self.stream, "finish_tls", None)
            assert finish_tls is not None, "TLS needs the TCP stream"
            try:
                await finish_tls()
            except TlsHandshakeTimeout as exc:
                raise Refused(f"no TLS handshake within {timeout:.0f} s", "tls") from exc
            except ssl.SSLError as exc:
                hint = ""
                if exc.reason in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "UNSUPPORTED_PROTOCOL"):
                    hint = " (a plain TCP client on a TLS port? connect through rpcnet tunnel)"
                raise Refused(f"TLS handshake failed: {exc.reason or exc}{hint}", "tls") from exc
            except (OSError, EOFError) as exc:
                why = str(exc) or f"{type(exc).__name__} (the client gave up: wrong certificate?)"
                raise Refused(f"TLS handshake failed: {why}", "tls") from exc
        try:
            await asyncio.wait_for(self._token(), timeout)
        except asyncio.TimeoutError as exc:
            raise Refused(f"no token preamble within {timeout:.0f} s", "token") from exc
        except ConnectionClosed as exc:
            raise Refused("closed before presenting a token", "token") from exc
        self._open_stats()
        if self.tenant is not None:
            self.stats.peer = f"{self.peer} ({self.tenant.name})"

    async def _token(self) -> None:
        tenants = self.server.tenants
        stream = self.stream
        if tenants is None:  # TLS alone: a tunnel may still send a preamble; answer it
            await stream.at_eof()
            staged = stream.staged()
            if staged and is_preamble_start(staged[0]):
                await stream.readexactly(parse_request_head(await stream.readexactly(10)))
                stream.write(encode_answer(ACCEPTED, ""))
            return
        try:
            length = parse_request_head(await stream.readexactly(REQUEST_HEAD.size))
        except PreambleError as exc:
            raise Refused(str(exc), "token") from exc
        tenant = tenants.authenticate(await stream.readexactly(length))
        if tenant is None:
            stream.write(encode_answer(REFUSED))
            raise Refused("wrong token", "token")
        self.tenant = tenant
        self.session.join(tenants.share(tenant))
        self.cache = self.server.cache_for(tenant.name)
        stream.write(encode_answer(ACCEPTED, tenant.name))
        log.debug("%s: tenant %s", self.peer, tenant.name)

    # ------------------------------------------------------------ the frame loop

    def _admit(self, cmd: int, size: int, *, first: bool = False) -> None:
        """Header checks shared by every path that starts a frame (spec §3, §2)."""
        config = self.server.config
        if first and cmd != HELLO:
            name = _native.command_name(config.proto, cmd)
            raise ProtocolViolation(f"first command must be HELLO, got {name}")
        self.cmd = cmd
        _native.check_header(config.proto, cmd, size, config.max_data, config.max_graph)
        if not first and cmd == HELLO:
            raise ProtocolViolation("HELLO is only allowed as the first command")

    async def _serve(self) -> None:
        client_caps = await asyncio.wait_for(self._read_hello(), self.server.config.hello_timeout)
        session, table = self.session, self.rows
        # Transport activation happens here: the handler answers with what it decided (see
        # transport/negotiate.py), and the reply goes out before the transport changes.
        hello = table[HELLO]
        assert hello is not None
        self._execute(hello.handler(session, self.negotiation.answer(client_caps)))
        self.stats.end()
        stream = self.stream = await self.negotiation.after_hello(self.stream)  # RDMA or same
        stream.fast_path = self._fast_path
        while True:
            if self._failure is not None:
                raise self._failure
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
            self._admit(cmd, size)
            row = table[cmd]
            assert row is not None  # admitted: a command of this dialect
            if row.waits:
                await self._wait_graphs()
            if row.prefix:  # streamed: the data goes where it belongs, not into a payload
                head = await stream.readexactly(row.prefix)
                work = self._execute(row.handler(session, head, size - row.prefix))
                if work is not None:
                    await work
            else:
                staged = row.payload is Payload.STAGED
                with session.staging(size) if staged else UNCOUNTED:  # --mem, --client-mem
                    work = self._execute(row.handler(session, await stream.readexactly(size)))
                    if work is not None:
                        await work
            self.stats.end()

    async def _read_hello(self) -> bytes:
        cmd, size = await self._header()
        if cmd == TLS_RECORD_START and size & 0xFF == 0x03:  # 16 03 ..: a TLS ClientHello
            raise ProtocolViolation(
                "a TLS handshake on a plain TCP port (serve with --tls-cert/--tls-self-signed, "
                "or connect without TLS)"
            )
        self._admit(cmd, size, first=True)
        return await self.stream.readexactly(size)

    def _fast_path(self) -> None:
        """Handle complete, simple frames already staged, from the protocol callback.

        Same semantics as the coroutine loop; anything that must wait (payload not all here,
        a command that needs I/O, an unfinished graph, a full socket) is left for it.
        """
        stream, session, table = self.stream, self.session, self.rows
        execute, respond = _EXECUTORS.get, Connection._respond  # `_execute`, inlined below
        while stream.write_ready and self._failure is None:
            data = stream.staged()
            if len(data) < HEADER_SIZE:
                return
            cmd, size = _HEADER.unpack_from(data)
            row = table[cmd]
            if row is None or not row.in_callback:
                return  # the coroutine's (and an unknown command the coroutine's to reject)
            if row.waits and session.has_pending():
                return
            if row.prefix:  # streamed
                if not self._fast_receive(row, data, size):
                    return
                continue
            if len(data) - HEADER_SIZE < size:
                return
            self._admit(cmd, size)
            payload = bytes(data[HEADER_SIZE : HEADER_SIZE + size])
            stream.consume(HEADER_SIZE + size)
            self.stats.begin(cmd, size)
            effect = row.handler(session, payload)
            work = execute(type(effect), respond)(self, effect)
            assert work is None, "the effects of callback rows need no awaiting"
            self.stats.end()

    def _fast_receive(self, row: Command, data: memoryview, size: int) -> bool:
        """SET_TENSOR from the protocol callback once its prefix is staged: the payload goes
        straight into device memory. False: left to the coroutine (or receiving still)."""
        prefix_end = HEADER_SIZE + row.prefix
        if len(data) < prefix_end or size < row.prefix:
            return False  # (a too-short frame is the coroutine's to reject)
        cache = self.cache
        if data[HEADER_SIZE + msg.TENSOR] and cache is not None and cache.writable:
            return False  # the cache write runs on a thread: the coroutine does it
        if not self._host_resident and size > SMALL_STAGED_SET:
            return False  # large GPU payloads go through bounded staging, piece by piece
        if size - row.prefix >= SHARE_MIN and sharing_enabled():
            return False  # may be shared: identified on a thread by the coroutine
        cmd = int(row.cmd)
        self._admit(cmd, size)
        prefix = bytes(data[HEADER_SIZE:prefix_end])
        stream = self.stream
        stream.consume(prefix_end)
        self.stats.begin(cmd, size)
        target: ReceiveInto = row.handler(self.session, prefix, size - row.prefix)
        sink = target.sink
        # whole() is the buffer region itself on the CPU; commit() moves staged bytes to a GPU
        if stream.receive_into(sink.whole(), functools.partial(self._fast_set_done, sink)):
            sink.commit()
            self.stats.end()
            return True
        self._receiving = True
        return False

    def _fast_set_done(self, sink: HostSink) -> None:
        self._receiving = False
        sink.commit()
        self.stats.end()
        stop = self._stopping or self._failure is not None
        if stop and self._idle and self._task is not None:  # drain, or a failed link
            self._task.cancel()

    # ------------------------------------------------------------ effects

    def _execute(self, effect: Effect) -> Coroutine[Any, Any, None] | None:
        """Carry out what a handler returned: the awaitable of an effect that waits for I/O.
        Anything but the effect types is a reply (bytes, a memoryview, or None: no reply)."""
        return _EXECUTORS.get(type(effect), Connection._respond)(self, effect)

    async def _receive_into(self, target: ReceiveInto) -> None:
        for piece in target.sink.pieces():  # CPU: one piece, the device memory itself
            await self.stream.readinto(piece)
        if target.settle is not None:  # identify (may hash it all) and share, off the loop
            await asyncio.to_thread(target.settle)
        cache = self.cache
        if target.cache and cache is not None and cache.writable:
            # Hash and store straight from device memory on a thread (GIL released while
            # hashing); this connection waits, so nothing can change those bytes meanwhile.
            await asyncio.to_thread(target.store_in, cache)

    async def _cache_read(self, lookup: CacheRead) -> None:
        cache = self.cache
        assert cache is not None  # the session asks for reads only when there is a cache
        # The file read and the hash check run on a thread; the entry lands in device memory
        # (a GPU backend copies it there after the check), or a held copy is shared.
        found = await asyncio.to_thread(lookup.run, cache)
        self._respond(self.session.set_tensor_hash_response(found))

    def _launch_plan(self, launch: LaunchPlan) -> None:
        session, device = self.session, launch.device
        session.launch(device, device.plan_work(launch.plan, session))

    async def _peer_open(self, effect: PeerOpen) -> None:
        self._respond(await self.peers.open(effect, self.tenant))

    def _peer_allreduce(self, job: PeerAllreduce) -> None:
        self.peers.allreduce(job)

    def _peer_close(self, effect: PeerClose) -> None:
        self.peers.close(effect.device)

    def _link_failed(self, exc: LinkFailed) -> None:
        if self._failure is not None:
            return
        self.peers.close(exc.device)
        self._failure = self.session.comm_failed(exc.device, exc.reason)
        if self._idle and not self._receiving and self._task is not None:
            self._task.cancel()  # waiting for a frame: close now (logged in run)

    async def _header(self) -> tuple[int, int]:
        cmd, size = _HEADER.unpack(await self.stream.readexactly(HEADER_SIZE))
        self.stats.begin(cmd, size)
        return cmd, size

    def _respond(self, payload: object) -> None:
        """Send a reply payload (None: the command has no reply)."""
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
            self.stream.writelines([header, view])  # zero-copy; see the drain() in _serve

    async def _wait_graphs(self) -> None:
        pending = self.session.take_pending()
        await _tail_done(pending)
        for fut in pending:  # all done now: the first failure, in launch order
            try:
                fut.result()
            except ComputeError:
                raise
            except LinkFailed as exc:
                self._link_failed(exc)
                assert self._failure is not None
                raise self._failure from exc
            except Exception as exc:  # kernels failing on client data: close, do not crash
                raise ComputeError(f"graph execution failed: {type(exc).__name__}: {exc}") from exc

    async def _finish_graphs(self) -> None:
        # Memory a running plan still touches must outlive it; failures no longer matter.
        await _tail_done(self.session.take_pending())


async def _tail_done(pending: list[Future[None]]) -> None:
    """Until every future of `pending` (one connection's launched work) is done.

    The chain runs each job after the one launched before it (`server/chain.py`), so they finish
    in launch order and waiting for the last is waiting for all: the event loop is woken once,
    not once per graph piece and allreduce of a tensor-split decode step (~33 per token), each
    wake-up a write to the loop's pipe from the worker and a turn of the loop on a busy core.
    """
    if not pending:
        return
    for fut in reversed(pending):  # the last at once; the others only if order ever broke
        if fut.done():
            continue
        try:
            await asyncio.wrap_future(fut)
        except Exception:  # the caller reads every outcome, in launch order
            pass


# The one executor of each effect kind; replies go to `Connection._respond`.
_EXECUTORS: dict[type, Callable[[Connection, Any], Coroutine[Any, Any, None] | None]] = {
    ReceiveInto: Connection._receive_into,
    CacheRead: Connection._cache_read,
    LaunchPlan: Connection._launch_plan,
    PeerOpen: Connection._peer_open,
    PeerAllreduce: Connection._peer_allreduce,
    PeerClose: Connection._peer_close,
}
