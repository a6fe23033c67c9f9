"""One client's session: its buffers, graph cache and command semantics (spec §7, §8).

Sans-I/O: each handler takes a request payload and returns an `Effect`
(`rpcnet.server.effects`): reply bytes, None, or what the connection is to do for it — receive
SET_TENSOR's data into a buffer, read a cache entry (SET_TENSOR_HASH), launch a plan on the device
worker, open, reduce over or close a peer link (COMM_*). The session never awaits and never
touches a socket or a file; `rpcnet.server.command_table` names the handler of each command.
Any client error raises `ProtocolViolation` (or a narrow native error), which closes this
connection only.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rpcnet import _native
from rpcnet.compute import plan_sharing
from rpcnet.compute.backend import HostSink
from rpcnet.compute.buffer import DeviceBuffer
from rpcnet.compute.device import Device
from rpcnet.compute.errors import ComputeError
from rpcnet.compute.graph import Plan, build_nodes, compile_plan
from rpcnet.compute.shared_content import enabled as sharing_enabled
from rpcnet.compute.shared_content import store_of
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import type_name
from rpcnet.protocol import messages as msg
from rpcnet.protocol.commands import NO_CAPS, version_triple
from rpcnet.server.buffers import BufferTable
from rpcnet.server.chain import Chain, Runner
from rpcnet.server.comm import ELEMENT_SIZE
from rpcnet.server.effects import (
    CacheRead,
    LaunchPlan,
    PeerAllreduce,
    PeerClose,
    PeerOpen,
    ReceiveInto,
)
from rpcnet.server.shared_weights import (
    UploadSink,
    attach_held,
    fresh,
    load_traced,
    settle,
    shareable,
    trusted,
)

log = logging.getLogger("rpcnet.session")

GRAPH_CACHE_MAX = 1024  # per device; must match the client's rule exactly (spec §8.4)
STAGING_FREE = 1 << 20  # frame payloads up to this size are not counted (one at a time)


class ProtocolViolation(Exception):
    """The client sent something the protocol does not allow; close its connection."""


@dataclass(frozen=True)
class SessionLimits:
    graph_nodes: int = 1 << 16  # nodes and tensors per GRAPH_COMPUTE
    client_mem: int | None = None  # bytes of buffers one connection may hold


class Session:
    def __init__(
        self,
        proto: int,
        devices: list[Device],
        limits: SessionLimits = SessionLimits(),
        caching: bool = False,
    ) -> None:
        self.proto = proto
        self.limits = limits
        self.devices = devices
        self.caching = caching  # the server has a hash cache (spec §7.12)
        self.buffers = BufferTable()
        self._graphs: list[OrderedDict[int, Plan]] = [OrderedDict() for _ in devices]
        # plan uid -> (its nodes, the buffer layouts it was built against): rebuilt when shared
        # ranges of its buffers changed (compute/plan_sharing.py)
        self._built: dict[int, tuple[list[Tensor], plan_sharing.Layouts]] = {}
        self._last_graph: list[Plan | None] = [None for _ in devices]  # v7 keeps one per device
        self._pending: list[Future[None]] = []
        self._chain = Chain()  # launched work runs in order, across devices and peer links
        self._linked: set[int] = set()  # devices with a peer link (spec §11; the connection
        # holds the links themselves)
        self._comm_held: dict[int, int] = {}  # peer receive scratch counted, by device
        self._staged = 0  # bytes of large frame payloads held while their command runs
        self.hello_done = False
        self.tenant: Any = None  # a `TenantShare` (--tokens): its MEM caps all its sessions

    def join(self, share: Any) -> None:
        """Count this session against its tenant's MEM (`rpcnet.server.tenants.TenantShare`)."""
        self.tenant = share
        share.sessions.add(self)

    def _tenant_over(self, extra: int) -> tuple[int, int] | None:
        """(would hold, MEM) when `extra` more bytes put the tenant over its MEM."""
        share = self.tenant
        if share is None or share.mem is None:
            return None
        total = share.held() + extra
        return (total, share.mem) if total > share.mem else None

    # ---------------------------------------------------------------- helpers

    def device(self, index: int) -> Device:
        if index >= len(self.devices):
            raise ProtocolViolation(f"device {index} out of range ({len(self.devices)} devices)")
        return self.devices[index]

    def buffer(self, handle: int) -> DeviceBuffer:
        buf = self.buffers.get(handle)
        if buf is None:
            raise ProtocolViolation(f"unknown buffer handle {handle:#x}")
        return buf

    def locate(self, t: _native.RpcTensor) -> tuple[DeviceBuffer | None, int]:
        """Deserialize-validate a wire tensor (spec §5.1); unknown handles mean "no buffer"."""
        nbytes = t.nbytes()  # raises TensorError for invalid or removed types, overflow
        buf = self.buffers.get(t.buffer) if t.buffer else None
        if buf is None:
            return None, 0
        if t.nelements() > 0 or self.proto == 7:
            _native.check_tensor_in_buffer(t.data, nbytes, buf.base, buf.size)
        return buf, t.data - buf.base

    def tensor_with_buffer(self, t: _native.RpcTensor) -> tuple[DeviceBuffer, int]:
        buf, offset = self.locate(t)
        if buf is None:
            raise ProtocolViolation(f"tensor {t.name!r} has no buffer on this connection")
        return buf, offset

    # ---------------------------------------------------------------- handshake & queries

    def hello(self, server_caps: bytes = NO_CAPS) -> bytes:
        """The HELLO response; `server_caps` is what the transport negotiation answered to the
        client's caps (zero caps on a TCP-only server, spec §2)."""
        if self.hello_done:
            raise ProtocolViolation("second HELLO")
        self.hello_done = True
        return msg.hello_response(*version_triple(self.proto), server_caps)

    def device_count(self, payload: bytes) -> bytes:
        return msg.u32(len(self.devices))

    def get_alignment(self, payload: bytes) -> bytes:
        return msg.u64(self.device(msg.parse_u32(payload)).alignment)

    def get_max_size(self, payload: bytes) -> bytes:
        return msg.u64(self.device(msg.parse_u32(payload)).max_size)

    def get_device_memory(self, payload: bytes) -> bytes:
        return msg.u64_pair(*self.device(msg.parse_u32(payload)).memory_report())

    def get_alloc_size(self, payload: bytes) -> bytes:
        req = msg.parse_alloc_size(payload)
        self.device(req.device)
        self.locate(req.tensor)  # an invalid tensor closes; invalid sources are ignored
        # CPU-style devices need exactly ggml_nbytes; the answer depends only on the key fields.
        return msg.u64(req.tensor.nbytes())

    # ---------------------------------------------------------------- buffers

    def bytes_held(self) -> int:
        """What this connection makes the server hold: buffers and its graph plans."""
        plans = [p for cache in self._graphs for p in cache.values()]
        plans += [p for p in self._last_graph if p is not None]
        comm_bytes = sum(self._comm_held.values())
        return self.buffers.bytes_held + sum(p.footprint for p in plans) + comm_bytes + self._staged

    def _hold(self, device: Device, nbytes: int, what: str) -> None:
        """Count `nbytes` against --client-mem and the device's --mem, or close the connection."""
        self._check_quota(nbytes, what)
        if not device.memory.reserve(nbytes):
            raise ProtocolViolation(f"{what} of {nbytes} bytes: device memory is full (--mem)")

    @contextmanager
    def staging(self, nbytes: int) -> Iterator[None]:
        """Count a payload held whole in memory (GRAPH_COMPUTE, SET_TENSOR_2D, a 2-D read)."""
        if nbytes <= STAGING_FREE:
            yield
            return
        device = self.devices[0]
        self._hold(device, nbytes, "receive staging")
        self._staged += nbytes
        try:
            yield
        finally:
            self._staged -= nbytes
            device.memory.release(nbytes)

    def _drop_link(self, device: int) -> None:
        """Forget `device`'s peer link (the connection closes it) and release its receive buffer."""
        self._linked.discard(device)
        held = self._comm_held.pop(device, 0)
        if held:
            self.devices[device].memory.release(held)

    def _check_quota(self, extra: int, what: str) -> None:
        """Non-buffer holdings over --client-mem close the connection (nothing to answer 0 to)."""
        quota = self.limits.client_mem
        held = self.bytes_held() + extra
        if quota is not None and held > quota:
            raise ProtocolViolation(
                f"{what}: the connection would hold {held} bytes, over its quota of "
                f"{quota} bytes (--client-mem)"
            )
        over = self._tenant_over(extra)
        if over is not None:
            raise ProtocolViolation(
                f"{what}: tenant {self.tenant.name!r} would hold {over[0]} bytes, over its MEM "
                f"of {over[1]} bytes (--tokens)"
            )

    def alloc_buffer(self, payload: bytes) -> bytes:
        req = msg.parse_alloc(payload)
        quota = self.limits.client_mem
        if quota is not None and req.size > quota - self.bytes_held():
            log.warning(
                "allocation of %d bytes refused: connection quota of %d bytes (--client-mem)",
                req.size,
                quota,
            )
            return msg.u64_pair(0, 0)
        over = self._tenant_over(req.size)
        if over is not None:
            log.warning(
                "allocation of %d bytes refused: tenant %r would hold %d bytes, over its MEM of "
                "%d bytes (--tokens)",
                req.size,
                self.tenant.name,
                over[0],
                over[1],
            )
            return msg.u64_pair(0, 0)
        buf = self.buffers.allocate(self.device(req.device), req.size)
        if buf is None:
            log.info(
                "allocation of %d bytes on device %d refused: not enough memory",
                req.size,
                req.device,
            )
            return msg.u64_pair(0, 0)
        return msg.u64_pair(buf.handle, buf.size)

    def buffer_get_base(self, payload: bytes) -> bytes:
        return msg.u64(self.buffer(msg.parse_u64(payload)).base)

    def free_buffer(self, payload: bytes) -> None:
        handle = msg.parse_u64(payload)
        self.buffer(handle)
        self._invalidate_graphs(handle)
        for device in self.devices:
            device.buffer_freed(handle)  # a captured CUDA graph may point into it
        self.buffers.free(handle)

    def buffer_clear(self, payload: bytes) -> None:
        req = msg.parse_clear(payload)
        buf = self.buffer(req.handle)
        buf.touched()
        buf.fill(0, buf.size, req.value)

    # ---------------------------------------------------------------- tensor data

    def init_tensor(self, payload: bytes) -> None:
        t = _native.decode_tensor(payload)
        buf, _ = self.locate(t)
        if buf is None:
            log.debug("INIT_TENSOR for tensor %r without buffer ignored", t.name)

    def set_tensor(self, prefix: bytes, data_len: int) -> ReceiveInto:
        """SET_TENSOR, given its header: where its `data_len` bytes of data are to land."""
        head = msg.parse_set_tensor_header(prefix)
        buf, rel = self.tensor_with_buffer(head.tensor)
        _native.check_region(
            buf.base, buf.size, head.tensor.data, head.offset, data_len, head.tensor.nbytes()
        )
        start = rel + head.offset
        buf.touched()
        array = fresh(buf, data_len) if shareable(buf, data_len) else None
        if array is not None:  # held once if another client holds the same bytes
            upload = UploadSink(array, lambda a: settle(buf, start, a))
            return ReceiveInto(upload, head.cache and self.caching, buf, start, upload.commit)
        sink = buf.host_sink(start, data_len)
        return ReceiveInto(sink, head.cache and self.caching, buf, start)

    def set_tensor_hash(self, payload: bytes) -> CacheRead | bytes:
        """The cache read to do, or the response right away (no cache: "not found")."""
        req = msg.parse_set_tensor_hash(payload)
        if not self.caching:
            return self.set_tensor_hash_response(False)

        sinks: list[HostSink] = []
        arrays: list[tuple[DeviceBuffer, int, Any]] = []  # received to be shared

        def destination(size: int) -> tuple[DeviceBuffer, int]:
            # Only reached when the entry exists: a miss answers 0 without validating (spec §7.11).
            buf, rel = self.tensor_with_buffer(req.tensor)
            _native.check_region(
                buf.base, buf.size, req.tensor.data, req.offset, size, req.tensor.nbytes()
            )
            buf.touched()
            return buf, rel + req.offset

        def target(size: int) -> Any:
            buf, start = destination(size)
            array = fresh(buf, size) if shareable(buf, size) else None
            if array is not None:
                arrays.append((buf, start, array))
                return memoryview(array)
            sinks.append(buf.host_sink(start, size))
            return sinks[-1].whole()

        def loaded() -> None:
            for sink in sinks:
                sink.commit()

        def answer(cache: Any) -> bool:
            held = self._held_content(req.tensor, req.hash, cache)
            if held is not None:
                try:
                    buf, start = destination(held.nbytes)
                except BaseException:
                    held.release()
                    raise
                attach_held(buf, start, held)
                return True
            arrays.clear()
            hit = load_traced(cache, req.hash, target)
            if hit is None:
                return False
            loaded()
            if arrays:  # the last target is the one the entry was read into
                buf, start, array = arrays[-1]
                origin, strong = hit
                settle(buf, start, array, strong, req.hash, origin or None)
            return True

        return CacheRead(req.hash, target, loaded, answer)

    def _held_content(self, tensor: _native.RpcTensor, digest: int, cache: Any) -> Any:
        """The shared content named `digest` that this client's cache lookups would trust
        (a new user of it), or None."""
        buf = self.buffers.get(tensor.buffer) if tensor.buffer else None
        if buf is None or not buf.device.backend.shares or not sharing_enabled():
            return None
        return store_of(buf.device).by_fnv(digest, trusted(cache))

    @staticmethod
    def set_tensor_hash_response(found: bool) -> bytes:
        return msg.u8(1 if found else 0)

    def get_tensor(self, payload: bytes) -> Any:
        req = msg.parse_tensor_range(payload)
        buf, rel = self.tensor_with_buffer(req.tensor)
        _native.check_region(
            buf.base, buf.size, req.tensor.data, req.offset, req.size, req.tensor.nbytes()
        )
        return buf.read(rel + req.offset, req.size)

    def memset_tensor(self, payload: bytes) -> None:
        req = msg.parse_memset(payload)
        buf, rel = self.tensor_with_buffer(req.tensor)
        _native.check_memset(
            buf.base, buf.size, req.tensor.data, req.offset, req.size, req.tensor.nbytes()
        )
        buf.touched()
        buf.fill(rel + req.offset, req.size, req.value)

    def copy_tensor(self, payload: bytes) -> bytes:
        req = msg.parse_copy(payload)
        src_buf, src_rel = self.tensor_with_buffer(req.src)
        dst_buf, dst_rel = self.tensor_with_buffer(req.dst)
        n = req.src.nbytes()
        if req.dst.data + n > dst_buf.base + dst_buf.size:
            raise ProtocolViolation("COPY_TENSOR destination range exceeds its buffer")
        dst_buf.touched()
        dst_buf.copy_from(dst_rel, src_buf, src_rel, n)
        return msg.u8(1)

    def _rows_2d(self, req: msg.Transfer2D, data_len: int | None) -> tuple[DeviceBuffer, int]:
        """Validate a 2-D transfer (spec §7.16/§7.17); (buffer, offset of row 0 in it)."""
        buf, rel = self.tensor_with_buffer(req.tensor)
        t = req.tensor
        _native.check_region_2d(
            buf.base,
            buf.size,
            t.data,
            t.nbytes(),
            req.offset,
            req.size,
            req.n_copies,
            req.stride,
            data_len,
        )
        return buf, rel + req.offset

    def set_tensor_2d(self, payload: bytes) -> None:
        req = msg.parse_transfer_2d(payload)
        buf, base = self._rows_2d(req, len(payload) - msg.TRANSFER_2D_HEADER)
        buf.touched()
        rows = memoryview(payload)[msg.TRANSFER_2D_HEADER :]
        for i in range(req.n_copies):
            buf.write(base + i * req.stride, rows[i * req.size : (i + 1) * req.size])

    def get_tensor_2d(self, payload: bytes) -> bytes:
        req = msg.parse_transfer_2d(payload)
        buf, base = self._rows_2d(req, None)
        # Rows may repeat (stride 0): the response is counted like a received payload.
        with self.staging(req.size * req.n_copies):
            return b"".join(buf.read(base + i * req.stride, req.size) for i in range(req.n_copies))

    # ---------------------------------------------------------------- graphs

    def graph_compute(self, payload: bytes) -> LaunchPlan:
        graph = _native.decode_graph(self.proto, payload)
        device = self.device(graph.device)
        limit = self.limits.graph_nodes
        if len(graph.nodes) > limit or len(graph.tensors) > limit:
            raise ProtocolViolation(
                f"graph of {len(graph.nodes)} nodes / {len(graph.tensors)} tensors exceeds "
                f"the limit of {limit}"
            )
        try:
            nodes = build_nodes(graph, self.locate, self.buffers.regions, self.proto == 7)
            plan = self._build(nodes, device)
        except _native.TensorError as exc:
            raise ComputeError(f"invalid tensor in graph: {exc}") from exc
        if self.proto == 7:
            self._last_graph[graph.device] = plan
        elif graph.uid:
            cache = self._graphs[graph.device]
            if len(cache) >= GRAPH_CACHE_MAX:
                cache.clear()
            cache[graph.uid] = plan
        else:
            self._built.pop(plan.uid, None)  # uid 0: run once, never again
        try:
            self._check_quota(0, f"graph cache (this graph: {plan.footprint} bytes)")
        except ProtocolViolation:
            plan.release()  # the traceback may keep the plan alive past this connection
            raise
        return LaunchPlan(device, plan)

    def graph_recompute(self, payload: bytes) -> LaunchPlan:
        req = msg.parse_graph_recompute(self.proto, payload)
        device = self.device(req.device)
        if self.proto == 7:
            plan = self._last_graph[req.device]
        else:
            plan = self._graphs[req.device].get(req.uid) if req.uid else None
        if plan is None:
            raise ProtocolViolation(
                f"GRAPH_RECOMPUTE of unknown graph uid {req.uid} on device {req.device}"
            )
        built = self._built.get(plan.uid)
        if built is not None and plan_sharing.stale(built[1]):
            plan = self._build(built[0], device)  # shared ranges changed: resolve anew
            if self.proto == 7:
                self._last_graph[req.device] = plan
            else:
                self._graphs[req.device][req.uid] = plan
        return LaunchPlan(device, plan)

    def _build(self, nodes: list[Tensor], device: Device) -> Plan:
        """Compile `nodes`, its tensors resolved against the buffers' shared ranges as they
        are now (copy on write where it writes; compute/plan_sharing.py)."""
        layouts = plan_sharing.prepare(nodes)
        plan = compile_plan(nodes, device.kind, budget=device.scratch)
        if len(self._built) >= 2 * GRAPH_CACHE_MAX:  # forget plans no longer cached
            live = {p.uid for cache in self._graphs for p in cache.values()}
            live |= {p.uid for p in self._last_graph if p is not None}
            self._built = {uid: b for uid, b in self._built.items() if uid in live}
        self._built[plan.uid] = (nodes, layouts)
        return plan

    def launch(self, runner: Runner, work: Callable[[], None]) -> Future[None]:
        """Run `work` on `runner` (a device's worker, a peer link's thread) after everything
        this connection launched before; commands that touch memory wait for it."""
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        future = self._chain.launch(runner, work)
        self._pending.append(future)
        return future

    def has_pending(self) -> bool:
        """Whether launched work is unfinished or failed (a short plan may have run inline)."""
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        return bool(self._pending)

    def take_pending(self) -> list[Future[None]]:
        """Graph work this connection launched and has not waited for yet."""
        pending, self._pending = self._pending, []
        return pending

    def _invalidate_graphs(self, handle: int) -> None:
        for cache in self._graphs:
            for uid in [uid for uid, plan in cache.items() if handle in plan.buffers]:
                del cache[uid]
        self._last_graph = [
            p if p is None or handle not in p.buffers else None for p in self._last_graph
        ]

    # ---------------------------------------------------------------- multi-host (spec §11)

    def comm_init(self, payload: bytes) -> PeerOpen | bytes:
        """COMM_INIT: the peer link to open (`comm_init_done` answers), or the answer now."""
        req = msg.parse_comm_init(payload)
        if req.device >= len(self.devices) or req.world != 2 or req.rank >= req.world:
            return msg.u8(0)
        if req.device in self._linked:  # already linked: ok, other parameters ignored
            return msg.u8(1)
        return PeerOpen(req)

    def comm_init_done(self, device: int, linked: bool) -> bytes:
        """`linked` False: the client falls back to its own reduction."""
        if linked:
            self._linked.add(device)
        return msg.u8(1 if linked else 0)

    def comm_allreduce(self, payload: bytes) -> PeerAllreduce | None:
        """COMM_ALLREDUCE, validated; None when empty. The exchange is `launch`ed on its peer
        link's thread, so that it runs after this connection's graphs."""
        device = msg.parse_u32(payload)
        self.device(device)
        if device not in self._linked:
            raise ProtocolViolation("COMM_ALLREDUCE without a peer link")
        t = _native.decode_tensor(payload, 4)
        buf, rel = self.tensor_with_buffer(t)
        nbytes = t.nbytes()
        if nbytes == 0:
            return None
        size = ELEMENT_SIZE.get(t.type)
        ne = t.nelements()
        if size is None or nbytes != ne * size:  # no gaps: the add is elementwise
            raise ProtocolViolation(
                f"COMM_ALLREDUCE needs a contiguous F32, F16 or BF16 tensor, got "
                f"{type_name(t.type)} ne={t.ne} nb={t.nb}"
            )
        held = self._comm_held.get(device, 0)
        if nbytes > held:  # the link keeps a receive buffer as large as its largest tensor
            self._hold(self.devices[device], nbytes - held, "COMM_ALLREDUCE receive buffer")
            self._comm_held[device] = nbytes
        buf.touched()
        return PeerAllreduce(device, buf.host_array(rel, nbytes), t.type, ne, buf, rel)

    def comm_failed(self, device: int, reason: str) -> ProtocolViolation:
        """The peer link of `device` broke (the connection closes it): the error to raise."""
        self._drop_link(device)
        return ProtocolViolation(f"pairwise allreduce failed: {reason}")

    def comm_free(self, payload: bytes) -> PeerClose:
        """COMM_FREE: the device whose peer link (if any) the connection closes."""
        device = msg.parse_u32(payload)
        self.device(device)
        self._drop_link(device)
        return PeerClose(device)

    # ---------------------------------------------------------------- teardown

    def close(self) -> int:
        """Free everything this connection held; returns the bytes released."""
        for cache in self._graphs:
            for plan in cache.values():
                plan.release()
            cache.clear()
        for last in self._last_graph:
            if last is not None:
                last.release()
        self._last_graph = [None for _ in self.devices]
        self._built.clear()
        for device in self._linked | set(self._comm_held):  # also without COMM_FREE
            self._drop_link(device)
        for dev in self.devices:
            dev.owner_closed(self)
        if self.tenant is not None:
            self.tenant.sessions.discard(self)
        return self.buffers.free_all()
