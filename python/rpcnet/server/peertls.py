"""TLS and the token on server-to-server peer links (COMM_INIT, spec §11) of a `--tls-*` server.

A TLS server's peer links are TLS 1.3 too, set up on a thread (blocking, bounded by a deadline),
after which the link's exchanges use the TLS socket non-blocking (`server/comm.py`):

1. TLS handshake. Rank 0 presents the server's own certificate. Rank 1 verifies rank 0's: with
   `--peer-ca` its chain and name (the host it was sent to), with `--peer-fingerprint` one of the
   pinned SHA-256 fingerprints, by default the fingerprint of its own certificate (servers that
   share one certificate trust each other with no option).
2. The token preamble of `server/tokens.py`, rank 1 to rank 0. Rank 1 presents the token of the
   tenant whose connection sent its COMM_INIT; rank 0 accepts the link only if that token is a
   tenant of its `--tokens` and the same tenant as the connection that sent rank 0's COMM_INIT
   (so the tenant needs the same token on both servers). Without `--tokens` the preamble is sent
   and answered, and any token passes (TLS alone, like the client port).
3. The 24-byte caps exchange of spec §11.2, inside TLS.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rpcnet.protocol.commands import HELLO_CAPS_SIZE
from rpcnet.server.tenants import Tenants
from rpcnet.server.tokens import (
    ACCEPTED,
    ANSWER_HEAD,
    REFUSED,
    REQUEST_HEAD,
    PreambleError,
    encode_answer,
    encode_request,
    parse_answer_head,
    parse_request_head,
)
from rpcnet.transport import tls as tlsmod

NO_TENANT_TOKEN = b"-"  # what rank 1 presents when its server has no --tokens


class PeerRefused(Exception):
    """The peer failed the handshake, the certificate check or the token check."""


@dataclass
class PeerSecurity:
    """What a TLS server needs for its peer links."""

    server: ssl.SSLContext  # rank 0: the server's own context
    fingerprint: str  # the server's own certificate (the default pin)
    ca: Path | None = None  # --peer-ca
    pins: tuple[str, ...] = ()  # --peer-fingerprint (lowercase hex)
    tenants: Tenants | None = None
    client: ssl.SSLContext = field(init=False)

    def __post_init__(self) -> None:
        self.client = tlsmod.client_context(self.ca)
        if not self.pins:
            self.pins = (self.fingerprint,)

    def describe(self) -> str:
        if self.ca is not None:
            return f"CA {self.ca}"
        return "fingerprint " + ", ".join(tlsmod.colon_hex(p) for p in self.pins)

    # -------------------------------------------------------------------- rank 0

    def accept(
        self, sock: socket.socket, tenant: str | None, caps: bytes, deadline: float
    ) -> tuple[ssl.SSLSocket, bytes]:
        """Rank 0 on an accepted socket: handshake, the peer's token (of `tenant`), caps."""
        _blocking_until(sock, deadline)
        try:
            tls = self.server.wrap_socket(sock, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            raise PeerRefused(f"TLS handshake failed: {_why(exc)}") from exc
        with _closed_on_failure(tls):
            head = _recv_exactly(tls, REQUEST_HEAD.size, deadline)
            token = _recv_exactly(tls, parse_request_head(head), deadline)
            if self.tenants is not None:
                found = self.tenants.authenticate(token)
                if found is None or found.name != tenant:
                    tls.sendall(encode_answer(REFUSED))
                    who = "an unknown token" if found is None else f"tenant {found.name}"
                    raise PeerRefused(f"{who}, not tenant {tenant}")
            tls.sendall(encode_answer(ACCEPTED, tenant or ""))
            peer_caps = _recv_exactly(tls, HELLO_CAPS_SIZE, deadline)
            tls.sendall(caps)
        tls.setblocking(False)
        return tls, peer_caps

    # -------------------------------------------------------------------- rank 1

    def connect(
        self, sock: socket.socket, host: str, token: bytes | None, caps: bytes, deadline: float
    ) -> tuple[ssl.SSLSocket, bytes]:
        """Rank 1 on a connected socket: handshake, rank 0's certificate, the token, caps."""
        _blocking_until(sock, deadline)
        name = host if self.ca is not None else None
        try:
            tls = self.client.wrap_socket(sock, server_hostname=name)
        except (OSError, ssl.SSLError) as exc:
            raise PeerRefused(f"TLS handshake failed: {_why(exc)}") from exc
        with _closed_on_failure(tls):
            if self.ca is None:
                got = tlsmod.fingerprint(tls.getpeercert(binary_form=True) or b"")
                if got not in self.pins:  # checked before the token leaves
                    raise PeerRefused(
                        f"rank 0's certificate {tlsmod.colon_hex(got)} is not a trusted peer "
                        f"({self.describe()})"
                    )
            tls.sendall(encode_request(token or NO_TENANT_TOKEN))
            status, length = parse_answer_head(_recv_exactly(tls, ANSWER_HEAD.size, deadline))
            _recv_exactly(tls, length, deadline)
            if status != ACCEPTED:
                raise PeerRefused("rank 0 refused the tenant's token")
            tls.sendall(caps)
            peer_caps = _recv_exactly(tls, HELLO_CAPS_SIZE, deadline)
        tls.setblocking(False)
        return tls, peer_caps


@contextmanager
def _closed_on_failure(tls: ssl.SSLSocket) -> Iterator[None]:
    """The peer handshake's steps after TLS: any failure closes the socket; a bad preamble
    is the peer's refusal."""
    try:
        yield
    except PreambleError as exc:
        tls.close()
        raise PeerRefused(str(exc)) from exc
    except BaseException:
        tls.close()
        raise


def _blocking_until(sock: socket.socket, deadline: float) -> None:
    sock.setblocking(True)
    sock.settimeout(max(deadline - time.monotonic(), 0.1))


def _recv_exactly(sock: ssl.SSLSocket, n: int, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < n:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise PeerRefused("the peer closed the link during its set-up")
        out += chunk
    return bytes(out)


def _why(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):
        return getattr(exc, "verify_message", None) or exc.reason or str(exc)
    return str(exc) or type(exc).__name__
