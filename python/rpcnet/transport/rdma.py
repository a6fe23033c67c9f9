"""RDMA transport: the reference's Linux verbs RC transport (spec §12), over pyverbs.

Layers, bottom up:

* `QueuePair` — what the framing needs from verbs: one RC queue pair with a registered send
  buffer and a registered ring of receive buffers. `PyverbsQueuePair` implements it with pyverbs
  (imported lazily; the optional extra `rpcnet[rdma]`), `rpcnet.transport.fakeverbs` with a
  loopback fake for tests.
* `RdmaTransport` — the byte channel: each `send` is cut into SEND messages of at most
  `RDMA_CHUNK` (256 KiB, inline up to the QP's inline limit) that end where the call ends; the
  receiver keeps `RX_DEPTH` (24) buffers posted, consumes whole messages and reposts each buffer as
  soon as its bytes are used. `flush` is a no-op. Polling spins for `SPIN_TIME` after activity,
  then backs off to short sleeps.
* `RdmaEndpoint` / `RdmaProvider` — probe (choose device/port/GID for the TCP socket's local
  address, create the QP in RESET, produce the 24-byte caps) and activate with the peer's caps
  (RESET→INIT, post the ring, INIT→RTR, RTR→RTS).
* `RdmaServerStream` — the asyncio server's view of an upgraded connection (same calls as
  `rpcnet.server.stream.StreamProtocol`); verbs work runs on one thread per connection.

Interoperability rules kept from the reference: RC QP, PSN = qpn & 0xFFFFFF, path MTU = the
port's active MTU, hop limit 1, timeout 14, retry 7, RNR retry 7, min RNR timer 1, 256-byte
inline request, message boundaries = `send_data()` call boundaries. Our receiver also accepts
messages that do not line up with its reads (it reassembles a byte stream); with `strict=True` it
refuses them the way a reference receiver would break on them (used by tests).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from rpcnet import _native
from rpcnet.transport.base import Transport, TransportClosed, TransportError

log = logging.getLogger("rpcnet.transport")

RDMA_CHUNK = 256 * 1024  # largest SEND message, and the size of each receive buffer
RX_DEPTH = 24  # receive buffers kept posted
MAX_SEND_WR = 4  # the reference's send queue depth (sends are waited for one by one)
SEND_CQ_DEPTH = 16
INLINE_REQUEST = 256  # max_inline_data asked for at QP creation
SPIN_TIME = 0.1  # seconds of busy polling after the last completion
IDLE_SLEEP_MIN = 50e-6  # then sleep between polls, doubling up to IDLE_SLEEP_MAX
IDLE_SLEEP_MAX = 1e-3
# QP attributes (spec §12)
QP_TIMEOUT, QP_RETRY_CNT, QP_RNR_RETRY, QP_MIN_RNR_TIMER, QP_HOP_LIMIT = 14, 7, 7, 1, 1

PYVERBS_MISSING = (
    "pyverbs is not installed (pip install 'rpcnet[rdma]', or Debian/Ubuntu python3-pyverbs)"
)

# enum ibv_wc_status, for readable completion errors
WC_STATUS = {
    0: "SUCCESS",
    1: "LOC_LEN_ERR",
    2: "LOC_QP_OP_ERR",
    3: "LOC_EEC_OP_ERR",
    4: "LOC_PROT_ERR",
    5: "WR_FLUSH_ERR",
    6: "MW_BIND_ERR",
    7: "BAD_RESP_ERR",
    8: "LOC_ACCESS_ERR",
    9: "REM_INV_REQ_ERR",
    10: "REM_ACCESS_ERR",
    11: "REM_OP_ERR",
    12: "RETRY_EXC_ERR",
    13: "RNR_RETRY_EXC_ERR",
    14: "LOC_RDD_VIOL_ERR",
    15: "REM_INV_RD_REQ_ERR",
    16: "REM_ABORT_ERR",
    17: "INV_EECN_ERR",
    18: "INV_EEC_STATE_ERR",
    19: "FATAL_ERR",
    20: "RESP_TIMEOUT_ERR",
    21: "GENERAL_ERR",
}
PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
LINK_LAYERS = {1: "InfiniBand", 2: "Ethernet"}


def wc_status_text(status: int) -> str:
    return f"{WC_STATUS.get(status, 'status')} ({status})"


class RdmaUnavailable(Exception):
    """This side cannot offer RDMA; the message says why (one line)."""


class RdmaActivationError(Exception):
    """Both sides offered RDMA but this side could not bring its queue pair up."""


@dataclass(frozen=True)
class Completion:
    wr_id: int
    ok: bool
    byte_len: int
    status: str = "SUCCESS (0)"


@dataclass(frozen=True)
class RemoteCaps:
    qpn: int
    psn: int
    gid: bytes

    @classmethod
    def decode(cls, caps: bytes) -> RemoteCaps | None:
        decoded = _native.rdma_decode_caps(bytes(caps))
        return None if decoded is None else cls(*decoded)


class QueuePair:
    """One RC queue pair with its registered memory (interface; see module docstring)."""

    qpn: int = 0
    gid: bytes = bytes(16)
    max_inline: int = 0

    def to_init(self) -> None:
        raise NotImplementedError

    def to_rtr(self, remote: RemoteCaps) -> None:
        raise NotImplementedError

    def to_rts(self) -> None:
        raise NotImplementedError

    def rx_view(self, slot: int) -> memoryview:
        """RDMA_CHUNK bytes of receive buffer `slot` (registered memory)."""
        raise NotImplementedError

    def tx_view(self) -> memoryview:
        """RDMA_CHUNK bytes of the send buffer (registered memory)."""
        raise NotImplementedError

    def post_recv(self, slot: int) -> None:
        raise NotImplementedError

    def post_send(self, length: int, inline: bool) -> None:
        """Post one signaled SEND of tx_view()[:length]."""
        raise NotImplementedError

    def poll_send(self) -> Completion | None:
        raise NotImplementedError

    def poll_recv(self) -> Completion | None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def activate_qp(qp: QueuePair, remote: RemoteCaps) -> None:
    """RESET→INIT, post the whole receive ring, INIT→RTR (towards `remote`), RTR→RTS."""
    qp.to_init()
    for slot in range(RX_DEPTH):
        qp.post_recv(slot)
    qp.to_rtr(remote)
    qp.to_rts()


# ------------------------------------------------------------------------------------------------
# the byte channel


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


# ------------------------------------------------------------------------------------------------
# probing and activation


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
            remote = RemoteCaps.decode(remote_caps)
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


# ------------------------------------------------------------------------------------------------
# pyverbs

_PYVERBS: SimpleNamespace | None = None


def import_pyverbs() -> SimpleNamespace:
    """The pyverbs modules we use; RdmaUnavailable when pyverbs cannot be imported."""
    global _PYVERBS
    if _PYVERBS is None:
        try:
            import pyverbs
            from pyverbs import addr, cq, device, enums, mr, pd, qp, wr
            from pyverbs.pyverbs_error import PyverbsError
        except ImportError as exc:
            if isinstance(exc, ModuleNotFoundError) and exc.name == "pyverbs":
                raise RdmaUnavailable(PYVERBS_MISSING) from exc
            raise RdmaUnavailable(f"pyverbs cannot be imported: {exc}") from exc
        _PYVERBS = SimpleNamespace(
            addr=addr,
            cq=cq,
            device=device,
            enums=enums,
            mr=mr,
            pd=pd,
            qp=qp,
            wr=wr,
            Error=PyverbsError,
            version=_pyverbs_version(pyverbs),
        )
    return _PYVERBS


def _pyverbs_version(module: Any) -> str:
    version = getattr(module, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as dist_version

            version = dist_version("pyverbs")
        except Exception:  # noqa: BLE001 - e.g. Debian's python3-pyverbs has no metadata
            return "(version unknown)"
    return str(version)


def pyverbs_status() -> tuple[bool, str]:
    """(importable, one line) for `rpcnet caps --local`."""
    try:
        pv = import_pyverbs()
    except RdmaUnavailable as exc:
        return False, str(exc)
    return True, f"pyverbs {pv.version}"


def _gid_bytes(text: str) -> bytes:
    return bytes(_native.rdma_parse_gid(text))


def pyverbs_ports(pv: Any) -> list[_native.RdmaPort]:
    """The GID tables through verbs queries (when sysfs is not available)."""
    try:
        devices = pv.device.get_device_list()
    except pv.Error:
        return []  # pyverbs raises when there are no devices at all
    out = []
    for dev in devices:
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        ctx = pv.device.Context(name=name)
        try:
            for port in range(1, ctx.query_device().phys_port_cnt + 1):
                pa = ctx.query_port(port)
                link = LINK_LAYERS.get(pa.link_layer)
                gids = []
                for idx in range(pa.gid_tbl_len):
                    try:
                        raw = _gid_bytes(ctx.query_gid(port, idx).gid)
                    except Exception:  # noqa: BLE001 - unreadable slot
                        continue
                    if not any(raw):
                        continue
                    kind = "unknown"
                    ndev: str | None = None
                    try:
                        entry = ctx.query_gid_ex(port, idx)
                        kind = {0: "IB", 1: "RoCE v1", 2: "RoCE v2"}.get(entry.gid_type, kind)
                        if entry.ndev_ifindex:
                            ndev = socket.if_indextoname(entry.ndev_ifindex)
                    except Exception:  # noqa: BLE001 - older rdma-core: no ibv_query_gid_ex
                        try:  # enum ibv_gid_type_sysfs: 0 "IB/RoCE v1", 1 "RoCE v2"
                            sysfs_type = ctx.query_gid_type(port, idx)
                            kind = {0: "RoCE v1", 1: "RoCE v2"}.get(sysfs_type, "unknown")
                        except Exception:  # noqa: BLE001
                            pass
                    if link == "InfiniBand" and kind == "RoCE v1":
                        kind = "IB"
                    gids.append(_native.RdmaGid(idx, raw, kind, ndev))
                state = f"{pa.state}: {PORT_STATES.get(pa.state, '?')}"
                out.append(_native.RdmaPort(name, port, gids, state, link))
        finally:
            ctx.close()
    return out


def local_ports(root: str | None = None) -> tuple[list[_native.RdmaPort], str]:
    """(ports, where they were read): sysfs, else (default root only) pyverbs queries."""
    try:
        return _native.rdma_scan(root), root or _native.RDMA_SYSFS_ROOT
    except _native.RdmaError as exc:
        if root is not None:
            raise RdmaUnavailable(str(exc)) from exc
        sysfs_reason = str(exc)
    try:
        pv = import_pyverbs()
    except RdmaUnavailable as exc:
        raise RdmaUnavailable(f"{sysfs_reason}; {exc}") from exc
    try:
        return pyverbs_ports(pv), "pyverbs queries"
    except Exception as exc:  # noqa: BLE001 - say what failed, in one line
        raise RdmaUnavailable(f"{sysfs_reason}; pyverbs queries failed: {exc}") from exc


# Work requests and QP attributes, built apart from any device so tests can check them against
# the real pyverbs classes on hosts without a NIC.


def qp_init_attr(pv: Any, scq: Any, rcq: Any) -> Any:
    cap = pv.qp.QPCap(
        max_send_wr=MAX_SEND_WR,
        max_recv_wr=RX_DEPTH + 4,
        max_send_sge=1,
        max_recv_sge=1,
        max_inline_data=INLINE_REQUEST,
    )
    return pv.qp.QPInitAttr(qp_type=pv.enums.IBV_QPT_RC, scq=scq, rcq=rcq, cap=cap, sq_sig_all=0)


def init_attr(pv: Any, port: int) -> tuple[Any, int]:
    """RESET→INIT: (attributes, mask)."""
    e = pv.enums
    attr = pv.qp.QPAttr(qp_state=e.IBV_QPS_INIT, port_num=port)
    attr.pkey_index = 0
    attr.qp_access_flags = (
        e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_LOCAL_WRITE
    )
    return attr, e.IBV_QP_STATE | e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT | e.IBV_QP_ACCESS_FLAGS


def rtr_attr(
    pv: Any, port: int, gid_index: int, path_mtu: int, remote: RemoteCaps
) -> tuple[Any, int]:
    """INIT→RTR towards `remote`: (attributes, mask)."""
    e, a = pv.enums, pv.addr
    gr = a.GlobalRoute(
        dgid=a.GID(_native.rdma_format_gid(remote.gid)),
        sgid_index=gid_index,
        hop_limit=QP_HOP_LIMIT,
    )
    attr = pv.qp.QPAttr(qp_state=e.IBV_QPS_RTR, port_num=port)
    attr.path_mtu = path_mtu
    attr.dest_qp_num = remote.qpn
    attr.rq_psn = remote.psn
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = QP_MIN_RNR_TIMER
    attr.ah_attr = a.AHAttr(port_num=port, is_global=1, gr=gr, dlid=0)
    mask = (
        e.IBV_QP_STATE
        | e.IBV_QP_AV
        | e.IBV_QP_PATH_MTU
        | e.IBV_QP_DEST_QPN
        | e.IBV_QP_RQ_PSN
        | e.IBV_QP_MAX_DEST_RD_ATOMIC
        | e.IBV_QP_MIN_RNR_TIMER
    )
    return attr, mask


def rts_attr(pv: Any, port: int, psn: int) -> tuple[Any, int]:
    """RTR→RTS: (attributes, mask)."""
    e = pv.enums
    attr = pv.qp.QPAttr(qp_state=e.IBV_QPS_RTS, port_num=port)
    attr.timeout = QP_TIMEOUT
    attr.retry_cnt = QP_RETRY_CNT
    attr.rnr_retry = QP_RNR_RETRY
    attr.sq_psn = psn
    attr.max_rd_atomic = 1
    mask = (
        e.IBV_QP_STATE
        | e.IBV_QP_TIMEOUT
        | e.IBV_QP_RETRY_CNT
        | e.IBV_QP_RNR_RETRY
        | e.IBV_QP_SQ_PSN
        | e.IBV_QP_MAX_QP_RD_ATOMIC
    )
    return attr, mask


def recv_wr(pv: Any, addr: int, lkey: int, slot: int) -> Any:
    sge = pv.wr.SGE(addr + slot * RDMA_CHUNK, RDMA_CHUNK, lkey)
    return pv.wr.RecvWR(wr_id=slot, num_sge=1, sg=[sge])


def send_wr(pv: Any, addr: int, lkey: int, length: int, inline: bool) -> Any:
    e = pv.enums
    flags = e.IBV_SEND_SIGNALED | (e.IBV_SEND_INLINE if inline else 0)
    sge = pv.wr.SGE(addr, length, lkey)
    return pv.wr.SendWR(wr_id=0, opcode=e.IBV_WR_SEND, num_sge=1, sg=[sge], send_flags=flags)


def _mr_view(address: int, length: int) -> memoryview:
    return memoryview((ctypes.c_char * length).from_address(address)).cast("B")


class PyverbsQueuePair(QueuePair):
    """The reference's queue pair, through pyverbs. Created in RESET (probe)."""

    def __init__(self, pv: Any, selection: _native.RdmaSelection) -> None:
        self.pv = pv
        e = pv.enums
        self.port = selection.port
        self.gid_index = selection.gid_index
        self.ctx = pv.device.Context(name=selection.device)
        self._closed = False
        try:
            self.path_mtu = self.ctx.query_port(self.port).active_mtu
            self.pd = pv.pd.PD(self.ctx)
            self.scq = pv.cq.CQ(self.ctx, SEND_CQ_DEPTH, None, None, 0)
            self.rcq = pv.cq.CQ(self.ctx, RX_DEPTH + 4, None, None, 0)
            init = qp_init_attr(pv, self.scq, self.rcq)
            self.qp = pv.qp.QP(self.pd, init)
            # ibv_create_qp reports the inline size it granted (at least the request).
            granted = getattr(init, "max_inline_data", INLINE_REQUEST)
            self.max_inline = granted if isinstance(granted, int) and granted > 0 else 0
            self.tx_mr = pv.mr.MR(self.pd, RDMA_CHUNK, e.IBV_ACCESS_LOCAL_WRITE)
            self.rx_mr = pv.mr.MR(
                self.pd,
                RX_DEPTH * RDMA_CHUNK,
                e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE,
            )
            self._tx = _mr_view(self.tx_mr.buf, RDMA_CHUNK)
            self._rx = _mr_view(self.rx_mr.buf, RX_DEPTH * RDMA_CHUNK)
            self.gid = _gid_bytes(self.ctx.query_gid(self.port, self.gid_index).gid)
            self.qpn = self.qp.qp_num
            self.psn = self.qpn & 0xFFFFFF
            self._recv_wrs = [
                recv_wr(pv, self.rx_mr.buf, self.rx_mr.lkey, slot) for slot in range(RX_DEPTH)
            ]
        except Exception:
            self.close()
            raise

    # state transitions (the reference's attributes and masks, spec §12)
    def to_init(self) -> None:
        self.qp.modify(*init_attr(self.pv, self.port))

    def to_rtr(self, remote: RemoteCaps) -> None:
        self.qp.modify(*rtr_attr(self.pv, self.port, self.gid_index, self.path_mtu, remote))

    def to_rts(self) -> None:
        self.qp.modify(*rts_attr(self.pv, self.port, self.psn))

    def rx_view(self, slot: int) -> memoryview:
        return self._rx[slot * RDMA_CHUNK : (slot + 1) * RDMA_CHUNK]

    def tx_view(self) -> memoryview:
        return self._tx

    def post_recv(self, slot: int) -> None:
        self.qp.post_recv(self._recv_wrs[slot])

    def post_send(self, length: int, inline: bool) -> None:
        self.qp.post_send(send_wr(self.pv, self.tx_mr.buf, self.tx_mr.lkey, length, inline))

    def _poll(self, cq: Any) -> Completion | None:
        n, wcs = cq.poll(1)
        if n < 0:
            raise TransportError("ibv_poll_cq failed")
        if n == 0:
            return None
        wc = wcs[0]
        ok = wc.status == self.pv.enums.IBV_WC_SUCCESS
        return Completion(wc.wr_id, ok, wc.byte_len, wc_status_text(wc.status))

    def poll_send(self) -> Completion | None:
        return self._poll(self.scq)

    def poll_recv(self) -> Completion | None:
        return self._poll(self.rcq)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # Views into MR memory must go before the MRs; the context closes what depends on it.
        self._tx = self._rx = None  # type: ignore[assignment]
        for name in ("qp", "tx_mr", "rx_mr", "scq", "rcq", "pd", "ctx"):
            obj = getattr(self, name, None)
            if obj is not None:
                try:
                    obj.close()
                except Exception:  # noqa: BLE001 - best effort teardown
                    log.debug("closing %s failed", name, exc_info=True)


class PyverbsProvider(RdmaProvider):
    """Real RDMA through pyverbs: sysfs (or verbs queries) for the GID, one QP per connection."""

    name = "pyverbs"

    def __init__(self, sysfs_root: str | None = None, environ: Any = None) -> None:
        self.sysfs_root = sysfs_root
        self.environ = environ

    def probe(self, local_addr: str) -> RdmaEndpoint:
        try:
            env = _native.rdma_env(self.environ)
        except _native.RdmaError as exc:
            raise RdmaUnavailable(str(exc)) from exc
        if env.disabled_by:
            raise RdmaUnavailable(f"RDMA disabled: {env.disabled_by} is set")
        pv = import_pyverbs()
        ports, _ = local_ports(self.sysfs_root)
        try:
            sel = _native.rdma_resolve(ports, local_addr, env)
        except _native.RdmaError as exc:
            raise RdmaUnavailable(str(exc)) from exc
        try:
            qp = PyverbsQueuePair(pv, sel)
        except Exception as exc:  # noqa: BLE001 - any verbs failure means "no RDMA here"
            raise RdmaUnavailable(
                f"cannot create a queue pair on {sel.device} port {sel.port}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        desc = f"{sel.device} port {sel.port} GID {sel.gid_index} ({sel.kind}), {sel.how}"
        return RdmaEndpoint(qp, desc)


# ------------------------------------------------------------------------------------------------
# the asyncio server's side of an upgraded connection

_SIZE = struct.Struct("<Q")


class ResponseFramer:
    """Cuts the server's outgoing bytes into the reference's `send_data()` units.

    A reference RDMA receiver reads a response as `recv_data(&size, 8)` then
    `recv_data(payload, size)` and consumes whole messages, so the 8-byte size and the payload
    must be separate messages even when the connection layer writes them as one buffer.
    """

    def __init__(self) -> None:
        self._header = bytearray()
        self._remaining = 0

    def split(self, data: memoryview) -> list[memoryview | bytes]:
        pieces: list[memoryview | bytes] = []
        while data.nbytes:
            if self._remaining == 0:
                take = min(_SIZE.size - len(self._header), data.nbytes)
                self._header += data[:take]
                data = data[take:]
                if len(self._header) == _SIZE.size:
                    pieces.append(bytes(self._header))
                    (self._remaining,) = _SIZE.unpack(self._header)
                    self._header = bytearray()
            else:
                take = min(self._remaining, data.nbytes)
                pieces.append(data[:take])
                self._remaining -= take
                data = data[take:]
        return pieces


class RdmaServerStream:
    """What `rpcnet.server.connection.Connection` sees once its connection moved to RDMA.

    Same calls as `StreamProtocol` (at_eof, readexactly, readinto, write, drain, close; staged,
    consume, write_ready and fast_path only matter after a fallback). Verbs work runs on one
    thread per connection, in order. The TCP stream stays open as the liveness signal: its EOF
    ends the connection; bytes on it before any RDMA data mean the client stayed on TCP (its
    activation failed after we answered), and the connection falls back to TCP.
    """

    def __init__(self, link: RdmaTransport, tcp: Any, peer: str) -> None:
        self.link = link
        self.tcp = tcp
        self.peer = peer
        self.fast_path: Callable[[], None] | None = None
        self._loop = asyncio.get_running_loop()
        self._exec = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rpcnet-rdma")
        self._framer = ResponseFramer()
        self._last_write: asyncio.Future[None] | None = None
        self._write_error: BaseException | None = None
        self._fallback: Any = None
        self._used = False  # RDMA data has arrived
        self._closed = False
        self._tcp_watch = self._loop.create_task(tcp.at_eof())
        self._tcp_watch.add_done_callback(self._tcp_done)

    @property
    def transport_name(self) -> str:
        return "TCP" if self._fallback is not None else "RDMA"

    def _tcp_done(self, task: asyncio.Task[bool]) -> None:
        if task.cancelled() or task.exception() is not None or task.result():
            self.link.stop.set()  # the client is gone: end any RDMA wait

    def _tcp_eof(self) -> bool:
        t = self._tcp_watch
        return t.cancelled() or t.exception() is not None or bool(t.result())

    def _run(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        return self._loop.run_in_executor(self._exec, fn, *args)

    def _closed_by(self, exc: BaseException) -> BaseException:
        """The connection layer's ConnectionClosed for a transport error (others unchanged)."""
        from rpcnet.server.stream import ConnectionClosed

        if isinstance(exc, TransportClosed):
            return ConnectionClosed(str(exc))
        if isinstance(exc, TransportError):
            log.warning("%s: RDMA transport failed: %s", self.peer, exc)
            return ConnectionClosed(f"RDMA: {exc}")
        return exc

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await self._run(fn, *args)
        except TransportError as exc:
            raise self._closed_by(exc) from exc

    # ------------------------------------------------------------ reading

    async def at_eof(self) -> bool:
        if self._fallback is not None:
            return await self._fallback.at_eof()
        if self.link.has_data():
            return False
        waiter = self._run(self.link.wait_readable)
        await asyncio.wait({waiter, self._tcp_watch}, return_when=asyncio.FIRST_COMPLETED)
        if waiter.done() and waiter.exception() is None and waiter.result():
            self._used = True
            return False
        if waiter.done() and (exc := waiter.exception()) is not None:
            raise self._closed_by(exc) from exc
        if not self._tcp_watch.done():  # stopped by close()
            return True
        self.link.stop.set()
        await asyncio.wait({waiter})
        if self._tcp_eof():
            return True
        if self._used:
            from rpcnet.server.stream import ConnectionClosed

            log.warning("%s: closing: data on the TCP socket after the RDMA upgrade", self.peer)
            raise ConnectionClosed("data on the TCP socket after the RDMA upgrade")
        log.warning(
            "%s: transport TCP: the client stayed on TCP after both sides offered RDMA "
            "(its activation failed); falling back to TCP",
            self.peer,
        )
        self._exec.submit(self.link.close)
        self._fallback = self.tcp
        self.tcp.fast_path = self.fast_path
        return await self.tcp.at_eof()

    async def readexactly(self, n: int) -> bytes:
        if self._fallback is not None:
            return await self._fallback.readexactly(n)
        return await self._io(self.link.recv, n)

    async def readinto(self, dest: Any) -> None:
        if self._fallback is not None:
            return await self._fallback.readinto(dest)
        await self._io(self.link.recv_into, dest)

    def staged(self) -> memoryview:
        return self._fallback.staged() if self._fallback is not None else memoryview(b"")

    def consume(self, n: int) -> None:
        if self._fallback is not None:
            self._fallback.consume(n)

    @property
    def write_ready(self) -> bool:
        return self._fallback is not None and self._fallback.write_ready

    # ------------------------------------------------------------ writing

    def _send_all(self, pieces: list[Any]) -> None:
        if self._write_error is not None:
            return
        try:
            for piece in pieces:
                self.link.send(piece)
        except BaseException as exc:  # reported by drain()
            self._write_error = exc

    def write(self, data: Any) -> None:
        if self._fallback is not None:
            self._fallback.write(data)
            return
        pieces = self._framer.split(memoryview(data).cast("B"))
        if pieces:
            self._last_write = self._run(self._send_all, pieces)

    async def drain(self) -> None:
        if self._fallback is not None:
            await self._fallback.drain()
            return
        if self._last_write is not None and not self._last_write.done():
            await self._last_write
        if self._write_error is not None:
            exc = self._write_error
            raise self._closed_by(exc) from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.link.stop.set()
        if not self._tcp_watch.done():
            self._tcp_watch.cancel()
        self._exec.submit(self.link.close)  # after whatever the thread is finishing
        self._exec.shutdown(wait=False)
        self.tcp.close()
