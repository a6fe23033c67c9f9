"""Graph nodes without a buffer: what the kernel table looks at to select a kernel."""

from __future__ import annotations

from rpcnet.compute.tensor import Tensor

from support.opgraph import contiguous_nb


def node(type_id: int, ne: tuple[int, ...], op: int = 0, src: tuple[Tensor, ...] = ()) -> Tensor:
    """A contiguous tensor of `type_id` and shape `ne` (padded to 4 dims with 1), computed by
    `op` from `src`."""
    ne4 = tuple(ne) + (1,) * (4 - len(ne))
    return Tensor(
        id=0,
        type=type_id,
        ne=ne4,
        nb=contiguous_nb(type_id, ne4),
        op=op,
        op_params=b"",
        flags=0,
        name="",
        src=tuple(src),
        buffer=None,
        offset=0,
    )
