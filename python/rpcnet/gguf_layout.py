"""Where each tensor's data lies in a GGUF file (header and tensor infos only; no data is read).

A small reader of the GGUF container (v2/v3, little-endian) so the server needs no `gguf`
package at run time. Tensor sizes come from the Rust type table (rpcnet._native.type_info).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from rpcnet import _native

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# GGUF metadata value types -> struct format of one scalar (8: string, 9: array).
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
STRING, ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF file this reader understands."""


@dataclass(frozen=True)
class TensorLayout:
    name: str
    type: int
    ne: tuple[int, ...]
    offset: int  # absolute offset of the first data byte in the file
    nbytes: int


class _Reader:
    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh

    def take(self, n: int) -> bytes:
        data = self.fh.read(n)
        if len(data) != n:
            raise GGUFFormatError("truncated GGUF header")
        return data

    def scalar(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size))[0]

    def string(self) -> str:
        n = self.scalar("Q")
        if n > 1 << 30:
            raise GGUFFormatError(f"implausible string length {n}")
        return self.take(n).decode("utf-8", "replace")

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item_type, count = self.scalar("I"), self.scalar("Q")
            if item_type in _SCALARS:  # skip numeric arrays in one read
                self.take(count * struct.calcsize("<" + _SCALARS[item_type]))
                return None
            for _ in range(count):
                self.value(item_type)
            return None
        raise GGUFFormatError(f"unknown metadata value type {vtype}")


def tensor_nbytes(type_id: int, ne: tuple[int, ...]) -> int:
    _, block, type_size, _ = _native.type_info(type_id)
    count = 1
    for n in ne:
        count *= n
    if ne and ne[0] % block:
        raise GGUFFormatError(f"row of {ne[0]} elements is not a whole number of blocks")
    return count // block * type_size


def read_layout(path: str | Path) -> list[TensorLayout]:
    """Every tensor's (name, type, shape, absolute data offset, size) in file order."""
    with open(path, "rb") as fh:
        r = _Reader(fh)
        if r.take(4) != MAGIC:
            raise GGUFFormatError(f"{path}: not a GGUF file")
        version = r.scalar("I")
        if version not in (2, 3):
            raise GGUFFormatError(f"{path}: GGUF version {version} not supported")
        n_tensors, n_kv = r.scalar("Q"), r.scalar("Q")
        alignment = DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key = r.string()
            vtype = r.scalar("I")
            value = r.value(vtype)
            if key == "general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
        infos = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar("I")
            if n_dims > 4:
                raise GGUFFormatError(f"{path}: tensor {name!r} has {n_dims} dimensions")
            ne = tuple(r.scalar("Q") for _ in range(n_dims))
            type_id, rel = r.scalar("I"), r.scalar("Q")
            infos.append((name, type_id, ne, rel))
        start = -(-fh.tell() // alignment) * alignment
    try:
        return [
            TensorLayout(name, t, ne, start + rel, tensor_nbytes(t, ne))
            for name, t, ne, rel in infos
        ]
    except _native.NativeError as exc:
        raise GGUFFormatError(f"{path}: {exc}") from exc
