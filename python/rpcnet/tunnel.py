"""`rpcnet tunnel`: a local plain-TCP forwarder that llama.cpp connects to unchanged.

For every client connection it opens one TLS 1.3 connection to the server, verifies the server
(a CA, or a pinned SHA-256 certificate fingerprint) before sending anything, presents the token
(the preamble of `rpcnet.server.tokens`), waits for the server's answer, and then moves bytes
both ways. Forwarding is protocol-level (uvloop's buffers, no per-byte Python work): each
received chunk is handed to the other transport's `write`, and a transport whose write buffer
fills pauses reading on the other side.

Each connection logs one line when it is established: listen address, server, TLS version and
cipher, the server certificate's fingerprint and the tenant the server answered. `rpcnet caps`
pointed at a listen address asks the tunnel for the same facts about its own connection.

Tensor split (spec §11): the client tells rank 1 where rank 0 is as it sees it, a listen address
of this tunnel, and the comm port as that port + 1000. The tunnel reads the client's frame
boundaries (`rpcnet.tunnelwire`) and rewrites COMM_INIT: rank 1 gets the real rank-0 server's
host and its port + 1000, rank 0 listens on its own port + 1000. Both routes must be in the same
tunnel (one `--listen`/`--to` pair per server). The servers' link is TLS with the tenant's token
(`rpcnet.server.peertls`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpcnet.server.tokens import (
    ACCEPTED,
    ANSWER_HEAD,
    PreambleError,
    encode_request,
    parse_answer_head,
)
from rpcnet.transport import tls as tlsmod
from rpcnet.tunnelwire import RequestScanner, rewrite_comm_init, status_frame

log = logging.getLogger("rpcnet.tunnel")

WRITE_HIGH = 4 << 20  # bytes queued on one side before the other side stops reading
COMM_PORT_OFFSET = 1000  # the client's comm port is rank 0's port + 1000 (spec §11.1)
WILDCARD = ("", "0.0.0.0", "::")


class TunnelError(Exception):
    """The server could not be reached, verified, or refused the token."""


@dataclass(frozen=True)
class Route:
    listen: tuple[str, int]
    to: tuple[str, int]
    fingerprint: str | None  # pinned SHA-256 (lowercase hex), or None with a CA


@dataclass(frozen=True)
class TunnelConfig:
    routes: tuple[Route, ...]
    token: bytes
    ca: Path | None = None
    server_name: str | None = None
    timeout: float = 10.0

    @classmethod
    def from_args(
        cls,
        listen: list[tuple[str, int]],
        to: list[tuple[str, int]],
        token_file: Path,
        ca: Path | None,
        fingerprints: list[str],
        server_name: str | None = None,
        timeout: float = 10.0,
    ) -> TunnelConfig:
        if len(listen) != len(to):
            raise ValueError(f"{len(listen)} --listen for {len(to)} --to: give one per server")
        if ca is None and len(fingerprints) not in (1, len(to)):
            raise ValueError("give one --fingerprint, or one per --to")
        pins: list[str | None] = [None] * len(to)
        if fingerprints:
            parsed = [tlsmod.parse_fingerprint(f) for f in fingerprints]
            pins = list(parsed * len(to) if len(parsed) == 1 else parsed)
        try:
            token = token_file.read_text().strip().encode()
        except OSError as exc:
            raise ValueError(f"--token-file {token_file}: {exc}") from exc
        if not token or len(token.split()) != 1:
            raise ValueError(f"--token-file {token_file}: expected the token alone")
        routes = tuple(Route(a, b, pin) for a, b, pin in zip(listen, to, pins, strict=True))
        return cls(routes, token, ca, server_name, timeout)


class _Secure(asyncio.Protocol):
    """The TLS side: first the token answer, then bytes for the client."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.peer: Any = None  # the client's transport once the tunnel is open
        self.answer: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self._head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.peer is not None:
            self.peer.write(data)
            return
        self._head += data
        if len(self._head) < ANSWER_HEAD.size or self.answer.done():
            return
        try:
            status, length = parse_answer_head(self._head[: ANSWER_HEAD.size])
        except PreambleError as exc:
            self.answer.set_exception(TunnelError(str(exc)))
            return
        end = ANSWER_HEAD.size + length
        if len(self._head) >= end:
            name = self._head[ANSWER_HEAD.size : end].decode(errors="replace")
            self._head = self._head[end:]  # the server sends nothing else before a request
            self.answer.set_result((status, name))

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(
                TunnelError("the server closed the connection (wrong token?)")
            )
        if self.peer is not None:
            self.peer.close()

    def pause_writing(self) -> None:
        if self.peer is not None:
            self.peer.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None:
            self.peer.resume_reading()


class _Plain(asyncio.Protocol):
    """The llama.cpp side. Until the TLS side is open and accepted, what arrives is kept (a
    HELLO, typically) and reading pauses. Its bytes pass through a `RequestScanner`."""

    def __init__(self, tunnel: Tunnel, route: Route) -> None:
        self.tunnel, self.route = tunnel, route
        self.transport: Any = None
        self.secure: Any = None  # the TLS transport once open
        self.closed = False
        self.early: list[bytes] = []  # what the client sent before the TLS side was ready
        self.status: dict[str, Any] = {}  # this connection's TLS facts, for STATUS
        self.who = "?"
        self.scanner = RequestScanner(self._rewrite, self._answer_status)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH)  # type: ignore[attr-defined]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        self.who = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.tunnel.opened(self)

    def data_received(self, data: bytes) -> None:
        secure = self.secure
        if secure is not None:
            parts = self.scanner.feed(data)
            if len(parts) == 1:
                secure.write(parts[0])  # encrypted at once (uvloop's TLS protocol)
            elif parts:
                secure.writelines(parts)
            return
        self.early.append(data)
        if len(self.early) == 1:
            self.transport.pause_reading()

    def open(self, secure: Any) -> None:
        """The TLS side is accepted: send what came early, then forward as it comes."""
        self.secure = secure
        early, self.early = self.early, []
        for data in early:
            parts = self.scanner.feed(data)
            if parts:
                secure.writelines(parts)
        self.transport.resume_reading()

    def _rewrite(self, payload: bytes) -> bytes:
        new, change = rewrite_comm_init(payload, self.tunnel.comm_mapping(self.route))
        if change is not None:
            old_host, old_port, host, port = change
            log.info(
                "%s: COMM_INIT: rank 0 at %s:%d -> %s:%d", self.who, old_host or "(self)",
                old_port, host or "(self)", port,
            )
        return new

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
            self.secure.pause_reading()

    def resume_writing(self) -> None:
        if self.secure is not None:
            self.secure.resume_reading()


class Tunnel:
    def __init__(self, config: TunnelConfig) -> None:
        self.config = config
        self.context = tlsmod.client_context(config.ca)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.opened_count = 0  # tunnels established (tests, status)

    @property
    def ports(self) -> list[int]:
        return [s.sockets[0].getsockname()[1] for s in self._servers]

    def comm_mapping(self, own: Route) -> Callable[[int, str, int], tuple[str, int] | None]:
        """How COMM_INIT's rank-0 address is rewritten on a connection of route `own`: rank 0
        listens on its server's port + 1000; rank 1 is sent to the server behind the listen
        address the client named. Unknown addresses stay as they are."""
        bound = [s.sockets[0].getsockname()[:2] for s in self._servers]

        def mapping(rank: int, host: str, port: int) -> tuple[str, int] | None:
            for route, (lhost, lport) in zip(self.config.routes, bound, strict=False):
                if port != lport + COMM_PORT_OFFSET:
                    continue
                if rank == 0 and route is own:
                    return "", route.to[1] + COMM_PORT_OFFSET
                same_host = host == lhost or lhost in WILDCARD or (
                    host == "localhost" and lhost.startswith("127.")
                )
                if rank != 0 and same_host:
                    return route.to[0], route.to[1] + COMM_PORT_OFFSET
            return None

        return mapping

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for route in self.config.routes:
            server = await loop.create_server(
                lambda route=route: _Plain(self, route),  # type: ignore[misc]
                route.listen[0],
                route.listen[1],
                reuse_address=True,
            )
            self._servers.append(server)
            host, port = server.sockets[0].getsockname()[:2]
            log.info(
                "rpcnet tunnel: %s:%d -> %s:%d (TLS 1.3, %s)",
                host,
                port,
                *route.to,
                "CA " + str(self.config.ca)
                if route.fingerprint is None
                else "pinned " + tlsmod.colon_hex(route.fingerprint),
            )

    def opened(self, plain: _Plain) -> None:
        task = asyncio.get_running_loop().create_task(self._connect(plain))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, plain: _Plain) -> None:
        who = plain.who
        route = plain.route
        target = f"{route.to[0]}:{route.to[1]}"
        transport = None
        try:
            transport, secure, status = await asyncio.wait_for(
                self._open(route), self.config.timeout
            )
        except asyncio.TimeoutError:
            timeout = self.config.timeout
            log.warning("%s: tunnel to %s: no answer within %.0f s", who, target, timeout)
        except (TunnelError, tlsmod.TlsSetupError) as exc:
            log.warning("%s: tunnel to %s: %s", who, target, exc)
        except ssl.SSLError as exc:
            why = getattr(exc, "verify_message", None) or exc.reason or str(exc)
            log.warning("%s: tunnel to %s: TLS handshake failed: %s", who, target, why)
        except (OSError, EOFError) as exc:
            log.warning("%s: tunnel to %s: %s", who, target, exc or type(exc).__name__)
        else:
            if plain.closed:
                transport.close()
                return
            secure.peer = plain.transport
            listen = plain.transport.get_extra_info("sockname")
            status["listen"] = f"{listen[0]}:{listen[1]}" if listen else "?"
            status["client"] = who
            plain.status = status
            plain.open(transport)
            self.opened_count += 1
            log.info(
                "%s: tunnel to %s: %s %s, server certificate sha256 %s, tenant %s",
                who,
                target,
                status["tls_version"],
                status["cipher"],
                tlsmod.colon_hex(status["fingerprint"]),
                status["tenant"] or "(server has no tokens)",
            )
            return
        plain.transport.abort()

    async def _open(self, route: Route) -> tuple[Any, _Secure, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        host, port = route.to
        server_name = (self.config.server_name or host) if route.fingerprint is None else None
        try:
            transport, secure = await loop.create_connection(
                _Secure,
                host,
                port,
                ssl=self.context,
                server_hostname=server_name,
                ssl_handshake_timeout=self.config.timeout,
            )
        except ConnectionAbortedError as exc:
            raise TunnelError(f"TLS handshake failed: {exc}") from exc
        try:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sslobj = transport.get_extra_info("ssl_object")
            der = sslobj.getpeercert(binary_form=True)
            if route.fingerprint is not None:
                fp = tlsmod.check_fingerprint(der, route.fingerprint)  # before the token leaves
            else:
                fp = tlsmod.fingerprint(der)
            transport.write(encode_request(self.config.token))
            answer, tenant = await secure.answer
            if answer != ACCEPTED:
                raise TunnelError("the server refused the token")
        except BaseException:
            transport.abort()
            raise
        cipher = sslobj.cipher()
        status: dict[str, Any] = {
            "server": f"{host}:{port}",
            "tls_version": sslobj.version(),
            "cipher": cipher[0] if cipher else "?",
            "fingerprint": fp,
            "verified_by": "pinned fingerprint" if route.fingerprint else f"CA {self.config.ca}",
            "tenant": tenant,
        }
        return transport, secure, status

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for server in self._servers:
            await server.wait_closed()


def run_tunnel(config: TunnelConfig) -> None:
    from rpcnet.server.app import run_loop

    async def main() -> None:
        tunnel = Tunnel(config)
        await tunnel.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):
                pass
        await stop.wait()
        await tunnel.close()

    run_loop(main())
