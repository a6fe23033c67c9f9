"""Transport negotiation through HELLO's conn_caps (spec §2, §12), and the one log line that says
what happened.

Rule: a connection moves to RDMA only when both sides advertised non-zero caps and this side's
queue pair came up; otherwise it stays on TCP. Every decision is one `Outcome` whose `line()` is
logged once per connection on the "rpcnet.transport" logger:

    <peer>: transport TCP: client offered no RDMA                                   (DEBUG)
    <peer>: transport TCP: client offered RDMA (...); this side has none: <why>     (INFO)
    <peer>: transport TCP: RDMA activation failed: <why>; ...                       (WARNING)
    <peer>: transport RDMA: qpn 0x.. -> 0x.., <device> port <n> GID <i> (RoCE v2), ...  (INFO)

Server side: the server probes *and activates* before it answers HELLO (the client's caps are in
the request), so it only ever advertises caps it can use: any failure answers zero caps and the
client stays on TCP cleanly. The reference answers first and activates afterwards; a peer cannot
tell the difference except that a failing rpcnet server never leaves the client half-upgraded.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field
from typing import Any

from rpcnet.caps import describe_caps
from rpcnet.protocol import messages as msg
from rpcnet.protocol.commands import HELLO, HELLO_CAPS_SIZE, HELLO_RESPONSE_SIZE, NO_CAPS
from rpcnet.transport.base import Transport, TransportError
from rpcnet.transport.rdma import (
    RdmaActivationError,
    RdmaEndpoint,
    RdmaProvider,
    RdmaServerStream,
    RdmaTransport,
    RdmaUnavailable,
    RemoteCaps,
)
from rpcnet.transport.tcp import TcpTransport

log = logging.getLogger("rpcnet.transport")

_SIZE = struct.Struct("<Q")


@dataclass(frozen=True)
class Outcome:
    transport: str  # "TCP" or "RDMA"
    reason: str
    level: int = logging.INFO
    cause: str | None = None  # why this side has no RDMA (the same for every connection)

    def line(self, who: str) -> str:
        return f"{who}: transport {self.transport}: {self.reason}"


def decide(
    local_caps: bytes,
    remote_caps: bytes,
    *,
    remote: str = "peer",
    local_reason: str | None = None,
    activation_error: str | None = None,
    detail: str = "",
) -> Outcome:
    """The transport a connection ends on, given both caps and what activation did.

    `remote` names the other side ("client"/"server"), `local_reason` why this side advertised
    zero caps, `activation_error` why bringing the QP up failed, `detail` what RDMA runs on.
    """
    offered = any(remote_caps)
    have = any(local_caps)
    if not offered and not have:
        why = f"{remote} offered no RDMA"
        if local_reason:
            why += f"; this side has none either: {local_reason}"
        return Outcome("TCP", why, logging.DEBUG)
    if not offered:
        return Outcome("TCP", f"{remote} offered no RDMA", logging.DEBUG)
    if not have:
        why = f"{remote} offered RDMA ({describe_caps(remote_caps)}); this side has none"
        cause = local_reason or "RDMA not configured"
        return Outcome("TCP", f"{why}: {cause}", logging.INFO, cause)
    if activation_error is not None:
        return Outcome(
            "TCP", f"RDMA activation failed: {activation_error}; staying on TCP", logging.WARNING
        )
    return Outcome("RDMA", detail or "both sides offered RDMA", logging.INFO)


def caps_problem(caps: bytes) -> str | None:
    """Why non-zero caps cannot be used with the Linux verbs transport, or None.

    The Apple (Thunderbolt) transport advertises `qpn u32, lid u16, reserved u16, gid[16]`; its
    UC queue pair and framed stream do not interoperate with the RC transport. Linux caps always
    carry psn == qpn & 0xFFFFFF, so anything else is treated as "not ours" and answered with TCP.
    """
    remote = RemoteCaps.decode(caps)
    if remote is not None and remote.psn != remote.qpn & 0xFFFFFF:
        return (
            f"caps are not the Linux verbs layout (psn {remote.psn:#x} != qpn {remote.qpn:#x} "
            "& 0xFFFFFF; Apple RDMA transport?)"
        )
    return None


# ------------------------------------------------------------------------------------------------
# server side


class ServerNegotiation:
    """A server's transport policy: which RDMA provider (if any) answers HELLO caps."""

    def __init__(self, provider: RdmaProvider | None = None) -> None:
        self.provider = provider
        self._said: set[str] = set()  # "no RDMA because ..." lines already logged at INFO

    @classmethod
    def from_env(cls) -> ServerNegotiation:
        """pyverbs when a client asks for RDMA (imported then, lazily); GGML_RPC_NO_RDMA,
        GGML_RDMA_DEV, GGML_RDMA_GID and their RPCNET_* forms apply per connection."""
        from rpcnet.transport.rdma import PyverbsProvider

        return cls(PyverbsProvider())

    def connection(self, stream: Any, peer: str) -> ConnectionNegotiation:
        return ConnectionNegotiation(self, stream, peer)

    def report(self, peer: str, outcome: Outcome) -> None:
        level = outcome.level
        if outcome.cause is not None and level == logging.INFO:
            # The same "this server has no RDMA" cause for every connection of a client that
            # offers it: say it once at INFO, then at DEBUG.
            if outcome.cause in self._said:
                level = logging.DEBUG
            self._said.add(outcome.cause)
        log.log(level, "%s", outcome.line(peer))


@dataclass
class ConnectionNegotiation:
    """One server connection's negotiation: `answer` from Session.hello, `after_hello` from the
    connection task once the HELLO response is written."""

    policy: ServerNegotiation
    stream: Any
    peer: str
    outcome: Outcome | None = None
    link: RdmaTransport | None = field(default=None, repr=False)

    def _local_address(self) -> str | None:
        transport = getattr(self.stream, "transport", None)
        sockname = transport.get_extra_info("sockname") if transport is not None else None
        return sockname[0] if sockname else None

    def answer(self, client_caps: bytes) -> bytes:
        """Our HELLO caps. Non-zero only when the RDMA queue pair is already up."""
        caps, self.outcome = self._answer(bytes(client_caps))
        self.policy.report(self.peer, self.outcome)
        return caps

    def _answer(self, client_caps: bytes) -> tuple[bytes, Outcome]:
        if len(client_caps) != HELLO_CAPS_SIZE or not any(client_caps):
            return NO_CAPS, decide(NO_CAPS, NO_CAPS, remote="client")
        provider = self.policy.provider
        problem = caps_problem(client_caps)
        if problem is not None:
            return NO_CAPS, decide(NO_CAPS, client_caps, remote="client", local_reason=problem)
        if provider is None:
            reason = "this server has no RDMA transport configured"
            return NO_CAPS, decide(NO_CAPS, client_caps, remote="client", local_reason=reason)
        local = self._local_address()
        try:
            if local is None:
                raise RdmaUnavailable("the TCP socket has no local address")
            endpoint = provider.probe(local)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the answer is "TCP"
            why = str(exc) if isinstance(exc, RdmaUnavailable) else f"{type(exc).__name__}: {exc}"
            return NO_CAPS, decide(NO_CAPS, client_caps, remote="client", local_reason=why)
        try:
            self.link = endpoint.activate(client_caps)
        except RdmaActivationError as exc:
            why = f"{exc}; answered zero caps"
            return NO_CAPS, decide(endpoint.caps, client_caps, activation_error=why)
        return endpoint.caps, decide(
            endpoint.caps, client_caps, remote="client", detail=self.link.describe()
        )

    async def after_hello(self, stream: Any) -> Any:
        """The stream for the rest of the connection: `stream` itself, or its RDMA upgrade."""
        if self.link is None:
            return stream
        link, self.link = self.link, None
        return RdmaServerStream(link, stream, self.peer)


# ------------------------------------------------------------------------------------------------
# client side (blocking; `rpcnet caps` and tests)


class HelloFailed(ConnectionError):
    """The server did not answer HELLO as the protocol says."""


@dataclass
class ClientConnection:
    """A connected, negotiated client: `transport` is TCP or RDMA; `tcp` stays open."""

    tcp: TcpTransport
    transport: Transport
    version: tuple[int, int, int]
    client_caps: bytes
    server_caps: bytes
    outcome: Outcome
    offer_reason: str | None = None  # why the client advertised zero caps

    def send_request(self, cmd: int, payload: bytes = b"") -> None:
        # Three send_data() calls, like the reference client (spec §12: granularity matters).
        self.transport.send(bytes([cmd]))
        self.transport.send(_SIZE.pack(len(payload)))
        if payload:
            self.transport.send(payload)
        self.transport.flush()

    def recv_response(self, expected: int | None = None) -> bytes:
        (size,) = _SIZE.unpack(self.transport.recv(_SIZE.size))
        if expected is not None and size != expected:
            raise HelloFailed(f"response size {size}, expected {expected}")
        return self.transport.recv(size)

    def call(self, cmd: int, payload: bytes = b"", expected: int | None = None) -> bytes:
        self.send_request(cmd, payload)
        return self.recv_response(expected)

    def close(self) -> None:
        if self.transport is not self.tcp:
            self.transport.close()
        self.tcp.close()

    def __enter__(self) -> ClientConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_client(
    host: str,
    port: int,
    *,
    provider: RdmaProvider | None = None,
    timeout: float | None = 10.0,
    strict: bool = False,
) -> ClientConnection:
    """Connect, HELLO (offering RDMA when `provider` can), and move to RDMA when both offered.

    `strict`: the RDMA receiver refuses messages that do not line up with its reads, as the
    reference receiver would (tests use it to check the server's message boundaries).
    """
    tcp = TcpTransport.connect(host, port, timeout)
    endpoint: RdmaEndpoint | None = None
    offer_reason: str | None = None
    try:
        if provider is None:
            offer_reason = "RDMA not requested"
        else:
            try:
                endpoint = provider.probe(tcp.local_address())
            except RdmaUnavailable as exc:
                offer_reason = str(exc)
        client_caps = endpoint.caps if endpoint is not None else NO_CAPS
        tcp.send(bytes([HELLO]))
        tcp.send(_SIZE.pack(HELLO_CAPS_SIZE))
        tcp.send(client_caps)
        (size,) = _SIZE.unpack(tcp.recv(_SIZE.size))
        if size != HELLO_RESPONSE_SIZE:
            raise HelloFailed(f"HELLO response of {size} bytes, expected {HELLO_RESPONSE_SIZE}")
        rsp = tcp.recv(HELLO_RESPONSE_SIZE)
    except TransportError as exc:
        if endpoint is not None:
            endpoint.close()
        tcp.close()
        raise HelloFailed(f"HELLO failed: {exc}") from exc
    except BaseException:
        if endpoint is not None:
            endpoint.close()
        tcp.close()
        raise
    version, server_caps = msg.parse_hello_response(rsp)
    transport: Transport = tcp
    problem = caps_problem(server_caps)
    if endpoint is not None and any(server_caps) and problem is not None:
        endpoint.close()
        outcome = decide(NO_CAPS, server_caps, remote="server", local_reason=problem)
    elif endpoint is not None and any(server_caps):
        try:
            transport = endpoint.activate(server_caps, peer_closed=tcp.peer_closed, strict=strict)
            outcome = decide(client_caps, server_caps, remote="server", detail=transport.describe())
        except RdmaActivationError as exc:
            outcome = decide(client_caps, server_caps, activation_error=str(exc))
    else:
        if endpoint is not None:
            endpoint.close()
        outcome = decide(client_caps, server_caps, remote="server", local_reason=offer_reason)
    log.log(outcome.level, "%s", outcome.line(f"{host}:{port}"))
    return ClientConnection(
        tcp, transport, version, client_caps, server_caps, outcome, offer_reason
    )
