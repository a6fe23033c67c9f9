"""The kernel table: (op, types, device) -> a builder that compiles one node into a callable.

A builder runs once per graph (plan time): it resolves array views and returns a closure that
does only the arithmetic, so GRAPH_RECOMPUTE re-runs closures without any decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rpcnet.compute.errors import UnsupportedOp
from rpcnet.compute.ops import op_name
from rpcnet.compute.tensor import Tensor
from rpcnet.ggml_types import type_name

Step = Callable[[], None]
Builder = Callable[[Tensor], Step]
Predicate = Callable[[Tensor], bool]


@dataclass(frozen=True)
class Kernel:
    op: int
    name: str
    device: str
    supports: Predicate
    build: Builder
    types: str  # human-readable (op, types) summary for `rpcnet ops`


_KERNELS: dict[tuple[int, str], list[Kernel]] = {}


def kernel(
    op: int, types: str, supports: Predicate, device: str = "cpu"
) -> Callable[[Builder], Builder]:
    """Register a builder; later registrations take precedence (device fast paths)."""

    def register(build: Builder) -> Builder:
        entry = Kernel(op, build.__name__, device, supports, build, types)
        _KERNELS.setdefault((op, device), []).insert(0, entry)
        return build

    return register


def describe_node(node: Tensor) -> str:
    srcs = ", ".join(s.describe() for s in node.src if s is not None)
    return f"op {op_name(node.op)} -> {node.describe()} from ({srcs})"


def select(node: Tensor, device: str = "cpu") -> Kernel:
    for entry in _KERNELS.get((node.op, device), ()):
        if entry.supports(node):
            return entry
    raise UnsupportedOp(f"unsupported {describe_node(node)} on {device}")


def table(device: str = "cpu") -> list[Kernel]:
    rows = [k for (_, dev), ks in _KERNELS.items() if dev == device for k in ks]
    return sorted(rows, key=lambda k: (k.op, k.types))


def types_of(node: Tensor) -> tuple[str, ...]:
    return tuple(type_name(s.type) for s in node.src if s is not None) + (type_name(node.type),)
