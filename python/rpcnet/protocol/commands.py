"""Command ids of the two protocol dialects (spec §3 and §14).

Ids 0..17 are shared; v8 adds the 2-D transfers and the COMM_* family and moves the
client-internal NONE marker from 18 to 23. What the server does with each command is its row in
`rpcnet.server.command_table`.
"""

from __future__ import annotations

import enum

from rpcnet import _native


class Cmd(enum.IntEnum):
    ALLOC_BUFFER = 0
    GET_ALIGNMENT = 1
    GET_MAX_SIZE = 2
    BUFFER_GET_BASE = 3
    FREE_BUFFER = 4
    BUFFER_CLEAR = 5
    SET_TENSOR = 6
    SET_TENSOR_HASH = 7
    GET_TENSOR = 8
    COPY_TENSOR = 9
    GRAPH_COMPUTE = 10
    GET_DEVICE_MEMORY = 11
    INIT_TENSOR = 12
    GET_ALLOC_SIZE = 13
    HELLO = 14
    DEVICE_COUNT = 15
    GRAPH_RECOMPUTE = 16
    MEMSET_TENSOR = 17
    SET_TENSOR_2D = 18
    GET_TENSOR_2D = 19
    COMM_INIT = 20
    COMM_ALLREDUCE = 21
    COMM_FREE = 22


SUPPORTED_PROTOCOLS = (8, 7)
DEFAULT_PROTOCOL = 8

HEADER_SIZE = 9  # cmd u8 + size u64
HELLO = Cmd.HELLO  # the first command of every connection (spec §2)


def _fixed(size: int | None) -> int:
    assert size is not None, "HELLO has fixed sizes in the codec's command table"
    return size


# From the codec's command table (rust/src/), the one place payload sizes are defined.
HELLO_CAPS_SIZE = _fixed(_native.request_size(DEFAULT_PROTOCOL, HELLO))  # conn_caps: 24
HELLO_RESPONSE_SIZE = _fixed(_native.response_size(DEFAULT_PROTOCOL, HELLO))  # 3 x u8, pad, caps
NO_CAPS = bytes(HELLO_CAPS_SIZE)  # all-zero caps: "no RDMA", stay on TCP (spec §12)


def version_triple(proto: int) -> tuple[int, int, int]:
    """The (major, minor, patch) a server of this dialect announces in HELLO."""
    if proto not in SUPPORTED_PROTOCOLS:
        raise ValueError(f"unsupported protocol {proto}; choose one of {SUPPORTED_PROTOCOLS}")
    return (proto, 0, 0)
