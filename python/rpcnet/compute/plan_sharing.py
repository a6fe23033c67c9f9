"""A graph's tensors and shared content (compute/shared_content.py), before its plan is built.

Kernels read a tensor through the array its plan resolved at build time (`views.storage`): a
shared content's window when the tensor lies inside a shared range, the buffer otherwise. So
before a build, every range a node writes becomes the buffer's own again (copy on write), and
so does every range a tensor covers only in part. A plan is valid while the `layout` of each
buffer it touches is the one it was built against (`stale`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rpcnet.compute.graph import needs_compute
from rpcnet.compute.tensor import Tensor

Layouts = tuple[tuple[Any, int], ...]  # (DeviceBuffer, its layout) of each buffer a plan touches


def prepare(nodes: Sequence[Tensor]) -> Layouts:
    """Copy on write where nodes write or tensors straddle shared ranges; mark the written
    buffers so that their uploads are never shared. The layouts the plan is built against."""
    for node in nodes:
        buf = node.buffer
        if buf is not None and needs_compute(node):
            buf.graph_written = True
            if buf.shares:
                buf.own(node.offset, node.nbytes)
    touched: dict[int, Any] = {}
    for node in nodes:
        for t in (node, *node.src):
            if t is None or t.buffer is None:
                continue
            touched[id(t.buffer)] = t.buffer
            if t.buffer.shares:
                t.buffer.own(t.offset, t.nbytes, partial_only=True)
    return tuple((buf, buf.layout) for buf in touched.values())


def stale(layouts: Layouts) -> bool:
    """Whether a buffer's shared ranges changed since a plan was built against `layouts`."""
    return any(buf.layout != seen for buf, seen in layouts)
