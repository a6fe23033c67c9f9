"""What a session handler asks its connection to do: one `Effect` per command (spec §7, §8, §11).

A handler returns reply bytes, None (no reply), or a description of the I/O or work it cannot
do itself, as a sans-I/O session never awaits or touches a socket, file or thread. The connection
(`rpcnet.server.connection`) has one executor per kind and knows nothing else about commands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rpcnet.compute.backend import HostSink
from rpcnet.compute.buffer import DeviceBuffer
from rpcnet.protocol.messages import CommInit
from rpcnet.server.shared_weights import vouch

if TYPE_CHECKING:
    from rpcnet.compute.device import Device
    from rpcnet.compute.graph import Plan

Reply = bytes | memoryview  # a response payload: sent as is (zero-copy when large)


@dataclass
class ReceiveInto:
    """SET_TENSOR: receive the data straight into `sink` (on the CPU the buffer region itself)."""

    sink: HostSink  # receive into sink.pieces(); on the CPU the one piece is device memory
    cache: bool  # store the payload in the hash cache once received
    buffer: DeviceBuffer
    offset: int
    # after the last piece, on a thread: identify and share the bytes (shared weights)
    settle: Callable[[], None] | None = None

    def received(self) -> memoryview:
        """The payload as it now is in the buffer, for the hash cache (zero-copy on the CPU)."""
        return self.buffer.read(self.offset, self.sink.nbytes)

    def store_in(self, cache: Any) -> None:
        """Store the payload in the hash cache (on a thread); what the store computed names
        the shared content the range points at (compute/shared_content.py)."""
        vouch(self.buffer, self.offset, self.sink.nbytes, cache.store_hashed(self.received()))


@dataclass
class CacheRead:
    """SET_TENSOR_HASH with a cache: read entry `digest` into `target(size)` (which validates the
    destination for that size, and may raise), then answer `set_tensor_hash_response(found)`."""

    digest: int
    target: Callable[[int], Any]
    loaded: Callable[[], None] = lambda: None  # after a hit: moves the bytes onto the device
    # the whole lookup, given the connection's cache (shared weights: memory first)
    answer: Callable[[Any], bool] | None = None

    def run(self, cache: Any) -> bool:
        """Look up, load and answer (on a thread): whether the entry was found."""
        if self.answer is not None:
            return self.answer(cache)
        found = bool(cache.load_into(self.digest, self.target))
        if found:
            self.loaded()
        return found


@dataclass(slots=True)
class LaunchPlan:
    """GRAPH_COMPUTE / GRAPH_RECOMPUTE: run `plan` on `device`'s worker, after everything the
    connection launched before (`Session.launch`); commands that touch memory wait for it."""

    device: Device
    plan: Plan


@dataclass
class PeerOpen:
    """COMM_INIT: open the peer link `request` describes, then answer `comm_init_done`."""

    request: CommInit


@dataclass
class PeerAllreduce:
    """COMM_ALLREDUCE: swap `region` with the peer of `device` and add its values; then `done()`.
    Launched on the link's thread behind the connection's graphs, never waited for."""

    device: int
    region: Any  # the tensor's bytes (uint8 host array: device memory itself on the CPU)
    type_id: int
    ne: int
    buffer: DeviceBuffer
    offset: int = 0

    def done(self) -> None:
        self.buffer.write_back(self.offset, self.region)  # no-op on host memory
        self.buffer.touched()  # derived caches must not trust what the add changed


@dataclass
class PeerClose:
    """COMM_FREE: close the peer link of `device`, if there is one."""

    device: int


Effect = (
    bytes | memoryview | ReceiveInto | CacheRead | LaunchPlan | PeerOpen | PeerAllreduce | PeerClose
) | None
