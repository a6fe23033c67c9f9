"""ggml type ids and their traits, built at import from the native table (rust/src/types.rs).

Python holds no copy of the table: ``GgmlType`` (an ``IntEnum`` named like ggml's
``GGML_TYPE_*``) and ``TYPE_TRAITS`` are both derived from ``_native.type_table()``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

from rpcnet import _native


class TypeTraits(NamedTuple):
    name: str  # ggml's spelling, e.g. "q4_K"
    block_size: int  # elements per block (1 for scalar types)
    type_size: int  # bytes per block
    quantized: bool


GGML_TYPE_COUNT: int = _native.GGML_TYPE_COUNT

# Live types only: a removed id (block size 0) has neither traits nor an enum member.
TYPE_TRAITS: dict[int, TypeTraits] = {
    tid: TypeTraits(name, block, size, quantized)
    for tid, name, block, size, quantized in _native.type_table()
    if block
}


def _build_enum() -> Any:
    members = [(traits.name.upper(), tid) for tid, traits in TYPE_TRAITS.items()]
    return IntEnum("GgmlType", members, module=__name__, qualname="GgmlType")


# GgmlType.F32 == 0, GgmlType.Q8_0 == 8, ... (typed Any: its members exist only at run time)
GgmlType: Any = _build_enum()


def type_name(type_id: int) -> str:
    """ggml's name of a type id; ``type#<id>`` for a removed or unknown id (for messages)."""
    traits = TYPE_TRAITS.get(type_id)
    return traits.name if traits else f"type#{type_id}"


def traits_of(type_id: int) -> TypeTraits:
    """Traits of a live type id. ValueError for removed/unknown ids."""
    traits = TYPE_TRAITS.get(type_id)
    if traits is None:
        raise ValueError(f"unknown or removed ggml type id {type_id}")
    return traits
