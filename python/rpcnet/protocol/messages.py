"""Fixed-layout request and response payloads (spec §2, §7, §11).

Only struct packing lives here; validation against session state is the session's job.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from rpcnet import _native
from rpcnet.protocol.commands import HELLO_CAPS_SIZE, HELLO_RESPONSE_SIZE

TENSOR = _native.RPC_TENSOR_SIZE

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U64x2 = struct.Struct("<QQ")
_U32_U64 = struct.Struct("<IQ")
_U64_U8 = struct.Struct("<QB")
_OFF_SIZE = struct.Struct("<QQ")
_OFF_SIZE_VAL = struct.Struct("<QQB")
_2D = struct.Struct("<QQQQ")
_COMM_INIT = struct.Struct("<IIII64s")
_HELLO_RSP = struct.Struct(f"<BBBB{HELLO_CAPS_SIZE}s")
assert _HELLO_RSP.size == HELLO_RESPONSE_SIZE


def u8(value: int) -> bytes:
    return _U8.pack(value)


def u32(value: int) -> bytes:
    return _U32.pack(value)


def u64(value: int) -> bytes:
    return _U64.pack(value)


def u64_pair(a: int, b: int) -> bytes:
    return _U64x2.pack(a, b)


def parse_u32(payload: bytes | memoryview) -> int:
    return _U32.unpack_from(payload)[0]


def parse_u64(payload: bytes | memoryview) -> int:
    return _U64.unpack_from(payload)[0]


def hello_response(major: int, minor: int, patch: int, caps: bytes) -> bytes:
    return _HELLO_RSP.pack(major, minor, patch, 0, caps)


def parse_hello_response(payload: bytes) -> tuple[tuple[int, int, int], bytes]:
    major, minor, patch, _, caps = _HELLO_RSP.unpack(payload)
    return (major, minor, patch), caps


class AllocRequest(NamedTuple):
    device: int
    size: int


def parse_alloc(payload: bytes) -> AllocRequest:
    return AllocRequest(*_U32_U64.unpack_from(payload))


class ClearRequest(NamedTuple):
    handle: int
    value: int


def parse_clear(payload: bytes) -> ClearRequest:
    return ClearRequest(*_U64_U8.unpack_from(payload))


class SetTensorHeader(NamedTuple):
    tensor: _native.RpcTensor
    cache: bool
    offset: int


SET_TENSOR_HEADER = TENSOR + 1 + 8


def parse_set_tensor_header(prefix: bytes | memoryview) -> SetTensorHeader:
    tensor = _native.decode_tensor(prefix, 0)
    # cache_flag u8 @296, offset u64 @297 (packed, unaligned)
    cache = prefix[TENSOR] != 0
    offset = _U64.unpack_from(prefix, TENSOR + 1)[0]
    return SetTensorHeader(tensor, cache, offset)


class TensorRange(NamedTuple):
    """GET_TENSOR: tensor, offset u64, size u64."""

    tensor: _native.RpcTensor
    offset: int
    size: int


class MemsetRequest(NamedTuple):
    tensor: _native.RpcTensor
    offset: int
    size: int
    value: int


class SetTensorHash(NamedTuple):
    tensor: _native.RpcTensor
    offset: int
    hash: int


_Request = TypeVar("_Request")


def _tensor_then(
    kind: Callable[..., _Request], layout: struct.Struct
) -> Callable[[bytes | memoryview], _Request]:
    """The parser of a request that is a tensor followed by the fixed fields of `layout`."""

    def parse(payload: bytes | memoryview) -> _Request:
        return kind(_native.decode_tensor(payload, 0), *layout.unpack_from(payload, TENSOR))

    return parse


parse_tensor_range = _tensor_then(TensorRange, _OFF_SIZE)
parse_memset = _tensor_then(MemsetRequest, _OFF_SIZE_VAL)
parse_set_tensor_hash = _tensor_then(SetTensorHash, _OFF_SIZE)


class CopyRequest(NamedTuple):
    src: _native.RpcTensor
    dst: _native.RpcTensor


def parse_copy(payload: bytes) -> CopyRequest:
    return CopyRequest(_native.decode_tensor(payload, 0), _native.decode_tensor(payload, TENSOR))


class AllocSizeRequest(NamedTuple):
    device: int
    tensor: _native.RpcTensor
    srcs: list[_native.RpcTensor]


def parse_alloc_size(payload: bytes) -> AllocSizeRequest:
    device = _U32.unpack_from(payload)[0]
    tensor = _native.decode_tensor(payload, 4)
    srcs = _native.decode_tensors(payload, 4 + TENSOR, 10)
    return AllocSizeRequest(device, tensor, srcs)


class Transfer2D(NamedTuple):
    tensor: _native.RpcTensor
    offset: int
    size: int
    n_copies: int
    stride: int


TRANSFER_2D_HEADER = TENSOR + 32


parse_transfer_2d = _tensor_then(Transfer2D, _2D)


class GraphRecompute(NamedTuple):
    device: int
    uid: int


def parse_graph_recompute(proto: int, payload: bytes) -> GraphRecompute:
    if proto == 7:
        return GraphRecompute(_U32.unpack_from(payload)[0], 0)
    return GraphRecompute(*_U32_U64.unpack_from(payload))


class CommInit(NamedTuple):
    device: int
    rank: int
    world: int
    port: int
    host: str


def parse_comm_init(payload: bytes) -> CommInit:
    device, rank, world, port, host = _COMM_INIT.unpack_from(payload)
    return CommInit(device, rank, world, port, host.split(b"\0", 1)[0].decode("ascii", "replace"))


# ---- request encoders (used by rpcnet.client and the tests) ----


def request(cmd: int, payload: bytes = b"") -> bytes:
    return struct.pack("<BQ", cmd, len(payload)) + payload


def alloc_request(device: int, size: int) -> bytes:
    return _U32_U64.pack(device, size)


def tensor_range(tensor: _native.RpcTensor, offset: int, size: int) -> bytes:
    return tensor.to_bytes() + _OFF_SIZE.pack(offset, size)


def set_tensor_payload(
    tensor: _native.RpcTensor, offset: int, data: bytes, cache: bool = False
) -> bytes:
    return tensor.to_bytes() + _U8.pack(1 if cache else 0) + _U64.pack(offset) + data


def memset_payload(tensor: _native.RpcTensor, offset: int, size: int, value: int) -> bytes:
    return tensor.to_bytes() + _OFF_SIZE_VAL.pack(offset, size, value)


def transfer_2d(
    tensor: _native.RpcTensor, offset: int, size: int, n_copies: int, stride: int
) -> bytes:
    return tensor.to_bytes() + _2D.pack(offset, size, n_copies, stride)


def graph_payload(
    proto: int, device: int, uid: int, nodes: list[int], tensors: list[_native.RpcTensor]
) -> bytes:
    head = _U32.pack(device) + (b"" if proto == 7 else _U64.pack(uid))
    body = _U32.pack(len(nodes)) + b"".join(_U64.pack(n) for n in nodes)
    return head + body + _U32.pack(len(tensors)) + b"".join(t.to_bytes() for t in tensors)


def comm_init_payload(device: int, rank: int, world: int, port: int, host: str) -> bytes:
    return _COMM_INIT.pack(device, rank, world, port, host.encode("ascii"))
