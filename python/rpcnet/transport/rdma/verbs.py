"""The pyverbs binding: imported lazily (the optional extra `rpcnet[rdma]`), the GID tables from
verbs queries, the reference's QP attributes and work requests, `PyverbsQueuePair` and
`PyverbsProvider` (real RDMA, one QP per connection).
"""

from __future__ import annotations

import ctypes
import logging
import socket
from types import SimpleNamespace
from typing import Any

from rpcnet import _native
from rpcnet.transport.base import TransportError
from rpcnet.transport.caps import RdmaCaps
from rpcnet.transport.rdma.endpoint import RdmaEndpoint, RdmaProvider
from rpcnet.transport.rdma.queuepair import (
    INLINE_REQUEST,
    MAX_SEND_WR,
    QP_HOP_LIMIT,
    QP_MIN_RNR_TIMER,
    QP_RETRY_CNT,
    QP_RNR_RETRY,
    QP_TIMEOUT,
    RDMA_CHUNK,
    RX_DEPTH,
    SEND_CQ_DEPTH,
    Completion,
    QueuePair,
    RdmaUnavailable,
    wc_status_text,
)

log = logging.getLogger("rpcnet.transport")

PYVERBS_MISSING = (
    "pyverbs is not installed (pip install 'rpcnet[rdma]', or Debian/Ubuntu python3-pyverbs)"
)

PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
LINK_LAYERS = {1: "InfiniBand", 2: "Ethernet"}


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
                    kind, ndev = "unknown", None
                    try:
                        entry = ctx.query_gid_ex(port, idx)
                        kind = {0: "IB", 1: "RoCE v1", 2: "RoCE v2"}.get(entry.gid_type, kind)
                        if entry.ndev_ifindex:
                            ndev = socket.if_indextoname(entry.ndev_ifindex)
                    except Exception:  # noqa: BLE001 - older rdma-core: no ibv_query_gid_ex
                        try:  # enum ibv_gid_type_sysfs: 0 "IB/RoCE v1", 1 "RoCE v2"
                            sysfs_kinds = {0: "RoCE v1", 1: "RoCE v2"}
                            kind = sysfs_kinds.get(ctx.query_gid_type(port, idx), "unknown")
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
    pv: Any, port: int, gid_index: int, path_mtu: int, remote: RdmaCaps
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

    def to_rtr(self, remote: RdmaCaps) -> None:
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
