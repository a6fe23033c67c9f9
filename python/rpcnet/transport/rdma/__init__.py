"""RDMA transport: the reference's Linux verbs RC transport (spec §12), over pyverbs.

Modules, bottom up (each imports only those above it):

* `queuepair` — what the framing needs from verbs: one RC queue pair with a registered send
  buffer and a ring of receive buffers (`QueuePair`, an interface), its bring-up order
  (`activate_qp`), sizes, QP attributes and errors.
* `channel` — `RdmaTransport`, the byte channel: SEND messages of at most `RDMA_CHUNK` that end
  where each `send` call ends; a ring of `RX_DEPTH` posted receive buffers.
* `endpoint` — `RdmaEndpoint` / `RdmaProvider`: probe (QP in RESET, the 24-byte caps) and
  activate with the peer's caps.
* `verbs` — the pyverbs binding (imported lazily; the optional extra `rpcnet[rdma]`): GID tables
  from verbs queries, `PyverbsQueuePair`, `PyverbsProvider`.
* `server_stream` — `RdmaServerStream`, the asyncio server's `ByteStream` for an upgraded
  connection; verbs work runs on one thread per connection.

Interoperability rules kept from the reference: RC QP, PSN = qpn & 0xFFFFFF, path MTU = the
port's active MTU, hop limit 1, timeout 14, retry 7, RNR retry 7, min RNR timer 1, 256-byte
inline request, message boundaries = `send_data()` call boundaries.
"""

from rpcnet.transport.rdma.channel import RdmaStats, RdmaTransport
from rpcnet.transport.rdma.endpoint import RdmaEndpoint, RdmaProvider
from rpcnet.transport.rdma.queuepair import (
    RDMA_CHUNK,
    RX_DEPTH,
    Completion,
    QueuePair,
    RdmaActivationError,
    RdmaUnavailable,
    activate_qp,
)
from rpcnet.transport.rdma.server_stream import RdmaServerStream, ResponseFramer
from rpcnet.transport.rdma.verbs import (
    PyverbsProvider,
    PyverbsQueuePair,
    local_ports,
    pyverbs_status,
)

__all__ = [
    "RDMA_CHUNK",
    "RX_DEPTH",
    "Completion",
    "PyverbsProvider",
    "PyverbsQueuePair",
    "QueuePair",
    "RdmaActivationError",
    "RdmaEndpoint",
    "RdmaProvider",
    "RdmaServerStream",
    "RdmaStats",
    "RdmaTransport",
    "RdmaUnavailable",
    "ResponseFramer",
    "activate_qp",
    "local_ports",
    "pyverbs_status",
]
