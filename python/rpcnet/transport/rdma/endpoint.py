"""Probing and activation: a local end that can advertise caps, and what makes one per connection.

Probe: choose device/port/GID for the TCP socket's local address, create the QP in RESET, produce
the 24-byte caps. Activate with the peer's caps: RESET→INIT, post the ring, INIT→RTR, RTR→RTS.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rpcnet import _native
from rpcnet.transport.caps import RdmaCaps
from rpcnet.transport.rdma.channel import RdmaTransport
from rpcnet.transport.rdma.queuepair import QueuePair, RdmaActivationError, activate_qp

log = logging.getLogger("rpcnet.transport")


class RdmaEndpoint:
    """A probed local end: a queue pair in RESET and the caps that advertise it."""

    def __init__(self, qp: QueuePair, description: str) -> None:
        self.qp = qp
        self.description = description
        self.caps = _native.rdma_encode_caps(qp.qpn, qp.gid)

    def activate(
        self,
        remote_caps: bytes,
        *,
        peer_closed: Callable[[], bool] | None = None,
        strict: bool = False,
    ) -> RdmaTransport:
        """Bring the QP up towards the peer; RdmaActivationError (QP released) on failure."""
        try:
            remote = RdmaCaps.decode(remote_caps)
            if remote is None:
                raise RdmaActivationError("the peer advertised no RDMA")
            activate_qp(self.qp, remote)
        except Exception as exc:
            self.close()
            if isinstance(exc, RdmaActivationError):
                raise
            raise RdmaActivationError(f"{type(exc).__name__}: {exc}") from exc
        desc = f"qpn {self.qp.qpn:#x} -> {remote.qpn:#x}, {self.description}"
        return RdmaTransport(self.qp, peer_closed=peer_closed, strict=strict, description=desc)

    def close(self) -> None:
        try:
            self.qp.close()
        except Exception:  # noqa: BLE001 - releasing a half-built QP must not mask the cause
            log.debug("closing RDMA queue pair failed", exc_info=True)


class RdmaProvider:
    """Makes endpoints for connections (pyverbs in production, FakeVerbs in tests)."""

    name = "rdma"

    def probe(self, local_addr: str) -> RdmaEndpoint:
        """An endpoint for a TCP connection whose local address is `local_addr`, or
        RdmaUnavailable saying why there is none."""
        raise NotImplementedError
