"""Every protocol command, described once (spec §3, §7, §8, §11, §14).

One row per command: its id, the dialects that have it, its fixed request size (the Rust codec's:
`_native.request_size`), how its payload arrives and which --max-* caps it, the session method
that handles it, where it stands relative to the connection's launched graphs, whether the
protocol callback may run it, and its mode. The connection knows nothing else about a command:
it indexes `rows(proto)` by the header's plain int id (an IntEnum per frame costs more than most
handlers) and executes the `Effect` the handler returns.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from rpcnet import _native
from rpcnet.protocol.commands import SUPPORTED_PROTOCOLS, Cmd
from rpcnet.protocol.messages import SET_TENSOR_HEADER
from rpcnet.server.session import Session


class Mode(enum.Enum):
    """Where a command's work happens, and so which effects its handler returns."""

    INLINE = "inline"  # payload read whole; the handler replies (or not) on the event loop
    STREAMED = "streamed"  # a prefix, then the data straight into the destination buffer
    CACHE = "cache"  # a cache-file read on a thread, then the reply (or the reply at once)
    WORKER = "worker"  # a plan launched on the device worker
    PEER = "peer"  # a peer link opened, reduced over (on its thread) or closed


class Order(enum.Enum):
    """Where a command stands relative to the graphs its connection launched (spec §8.6)."""

    AT_ONCE = "at once"  # runs as soon as it is read
    AFTER_GRAPHS = "after graphs"  # waits until they finished: it touches their memory
    BEHIND_GRAPHS = "behind graphs"  # launched after them on the chain, not waited for


class Payload(enum.Enum):
    """How a request payload is received and accounted for."""

    FIXED = "fixed"  # exactly `request_size` bytes (at most a few KiB: never counted)
    STAGED = "staged"  # held whole while the command runs, counted against --mem/--client-mem
    STREAMED = "streamed"  # a fixed prefix, then received into the destination buffer


BOTH = (8, 7)
V8_ONLY = (8,)


@dataclass(frozen=True, slots=True)
class Command:
    cmd: Cmd
    handler: Callable[..., Any]  # a Session method: (payload) or, streamed, (prefix, data_len)
    mode: Mode = Mode.INLINE
    order: Order = Order.AT_ONCE
    payload: Payload = Payload.FIXED
    cap: str | None = None  # the ServerConfig field that caps a variable payload
    in_callback: bool = True  # the protocol callback may run it once its bytes are staged
    dialects: tuple[int, ...] = BOTH
    prefix: int = 0  # streamed: the bytes read before the handler runs
    request_size: int | None = None  # this dialect's fixed size (`rows`); None: variable
    waits: bool = field(init=False)  # order is AFTER_GRAPHS (read once per frame)

    def __post_init__(self) -> None:
        object.__setattr__(self, "waits", self.order is Order.AFTER_GRAPHS)

    @property
    def name(self) -> str:
        return self.cmd.name


_AFTER = Order.AFTER_GRAPHS
_STAGED = Payload.STAGED
_GRAPH = "max_graph"

COMMANDS: tuple[Command, ...] = (
    Command(Cmd.ALLOC_BUFFER, Session.alloc_buffer),
    Command(Cmd.GET_ALIGNMENT, Session.get_alignment),
    Command(Cmd.GET_MAX_SIZE, Session.get_max_size),
    Command(Cmd.BUFFER_GET_BASE, Session.buffer_get_base),
    Command(Cmd.FREE_BUFFER, Session.free_buffer, order=_AFTER),
    Command(Cmd.BUFFER_CLEAR, Session.buffer_clear, order=_AFTER),
    Command(
        Cmd.SET_TENSOR,
        Session.set_tensor,
        Mode.STREAMED,
        _AFTER,
        Payload.STREAMED,
        cap="max_data",
        prefix=SET_TENSOR_HEADER,
    ),
    Command(Cmd.SET_TENSOR_HASH, Session.set_tensor_hash, Mode.CACHE, _AFTER, in_callback=False),
    Command(Cmd.GET_TENSOR, Session.get_tensor, order=_AFTER),
    Command(Cmd.COPY_TENSOR, Session.copy_tensor, order=_AFTER),
    Command(Cmd.GRAPH_COMPUTE, Session.graph_compute, Mode.WORKER, payload=_STAGED, cap=_GRAPH),
    Command(Cmd.GET_DEVICE_MEMORY, Session.get_device_memory),
    Command(Cmd.INIT_TENSOR, Session.init_tensor, order=_AFTER),
    Command(Cmd.GET_ALLOC_SIZE, Session.get_alloc_size),
    Command(Cmd.HELLO, Session.hello, in_callback=False),  # first and once: `Connection._serve`
    Command(Cmd.DEVICE_COUNT, Session.device_count),
    Command(Cmd.GRAPH_RECOMPUTE, Session.graph_recompute, Mode.WORKER),
    Command(Cmd.MEMSET_TENSOR, Session.memset_tensor, order=_AFTER),
    Command(
        Cmd.SET_TENSOR_2D,
        Session.set_tensor_2d,
        order=_AFTER,
        payload=_STAGED,
        cap="max_data",
        dialects=V8_ONLY,
    ),
    Command(Cmd.GET_TENSOR_2D, Session.get_tensor_2d, order=_AFTER, dialects=V8_ONLY),
    Command(Cmd.COMM_INIT, Session.comm_init, Mode.PEER, in_callback=False, dialects=V8_ONLY),
    Command(
        Cmd.COMM_ALLREDUCE,
        Session.comm_allreduce,
        Mode.PEER,
        Order.BEHIND_GRAPHS,
        dialects=V8_ONLY,
    ),
    Command(Cmd.COMM_FREE, Session.comm_free, Mode.PEER, in_callback=False, dialects=V8_ONLY),
)

ID_SPACE = 256  # a header's command byte


@functools.cache
def rows(proto: int) -> tuple[Command | None, ...]:
    """`proto`'s rows indexed by command id (None: no such command in this dialect), each with
    the codec's fixed request size for the dialect."""
    if proto not in SUPPORTED_PROTOCOLS:
        raise ValueError(f"unsupported protocol {proto}; choose one of {SUPPORTED_PROTOCOLS}")
    by_id: list[Command | None] = [None] * ID_SPACE
    for row in COMMANDS:
        if proto in row.dialects:
            assert _native.command_name(proto, row.cmd) == row.name, "the codec disagrees"
            by_id[row.cmd] = replace(row, request_size=_native.request_size(proto, row.cmd))
    return tuple(by_id)
