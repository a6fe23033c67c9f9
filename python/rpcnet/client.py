"""Clients for the ggml RPC protocol (a supported API; see the README's "Python client").

* `RpcClient`: asyncio, TCP, one method per command (tests and benchmarks drive servers with it).
* `connect_client` -> `ClientConnection`: blocking, negotiates the transport through HELLO's caps
  like a llama.cpp client (RDMA when both sides offer it, else TCP), then raw `call`s over it;
  `rpcnet caps HOST:PORT` is built on it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from dataclasses import dataclass

from rpcnet import _native
from rpcnet.protocol import messages as msg
from rpcnet.protocol.commands import (
    HELLO,
    HELLO_CAPS_SIZE,
    HELLO_RESPONSE_SIZE,
    NO_CAPS,
    Cmd,
)
from rpcnet.transport.base import Transport, TransportError
from rpcnet.transport.negotiate import Outcome, caps_problem, decide
from rpcnet.transport.rdma import RdmaActivationError, RdmaEndpoint, RdmaProvider, RdmaUnavailable
from rpcnet.transport.tcp import TcpTransport

log = logging.getLogger("rpcnet.transport")

_SIZE = struct.Struct("<Q")


class ServerClosed(Exception):
    """The server closed the connection instead of answering."""


@dataclass
class Hello:
    version: tuple[int, int, int]
    server_caps: bytes
    client_caps: bytes


class RpcClient:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proto: int = 8
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.proto = proto
        self.hello_info: Hello | None = None  # set by connect(hello=True)

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        proto: int = 8,
        hello: bool = True,
        caps: bytes = NO_CAPS,
    ) -> RpcClient:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = cls(reader, writer, proto)
        if hello:
            client.hello_info = await client.hello(caps)
        return client

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    async def __aenter__(self) -> RpcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ framing

    def send(self, cmd: int, payload: bytes = b"") -> None:
        self.writer.write(msg.request(cmd, payload))

    async def recv(self, expected: int | None = None) -> bytes:
        try:
            (size,) = _SIZE.unpack(await self.reader.readexactly(8))
            if expected is not None and size != expected:
                raise ServerClosed(f"response size {size}, expected {expected}")
            return await self.reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise ServerClosed("server closed the connection") from exc

    async def call(self, cmd: int, payload: bytes = b"", expected: int | None = None) -> bytes:
        self.send(cmd, payload)
        await self.flush()
        return await self.recv(expected)

    async def post(self, cmd: int, payload: bytes = b"") -> None:
        """A command without a response."""
        self.send(cmd, payload)
        await self.flush()

    async def flush(self) -> None:
        # A server that closes on a bad request may reset the socket while we still send.
        try:
            await self.writer.drain()
        except ConnectionError as exc:
            raise ServerClosed("server closed the connection") from exc

    # ------------------------------------------------------------ commands

    async def hello(self, caps: bytes = NO_CAPS) -> Hello:
        rsp = await self.call(Cmd.HELLO, caps, HELLO_RESPONSE_SIZE)
        version, server_caps = msg.parse_hello_response(rsp)
        return Hello(version, server_caps, caps)

    async def device_count(self) -> int:
        return msg.parse_u32(await self.call(Cmd.DEVICE_COUNT, b"", 4))

    async def alignment(self, device: int = 0) -> int:
        return msg.parse_u64(await self.call(Cmd.GET_ALIGNMENT, msg.u32(device), 8))

    async def max_size(self, device: int = 0) -> int:
        return msg.parse_u64(await self.call(Cmd.GET_MAX_SIZE, msg.u32(device), 8))

    async def device_memory(self, device: int = 0) -> tuple[int, int]:
        rsp = await self.call(Cmd.GET_DEVICE_MEMORY, msg.u32(device), 16)
        return struct.unpack("<QQ", rsp)

    async def alloc_buffer(self, size: int, device: int = 0) -> tuple[int, int]:
        rsp = await self.call(Cmd.ALLOC_BUFFER, msg.alloc_request(device, size), 16)
        return struct.unpack("<QQ", rsp)

    async def buffer_base(self, handle: int) -> int:
        return msg.parse_u64(await self.call(Cmd.BUFFER_GET_BASE, msg.u64(handle), 8))

    async def free_buffer(self, handle: int) -> None:
        await self.post(Cmd.FREE_BUFFER, msg.u64(handle))

    async def buffer_clear(self, handle: int, value: int) -> None:
        await self.post(Cmd.BUFFER_CLEAR, msg.u64(handle) + msg.u8(value))

    async def set_tensor(
        self, tensor: _native.RpcTensor, offset: int, data: bytes, cache: bool = False
    ) -> None:
        await self.post(Cmd.SET_TENSOR, msg.set_tensor_payload(tensor, offset, data, cache))

    async def set_tensor_hash(self, tensor: _native.RpcTensor, offset: int, digest: int) -> bool:
        payload = tensor.to_bytes() + struct.pack("<QQ", offset, digest)
        return (await self.call(Cmd.SET_TENSOR_HASH, payload, 1)) != b"\0"

    async def get_tensor(self, tensor: _native.RpcTensor, offset: int, size: int) -> bytes:
        return await self.call(Cmd.GET_TENSOR, msg.tensor_range(tensor, offset, size), size)

    async def memset_tensor(
        self, tensor: _native.RpcTensor, offset: int, size: int, value: int
    ) -> None:
        await self.post(Cmd.MEMSET_TENSOR, msg.memset_payload(tensor, offset, size, value))

    async def copy_tensor(self, src: _native.RpcTensor, dst: _native.RpcTensor) -> bool:
        return (await self.call(Cmd.COPY_TENSOR, src.to_bytes() + dst.to_bytes(), 1)) != b"\0"

    async def init_tensor(self, tensor: _native.RpcTensor) -> None:
        await self.post(Cmd.INIT_TENSOR, tensor.to_bytes())

    async def alloc_size(
        self,
        tensor: _native.RpcTensor,
        srcs: list[_native.RpcTensor] | None = None,
        device: int = 0,
    ) -> int:
        src_bytes = b"".join(s.to_bytes() for s in (srcs or []))
        src_bytes += bytes(_native.RPC_TENSOR_SIZE * (10 - len(srcs or [])))
        return msg.parse_u64(
            await self.call(Cmd.GET_ALLOC_SIZE, msg.u32(device) + tensor.to_bytes() + src_bytes, 8)
        )

    async def graph_compute(
        self, nodes: list[int], tensors: list[_native.RpcTensor], uid: int = 0, device: int = 0
    ) -> None:
        await self.post(
            Cmd.GRAPH_COMPUTE, msg.graph_payload(self.proto, device, uid, nodes, tensors)
        )

    async def graph_recompute(self, uid: int = 0, device: int = 0) -> None:
        payload = msg.u32(device) if self.proto == 7 else struct.pack("<IQ", device, uid)
        await self.post(Cmd.GRAPH_RECOMPUTE, payload)

    async def set_tensor_2d(
        self, tensor: _native.RpcTensor, offset: int, size: int, stride: int, rows: bytes
    ) -> None:
        n_copies = len(rows) // size if size else 0
        await self.post(
            Cmd.SET_TENSOR_2D, msg.transfer_2d(tensor, offset, size, n_copies, stride) + rows
        )

    async def get_tensor_2d(
        self, tensor: _native.RpcTensor, offset: int, size: int, n_copies: int, stride: int
    ) -> bytes:
        return await self.call(
            Cmd.GET_TENSOR_2D,
            msg.transfer_2d(tensor, offset, size, n_copies, stride),
            size * n_copies,
        )

    async def comm_init(
        self, device: int, rank: int, world: int, port: int, host: str = ""
    ) -> bool:
        rsp = await self.call(
            Cmd.COMM_INIT, msg.comm_init_payload(device, rank, world, port, host), 1
        )
        return rsp != b"\0"


# ------------------------------------------------------------------------------------------------
# the blocking client that negotiates the transport (TCP or RDMA) like a llama.cpp client


class HelloFailed(ConnectionError):
    """The server did not answer HELLO as the protocol says."""


@dataclass
class ClientConnection:
    """A connected, negotiated client: `transport` is TCP or RDMA; `tcp` stays open."""

    tcp: TcpTransport
    transport: Transport
    version: tuple[int, int, int]
    client_caps: bytes
    server_caps: bytes
    outcome: Outcome
    offer_reason: str | None = None  # why the client advertised zero caps

    def send_request(self, cmd: int, payload: bytes = b"") -> None:
        # Three send_data() calls, like the reference client (spec §12: granularity matters).
        self.transport.send(bytes([cmd]))
        self.transport.send(_SIZE.pack(len(payload)))
        if payload:
            self.transport.send(payload)
        self.transport.flush()

    def recv_response(self, expected: int | None = None) -> bytes:
        (size,) = _SIZE.unpack(self.transport.recv(_SIZE.size))
        if expected is not None and size != expected:
            raise HelloFailed(f"response size {size}, expected {expected}")
        return self.transport.recv(size)

    def call(self, cmd: int, payload: bytes = b"", expected: int | None = None) -> bytes:
        self.send_request(cmd, payload)
        return self.recv_response(expected)

    def close(self) -> None:
        if self.transport is not self.tcp:
            self.transport.close()
        self.tcp.close()

    def __enter__(self) -> ClientConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_client(
    host: str,
    port: int,
    *,
    provider: RdmaProvider | None = None,
    timeout: float | None = 10.0,
    strict: bool = False,
) -> ClientConnection:
    """Connect, HELLO (offering RDMA when `provider` can), and move to RDMA when both offered.

    `strict`: the RDMA receiver refuses messages that do not line up with its reads, as the
    reference receiver would (tests use it to check the server's message boundaries).
    """
    tcp = TcpTransport.connect(host, port, timeout)
    endpoint: RdmaEndpoint | None = None
    offer_reason: str | None = None
    try:
        if provider is None:
            offer_reason = "RDMA not requested"
        else:
            try:
                endpoint = provider.probe(tcp.local_address())
            except RdmaUnavailable as exc:
                offer_reason = str(exc)
        client_caps = endpoint.caps if endpoint is not None else NO_CAPS
        tcp.send(bytes([HELLO]))
        tcp.send(_SIZE.pack(HELLO_CAPS_SIZE))
        tcp.send(client_caps)
        (size,) = _SIZE.unpack(tcp.recv(_SIZE.size))
        if size != HELLO_RESPONSE_SIZE:
            raise HelloFailed(f"HELLO response of {size} bytes, expected {HELLO_RESPONSE_SIZE}")
        rsp = tcp.recv(HELLO_RESPONSE_SIZE)
    except TransportError as exc:
        if endpoint is not None:
            endpoint.close()
        tcp.close()
        raise HelloFailed(f"HELLO failed: {exc}") from exc
    except BaseException:
        if endpoint is not None:
            endpoint.close()
        tcp.close()
        raise
    version, server_caps = msg.parse_hello_response(rsp)
    transport: Transport = tcp
    problem = caps_problem(server_caps)
    if endpoint is not None and any(server_caps) and problem is not None:
        endpoint.close()
        outcome = decide(NO_CAPS, server_caps, remote="server", local_reason=problem)
    elif endpoint is not None and any(server_caps):
        try:
            transport = endpoint.activate(server_caps, peer_closed=tcp.peer_closed, strict=strict)
            outcome = decide(client_caps, server_caps, remote="server", detail=transport.describe())
        except RdmaActivationError as exc:
            outcome = decide(client_caps, server_caps, activation_error=str(exc))
    else:
        if endpoint is not None:
            endpoint.close()
        outcome = decide(client_caps, server_caps, remote="server", local_reason=offer_reason)
    log.log(outcome.level, "%s", outcome.line(f"{host}:{port}"))
    return ClientConnection(
        tcp, transport, version, client_caps, server_caps, outcome, offer_reason
    )
