"""Build small ggml graphs by hand and run them on any server (rpcnet or the reference).

Used by the differential op tests: the same graph, with the same input bytes, goes to the
reference rpc-server and to rpcnet, and the output bytes are compared.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
from rpcnet import _native
from rpcnet.compute.views import f32_to_bf16
from rpcnet.ggml_types import GgmlType

from support.raw import RawConn, frame

ALIGN = 64
FLAG_COMPUTE = 16
OP_VIEW = 37


@dataclass
class Node:
    id: int
    type: int
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int] | None
    offset: int  # byte offset inside the graph's buffer
    op: int = 0
    params: bytes = b""
    srcs: tuple[int, ...] = ()
    view_src: int = 0
    view_offs: int = 0
    flags: int = 0
    raw: bytes | None = None  # initial content (inputs)


def pack_params(*values: int | float) -> bytes:
    """op_params slots: ints as i32, floats as f32."""
    out = b""
    for v in values:
        out += struct.pack("<f", v) if isinstance(v, float) else struct.pack("<i", v)
    return out


def contiguous_nb(type_id: int, ne: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    _, block, size, _ = _native.type_info(type_id)
    nb0 = size
    nb1 = nb0 * (ne[0] // block)
    return (nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])


@dataclass
class OpGraph:
    nodes: list[Node] = field(default_factory=list)
    size: int = 0
    order: list[int] = field(default_factory=list)  # compute node ids in order

    def _place(self, nbytes: int) -> int:
        offset = self.size
        self.size += (max(nbytes, 1) + ALIGN - 1) // ALIGN * ALIGN
        return offset

    def _add(self, node: Node) -> int:
        self.nodes.append(node)
        return node.id

    def _new_id(self) -> int:
        return 0x1000 + len(self.nodes) * 16

    def input(self, type_id: int, ne, raw: bytes | np.ndarray, nb=None) -> int:
        """A leaf tensor holding `raw` bytes (contiguous unless `nb` says otherwise)."""
        ne = tuple(ne) + (1,) * (4 - len(ne))
        raw = raw.tobytes() if isinstance(raw, np.ndarray) else raw
        nb = tuple(nb) if nb is not None else contiguous_nb(type_id, ne)
        offset = self._place(len(raw))
        return self._add(Node(self._new_id(), type_id, ne, nb, offset, raw=raw))

    def view(self, src: int, ne, nb, offs: int = 0, type_id: int | None = None) -> int:
        """A VIEW of a leaf (any strides, permutations or overlaps)."""
        root = self.get(src)
        ne = tuple(ne) + (1,) * (4 - len(ne))
        return self._add(
            Node(
                self._new_id(),
                root.type if type_id is None else type_id,
                ne,
                tuple(nb),
                root.offset + offs,
                op=OP_VIEW,
                srcs=(src,),
                view_src=src,
                view_offs=offs,
            )
        )

    def op(
        self,
        op: int,
        type_id: int,
        ne,
        srcs,
        params: bytes = b"",
        nb=None,
        inplace_of: int | None = None,
        offs: int = 0,
        compute: bool = True,
    ) -> int:
        """A compute node; `inplace_of` makes its output a view of that tensor (SET_ROWS, CPY)."""
        ne = tuple(ne) + (1,) * (4 - len(ne))
        nb = tuple(nb) if nb is not None else contiguous_nb(type_id, ne)
        if inplace_of is not None:
            root = self.get(inplace_of)
            offset, view_src = root.offset + offs, inplace_of
        else:
            offset = self._place(_native.tensor_nbytes(type_id, ne, nb))
            view_src = 0
        node = Node(
            self._new_id(),
            type_id,
            ne,
            nb,
            offset,
            op=op,
            params=params,
            srcs=tuple(srcs),
            view_src=view_src,
            view_offs=offs if view_src else 0,
            flags=FLAG_COMPUTE if compute else 0,
        )
        self.order.append(node.id)
        return self._add(node)

    def get(self, node_id: int) -> Node:
        return next(n for n in self.nodes if n.id == node_id)

    def wire(self, handle: int, base: int) -> list[_native.RpcTensor]:
        return [
            _native.RpcTensor(
                id=n.id,
                type=n.type,
                buffer=handle,
                ne=n.ne,
                nb=n.nb,
                op=n.op,
                op_params=n.params,
                flags=n.flags,
                src=n.srcs,
                view_src=n.view_src,
                view_offs=n.view_offs,
                data=base + n.offset,
            )
            for n in self.nodes
        ]

    def run(self, port: int, outputs: list[int], proto: int = 8) -> list[bytes]:
        """Upload inputs, compute, and read back the outputs' bytes (one connection)."""
        conn = RawConn(port)
        try:
            handle, _ = struct.unpack(
                "<QQ", conn.call(0, struct.pack("<IQ", 0, self.size + 4096), 16)
            )
            assert handle, "allocation failed"
            base = struct.unpack("<Q", conn.call(3, struct.pack("<Q", handle), 8))[0]
            conn.send(
                frame(5, struct.pack("<QB", handle, 0))
            )  # BUFFER_CLEAR: deterministic garbage
            tensors = self.wire(handle, base)
            by_id = {t.id: t for t in tensors}
            for n in self.nodes:
                if n.raw is not None and n.raw:
                    conn.send(
                        frame(6, by_id[n.id].to_bytes() + b"\0" + struct.pack("<Q", 0) + n.raw)
                    )
            head = struct.pack("<I", 0) + (b"" if proto == 7 else struct.pack("<Q", 0))
            body = struct.pack("<I", len(self.order)) + b"".join(
                struct.pack("<Q", i) for i in self.order
            )
            payload = (
                head
                + body
                + struct.pack("<I", len(tensors))
                + b"".join(t.to_bytes() for t in tensors)
            )
            conn.send(frame(10, payload))
            results = []
            for out in outputs:
                t = by_id[out]
                n = t.nbytes()
                results.append(conn.call(8, t.to_bytes() + struct.pack("<QQ", 0, n), n))
            return results
        finally:
            conn.close()


def ne4(ne) -> tuple[int, int, int, int]:
    return tuple(ne) + (1,) * (4 - len(ne))


def as_f32(raw: bytes, ne) -> np.ndarray:
    n0, n1, n2, n3 = ne4(ne)
    return np.frombuffer(raw, np.float32).reshape(n3, n2, n1, n0)


def encode(type_id: int, values: np.ndarray) -> bytes:
    """Values as the raw bytes of a plain ggml type (f32, f16, bf16, i32)."""
    if type_id == GgmlType.F32:
        return np.ascontiguousarray(values, np.float32).tobytes()
    if type_id == GgmlType.F16:
        return np.ascontiguousarray(values, np.float16).tobytes()
    if type_id == GgmlType.BF16:
        return f32_to_bf16(np.ascontiguousarray(values, np.float32)).tobytes()
    if type_id == GgmlType.I32:
        return np.ascontiguousarray(values, np.int32).tobytes()
    raise ValueError(type_id)
