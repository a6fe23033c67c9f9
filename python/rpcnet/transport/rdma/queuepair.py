"""What the RDMA framing needs from verbs: one RC queue pair with registered memory (interface),
its bring-up order, the sizes and attributes the reference uses (spec §12), and the errors.

`verbs.PyverbsQueuePair` implements `QueuePair` with pyverbs, `tests/support/fakeverbs.py` with a
loopback fake for tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from rpcnet.transport.caps import RdmaCaps

RDMA_CHUNK = 256 * 1024  # largest SEND message, and the size of each receive buffer
RX_DEPTH = 24  # receive buffers kept posted
MAX_SEND_WR = 4  # the reference's send queue depth (sends are waited for one by one)
SEND_CQ_DEPTH = 16
INLINE_REQUEST = 256  # max_inline_data asked for at QP creation
# QP attributes (spec §12)
QP_TIMEOUT, QP_RETRY_CNT, QP_RNR_RETRY, QP_MIN_RNR_TIMER, QP_HOP_LIMIT = 14, 7, 7, 1, 1

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


class QueuePair:
    """One RC queue pair with its registered memory (interface; see module docstring)."""

    qpn: int = 0
    gid: bytes = bytes(16)
    max_inline: int = 0

    def to_init(self) -> None:
        raise NotImplementedError

    def to_rtr(self, remote: RdmaCaps) -> None:
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


def activate_qp(qp: QueuePair, remote: RdmaCaps) -> None:
    """RESET→INIT, post the whole receive ring, INIT→RTR (towards `remote`), RTR→RTS."""
    qp.to_init()
    for slot in range(RX_DEPTH):
        qp.post_recv(slot)
    qp.to_rtr(remote)
    qp.to_rts()
