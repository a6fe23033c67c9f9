"""Transports: TCP and RDMA (pyverbs, optional), and their negotiation through HELLO's caps.

See docs/rdma.md. Nothing here imports pyverbs at import time; `rpcnet.transport.rdma.verbs`
does it the first time a connection is offered RDMA. The blocking client that negotiates is
`rpcnet.client.connect_client`.
"""

from rpcnet.protocol.commands import HELLO_CAPS_SIZE, NO_CAPS
from rpcnet.transport.base import (
    ByteStream,
    ConnectionClosed,
    Transport,
    TransportClosed,
    TransportError,
)
from rpcnet.transport.negotiate import (
    ConnectionNegotiation,
    Outcome,
    ServerNegotiation,
    decide,
)
from rpcnet.transport.rdma import (
    RDMA_CHUNK,
    RX_DEPTH,
    PyverbsProvider,
    RdmaActivationError,
    RdmaEndpoint,
    RdmaProvider,
    RdmaTransport,
    RdmaUnavailable,
)
from rpcnet.transport.tcp import TcpTransport

__all__ = [
    "ByteStream",
    "ConnectionClosed",
    "HELLO_CAPS_SIZE",
    "NO_CAPS",
    "RDMA_CHUNK",
    "RX_DEPTH",
    "ConnectionNegotiation",
    "Outcome",
    "PyverbsProvider",
    "RdmaActivationError",
    "RdmaEndpoint",
    "RdmaProvider",
    "RdmaTransport",
    "RdmaUnavailable",
    "ServerNegotiation",
    "TcpTransport",
    "Transport",
    "TransportClosed",
    "TransportError",
    "decide",
]
