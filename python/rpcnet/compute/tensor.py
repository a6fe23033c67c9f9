"""A graph tensor resolved against session buffers: where its bytes live and their layout."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from rpcnet import _native
from rpcnet.compute.buffer import DeviceBuffer
from rpcnet.ggml_types import type_name

FLAG_OUTPUT = 2  # ggml's GGML_TENSOR_FLAG_OUTPUT: the client reads it after the graph
FLAG_COMPUTE = 16


@dataclass(eq=False)
class Tensor:
    id: int
    type: int
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    op: int
    op_params: bytes
    flags: int
    name: str
    buffer: DeviceBuffer | None
    offset: int  # byte offset of element 0 inside buffer.array
    src: tuple[Tensor | None, ...] = field(default=())
    stable: bool = False  # no node of the plan writes its buffer: derived copies may be cached

    @classmethod
    def from_wire(cls, t: _native.RpcTensor, buffer: DeviceBuffer | None, offset: int) -> Tensor:
        return cls(
            id=t.id,
            type=t.type,
            ne=t.ne,
            nb=t.nb,
            op=t.op,
            op_params=t.op_params,
            flags=t.flags,
            name=t.name,
            buffer=buffer,
            offset=offset,
        )

    @property
    def nelements(self) -> int:
        ne = self.ne
        return ne[0] * ne[1] * ne[2] * ne[3]

    @property
    def nbytes(self) -> int:
        return _native.tensor_nbytes(self.type, self.ne, self.nb)

    @property
    def is_computed(self) -> bool:
        return bool(self.flags & FLAG_COMPUTE)

    def first_two_sources(self) -> tuple[Tensor, Tensor]:
        """src[0] and src[1], for builders whose support rule has checked both are there."""
        a, b = self.src[0], self.src[1]
        assert a is not None and b is not None
        return a, b

    def i32(self, slot: int) -> int:
        return struct.unpack_from("<i", self.op_params, 4 * slot)[0]

    def f32(self, slot: int) -> float:
        return struct.unpack_from("<f", self.op_params, 4 * slot)[0]

    def describe(self) -> str:
        name = type_name(self.type)
        ne = "x".join(str(n) for n in self.ne)
        return f"{self.name or self.id:}:{name}[{ne}]"
