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
from dataclasses import dataclass, field

from rpcnet.protocol.commands import HELLO_CAPS_SIZE, NO_CAPS
from rpcnet.transport.base import ByteStream
from rpcnet.transport.caps import RdmaCaps, describe_caps
from rpcnet.transport.rdma import (
    RdmaActivationError,
    RdmaProvider,
    RdmaServerStream,
    RdmaTransport,
    RdmaUnavailable,
)

log = logging.getLogger("rpcnet.transport")


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
    remote = RdmaCaps.decode(caps)
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

    def connection(self, stream: ByteStream, peer: str) -> ConnectionNegotiation:
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
    """One server connection's negotiation, driven by its connection task: `answer` with the
    client's HELLO caps (before the response), `after_hello` once the response is written."""

    policy: ServerNegotiation
    stream: ByteStream
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

    async def after_hello(self, stream: ByteStream) -> ByteStream:
        """The stream for the rest of the connection: `stream` itself, or its RDMA upgrade."""
        if self.link is None:
            return stream
        link, self.link = self.link, None
        return RdmaServerStream(link, stream, self.peer)
