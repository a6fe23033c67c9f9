"""A loopback stand-in for verbs: RC queue pairs that deliver SEND messages in process.

`FakeVerbs` is an `RdmaProvider`, so the whole negotiation and the `RdmaTransport` framing
(chunking, inline sends, receive ring, reposting, message boundaries, completion errors) run
unchanged on top of it; only `PyverbsQueuePair` is replaced. What it models of an RC QP:

* the state machine: receives may be posted from INIT on, messages are accepted from RTR on,
  SENDs may be posted only in RTS; a QP activated towards a (gid, qpn) that does not exist gets
  RETRY_EXC_ERR on its sends;
* a message needs a posted receive buffer at the peer: until one is posted it waits (RNR retry
  with rnr_retry = 7 retries forever) and the sender's completion waits with it;
* a message longer than the receive buffer fails on both sides (LOC_LEN_ERR / REM_INV_REQ_ERR);
* inline sends longer than the QP's inline limit, more than MAX_SEND_WR outstanding sends and
  posting a receive buffer that is already posted raise, as the verbs calls would fail.

It does not model packet loss, PSNs, MTU segmentation or timing. Thread-safe (one fabric lock).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rpcnet import _native
from rpcnet.transport.caps import RdmaCaps
from rpcnet.transport.rdma.endpoint import RdmaEndpoint, RdmaProvider
from rpcnet.transport.rdma.queuepair import (
    MAX_SEND_WR,
    RDMA_CHUNK,
    RX_DEPTH,
    Completion,
    QueuePair,
    RdmaUnavailable,
    wc_status_text,
)

RESET, INIT, RTR, RTS, CLOSED = "RESET", "INIT", "RTR", "RTS", "CLOSED"
LOC_LEN_ERR, REM_INV_REQ_ERR, RETRY_EXC_ERR, WR_FLUSH_ERR = 1, 9, 12, 5


class FakeVerbsError(RuntimeError):
    """A verbs call the real library would refuse (EINVAL, ENOMEM, ...)."""


@dataclass
class FabricStats:
    messages: list[int] = field(default_factory=list)  # sizes of delivered messages, in order
    rnr_waits: int = 0  # messages that found no posted receive buffer
    qps_created: int = 0


class FakeFabric:
    """The loopback 'network': queue pairs addressed by (gid, qpn)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.qps: dict[tuple[bytes, int], FakeQueuePair] = {}
        self.stats = FabricStats()
        self._next_qpn = 0x11C0  # arbitrary, > 24 bits would be unusual

    def register(self, qp: FakeQueuePair) -> int:
        with self.lock:
            self._next_qpn += 1
            self.qps[(qp.gid, self._next_qpn)] = qp
            self.stats.qps_created += 1
            return self._next_qpn

    def lookup(self, gid: bytes, qpn: int) -> FakeQueuePair | None:
        with self.lock:
            return self.qps.get((gid, qpn))

    def unregister(self, qp: FakeQueuePair) -> None:
        with self.lock:
            self.qps.pop((qp.gid, qp.qpn), None)

    def live_qps(self) -> int:
        with self.lock:
            return len(self.qps)


class FakeQueuePair(QueuePair):
    def __init__(
        self,
        fabric: FakeFabric,
        gid: bytes,
        *,
        max_inline: int = 256,
        fail_at: str | None = None,
    ) -> None:
        self.fabric = fabric
        self.gid = bytes(gid)
        self.max_inline = max_inline
        self.fail_at = fail_at
        self.state = RESET
        self.remote: RdmaCaps | None = None
        self._rx = bytearray(RX_DEPTH * RDMA_CHUNK)
        self._tx = bytearray(RDMA_CHUNK)
        self._rxv = memoryview(self._rx)
        self._txv = memoryview(self._tx)
        self.posted: deque[int] = deque()  # receive buffers posted, in order
        self.inbox: deque[tuple[bytes, FakeQueuePair]] = deque()  # waiting for a buffer (RNR)
        self.recv_cq: deque[Completion] = deque()
        self.send_cq: deque[Completion] = deque()
        self.outstanding = 0
        self.posted_total = 0
        self.qpn = fabric.register(self)

    # ------------------------------------------------------------ state machine

    def _fail(self, step: str) -> None:
        if self.fail_at == step:
            raise FakeVerbsError(f"injected failure at {step}")

    def _advance(self, step: str, before: str, after: str, remote: RdmaCaps | None = None) -> None:
        """One transition of the QP state machine, as verbs checks it (under the fabric lock)."""
        self._fail(step)
        if self.state != before:
            raise FakeVerbsError(f"{before}->{after} from {self.state}")
        if remote is not None:
            if remote.psn != remote.qpn & 0xFFFFFF:
                raise FakeVerbsError("remote PSN does not follow the qpn & 0xFFFFFF rule")
            self.remote = remote
        self.state = after

    def to_init(self) -> None:
        with self.fabric.lock:
            self._advance("init", RESET, INIT)

    def to_rtr(self, remote: RdmaCaps) -> None:
        with self.fabric.lock:
            self._advance("rtr", INIT, RTR, remote)
            self._deliver_pending()

    def to_rts(self) -> None:
        with self.fabric.lock:
            self._advance("rts", RTR, RTS)

    # ------------------------------------------------------------ memory

    def rx_view(self, slot: int) -> memoryview:
        return self._rxv[slot * RDMA_CHUNK : (slot + 1) * RDMA_CHUNK]

    def tx_view(self) -> memoryview:
        return self._txv

    # ------------------------------------------------------------ work requests

    def post_recv(self, slot: int) -> None:
        with self.fabric.lock:
            if self.state not in (INIT, RTR, RTS):
                raise FakeVerbsError(f"post_recv in {self.state}")
            if not 0 <= slot < RX_DEPTH:
                raise FakeVerbsError(f"receive buffer {slot} outside the ring")
            if slot in self.posted:
                raise FakeVerbsError(f"receive buffer {slot} posted twice")
            self.posted.append(slot)
            self.posted_total += 1
            self._deliver_pending()

    def post_send(self, length: int, inline: bool) -> None:
        with self.fabric.lock:
            self._fail("send")
            if self.state != RTS:
                raise FakeVerbsError(f"post_send in {self.state}")
            if inline and length > self.max_inline:
                raise FakeVerbsError(f"inline send of {length} > max_inline {self.max_inline}")
            if self.outstanding >= MAX_SEND_WR:
                raise FakeVerbsError("send queue full")
            if length > RDMA_CHUNK:
                raise FakeVerbsError(f"send of {length} bytes from a {RDMA_CHUNK}-byte buffer")
            self.outstanding += 1
            data = bytes(self._tx[:length])
            assert self.remote is not None
            peer = self.fabric.lookup(self.remote.gid, self.remote.qpn)
            if peer is None or peer.state == CLOSED:
                self._complete_send(False, RETRY_EXC_ERR, length)
                return
            peer.inbox.append((data, self))
            peer._deliver_pending()

    def _complete_send(self, ok: bool, status: int, length: int) -> None:
        self.outstanding -= 1
        self.send_cq.append(Completion(0, ok, length, wc_status_text(status)))

    def _deliver_pending(self) -> None:
        """Move waiting messages into posted buffers (caller holds the fabric lock)."""
        if self.state not in (RTR, RTS):
            return
        while self.inbox and self.posted:
            data, sender = self.inbox.popleft()
            slot = self.posted.popleft()
            if len(data) > RDMA_CHUNK:
                self.recv_cq.append(Completion(slot, False, 0, wc_status_text(LOC_LEN_ERR)))
                sender._complete_send(False, REM_INV_REQ_ERR, len(data))
                continue
            self._rx[slot * RDMA_CHUNK : slot * RDMA_CHUNK + len(data)] = data
            self.recv_cq.append(Completion(slot, True, len(data)))
            self.fabric.stats.messages.append(len(data))
            sender._complete_send(True, 0, len(data))
        if self.inbox and not self.posted:
            self.fabric.stats.rnr_waits += 1

    def poll_send(self) -> Completion | None:
        with self.fabric.lock:
            return self.send_cq.popleft() if self.send_cq else None

    def poll_recv(self) -> Completion | None:
        with self.fabric.lock:
            return self.recv_cq.popleft() if self.recv_cq else None

    def close(self) -> None:
        with self.fabric.lock:
            if self.state == CLOSED:
                return
            self.state = CLOSED
            self.fabric.unregister(self)
            for _, sender in self.inbox:  # the senders' retries run out
                sender._complete_send(False, RETRY_EXC_ERR, 0)
            self.inbox.clear()
            self.posted.clear()


class FakeVerbs(RdmaProvider):
    """An RdmaProvider on a FakeFabric.

    `ports`: GID tables to resolve against (the same Rust resolver and environment rules as the
    real provider); None means "this host has a RoCE v2 GID for every address". `environ`:
    the environment mapping for the resolver (default: the process environment). `fail_at`:
    "probe", "init", "rtr", "rts" or "send" to inject a failure there.
    """

    name = "fakeverbs"

    def __init__(
        self,
        fabric: FakeFabric | None = None,
        *,
        ports: list[Any] | None = None,
        environ: Any = None,
        fail_at: str | None = None,
        max_inline: int = 256,
    ) -> None:
        self.fabric = fabric if fabric is not None else FakeFabric()
        self.ports = ports
        self.environ = environ
        self.fail_at = fail_at
        self.max_inline = max_inline
        self.endpoints: list[RdmaEndpoint] = []

    def probe(self, local_addr: str) -> RdmaEndpoint:
        if self.fail_at == "probe":
            raise RdmaUnavailable("injected probe failure")
        try:
            env = _native.rdma_env(self.environ)
            if self.ports is None:
                if env.disabled_by:
                    raise RdmaUnavailable(f"RDMA disabled: {env.disabled_by} is set")
                gid = bytes(_native.rdma_target_gid(local_addr))
                desc = f"fake0 port 1 GID 1 (RoCE v2), GID matching local address {local_addr}"
            else:
                sel = _native.rdma_resolve(self.ports, local_addr, env)
                gid = bytes(sel.gid)
                desc = f"{sel.device} port {sel.port} GID {sel.gid_index} ({sel.kind}), {sel.how}"
        except _native.RdmaError as exc:
            raise RdmaUnavailable(str(exc)) from exc
        qp = FakeQueuePair(self.fabric, gid, max_inline=self.max_inline, fail_at=self.fail_at)
        endpoint = RdmaEndpoint(qp, desc)
        self.endpoints.append(endpoint)
        return endpoint


def fake_pair(
    fabric: FakeFabric | None = None, *, strict: bool = False, max_inline: int = 256
) -> tuple[Any, Any]:
    """Two activated RdmaTransports connected to each other (for framing tests)."""
    provider = FakeVerbs(fabric, max_inline=max_inline)
    a = provider.probe("10.0.0.1")
    b = provider.probe("10.0.0.2")
    caps_a, caps_b = a.caps, b.caps
    return a.activate(caps_b, strict=strict), b.activate(caps_a, strict=strict)
