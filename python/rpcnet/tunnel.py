"""`rpcnet tunnel`: a local plain-TCP forwarder that llama.cpp connects to unchanged.

For every client connection it opens one TLS 1.3 connection to the server, verifies the server
(a CA, or a pinned SHA-256 certificate fingerprint) before sending anything, presents the token
(the preamble of `rpcnet.server.tokens`), waits for the server's answer, and then moves bytes
both ways (`rpcnet.tunnelio`: OpenSSL reads and writes the TLS socket itself, no per-byte
Python work, and a side that cannot take more pauses reading on the other).

Each connection logs one line when it is established: listen address, server, TLS version and
cipher, the server certificate's fingerprint and the tenant the server answered. `rpcnet caps`
pointed at a listen address asks the tunnel for the same facts about its own connection.

Tensor split (spec §11): the client tells rank 1 where rank 0 is as it sees it, a listen address
of this tunnel, and the comm port as that port + 1000. The tunnel reads the client's frame
boundaries (`rpcnet.tunnelwire`) and rewrites COMM_INIT: rank 1 gets the real rank-0 server's
host and its port + 1000, rank 0 listens on its own port + 1000. A rank-0 address that is no
route of this tunnel but on loopback is asked for its server (another tunnel's STATUS answer)
while the client's later bytes wait. The servers' link is TLS with the tenant's token
(`rpcnet.server.peertls`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rpcnet.server.tokens import PreambleError
from rpcnet.transport import tls as tlsmod
from rpcnet.tunnelio import PlainSide, TlsSide, TunnelError, open_tls, query_status
from rpcnet.tunnelwire import COMM_INIT_BODY, rewrite_comm_init

log = logging.getLogger("rpcnet.tunnel")

COMM_PORT_OFFSET = 1000  # the client's comm port is rank 0's port + 1000 (spec §11.1)
WILDCARD = ("", "0.0.0.0", "::")


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


class Tunnel:
    def __init__(self, config: TunnelConfig) -> None:
        self.config = config
        self.context = tlsmod.client_context(config.ca)
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.opened_count = 0  # tunnels established (tests, status)
        self.sides: weakref.WeakSet[PlainSide] = weakref.WeakSet()  # live client connections

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
                same_host = (
                    host == lhost
                    or lhost in WILDCARD
                    or (host == "localhost" and lhost.startswith("127."))
                )
                if rank != 0 and same_host:
                    return route.to[0], route.to[1] + COMM_PORT_OFFSET
            return None

        return mapping

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        for route in self.config.routes:
            server = await loop.create_server(
                lambda route=route: self._plain_side(route),  # type: ignore[misc]
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

    def _plain_side(self, route: Route) -> PlainSide:
        side: PlainSide

        def log_change(change: tuple[str, int, str, int] | None) -> None:
            if change is not None:
                old_host, old_port, host, port = change
                log.info(
                    "%s: COMM_INIT: rank 0 at %s:%d -> %s:%d",
                    side.who,
                    old_host or "(self)",
                    old_port,
                    host or "(self)",
                    port,
                )

        def rewrite(payload: bytes) -> bytes | None:
            new, change = rewrite_comm_init(payload, self.comm_mapping(route))
            if change is None and other_tunnel(payload) is not None:
                return None  # another tunnel's listen address: ask it (complete)
            log_change(change)
            return new

        async def complete(payload: bytes) -> bytes:
            """Rank 1's COMM_INIT naming another tunnel on this machine: that tunnel's
            server, from its STATUS answer."""
            host, port = other_tunnel(payload) or ("", 0)
            info = await query_status(host, port - COMM_PORT_OFFSET, self.config.timeout)
            server = (info or {}).get("server", "")
            to_host, _, to_port = str(server).rpartition(":")
            if not to_host or not to_port.isdigit():
                log.warning(
                    "%s: COMM_INIT: rank 0 at %s:%d is no rpcnet tunnel; passed on as it is",
                    side.who,
                    host,
                    port,
                )
                return payload
            target = (to_host, int(to_port) + COMM_PORT_OFFSET)
            new, change = rewrite_comm_init(payload, lambda rank, h, p: target)
            log_change(change)
            return new

        side = PlainSide(lambda plain: self.opened(plain, route), rewrite, complete)
        return side

    def opened(self, plain: PlainSide, route: Route) -> None:
        self.sides.add(plain)
        task = asyncio.get_running_loop().create_task(self._connect(plain, route))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, plain: PlainSide, route: Route) -> None:
        who = plain.who
        target = f"{route.to[0]}:{route.to[1]}"
        config = self.config
        server_name = (config.server_name or route.to[0]) if route.fingerprint is None else None
        try:
            channel, status = await asyncio.to_thread(
                open_tls,
                route.to,
                self.context,
                server_name,
                route.fingerprint,
                config.token,
                config.timeout,
            )
        except (TunnelError, tlsmod.TlsSetupError, PreambleError) as exc:
            log.warning("%s: tunnel to %s: %s", who, target, exc)
        except (OSError, EOFError) as exc:
            log.warning("%s: tunnel to %s: %s", who, target, exc or type(exc).__name__)
        else:
            if plain.closed:
                channel.close()
                return
            if route.fingerprint is None:
                status["verified_by"] = f"CA {config.ca}"
            listen = plain.transport.get_extra_info("sockname")
            status["listen"] = f"{listen[0]}:{listen[1]}" if listen else "?"
            status["client"] = who
            plain.status = status
            plain.attach(TlsSide(channel, plain))
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

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for server in self._servers:
            await server.wait_closed()


def other_tunnel(payload: bytes) -> tuple[str, int] | None:
    """Rank 1's COMM_INIT naming a loopback rank 0 (an address on the client's machine: another
    tunnel, if anything) as (host, port); None otherwise."""
    _, rank, _, port, raw = COMM_INIT_BODY.unpack(payload)
    host = raw.split(b"\0", 1)[0].decode("ascii", "replace")
    loopback = host == "localhost" or host.startswith("127.") or host == "::1"
    return (host, port) if rank == 1 and loopback and port > COMM_PORT_OFFSET else None


def run_tunnel(config: TunnelConfig) -> None:
    from rpcnet.server.app import freeze_startup_objects, run_loop

    async def main() -> None:
        tunnel = Tunnel(config)
        await tunnel.start()
        freeze_startup_objects()
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
