"""An asyncio client for the ggml RPC protocol (used by `rpcnet caps`, tests and benchmarks)."""

from __future__ import annotations

import asyncio
import socket
import struct
from dataclasses import dataclass

from rpcnet import _native
from rpcnet.protocol import messages as msg
from rpcnet.protocol.commands import HELLO_CAPS_SIZE, Cmd

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
        caps: bytes = bytes(HELLO_CAPS_SIZE),
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
        await self.writer.drain()
        return await self.recv(expected)

    async def post(self, cmd: int, payload: bytes = b"") -> None:
        """A command without a response."""
        self.send(cmd, payload)
        await self.writer.drain()

    # ------------------------------------------------------------ commands

    async def hello(self, caps: bytes = bytes(HELLO_CAPS_SIZE)) -> Hello:
        version, server_caps = msg.parse_hello_response(await self.call(Cmd.HELLO, caps, 28))
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
