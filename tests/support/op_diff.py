"""Shared parts of the differential op tests (REAL reference rpc-server vs rpcnet): element
types, hypothesis settings, inputs in several memory layouts, decoding of results."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rpcnet.compute.views import bf16_to_f32, f32_to_bf16

from support.hyp import examples
from support.opgraph import OpGraph, encode, ne4

F32, F16, I32, I64, BF16 = 0, 1, 26, 27, 30
TYPE_SIZE = {F32: 4, F16: 2, I32: 4, I64: 8, BF16: 2}
DTYPE = {F32: np.float32, F16: np.float16, I32: np.int32, I64: np.int64, BF16: np.uint16}

SETTINGS = settings(
    max_examples=examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
seeds = st.integers(0, 2**31 - 1)


def given_ints(**ranges: tuple[int, int]) -> Callable:
    """SETTINGS and @given of integer arguments drawn from [low, high], and a `seed`."""
    draw = given(seed=seeds, **{name: st.integers(*bounds) for name, bounds in ranges.items()})
    return lambda test: SETTINGS(draw(test))


def decode(raw: bytes, type_id: int, ne) -> np.ndarray:
    """A result's bytes as an array in numpy order (ne3, ne2, ne1, ne0); bf16 as float32."""
    n0, n1, n2, n3 = ne4(ne)
    out = np.frombuffer(raw, DTYPE[type_id])
    if type_id == BF16:
        out = bf16_to_f32(out)
    elif type_id == F16:
        out = out.astype(np.float32)
    return out.reshape(n3, n2, n1, n0)


def quantize_like(type_id: int, values: np.ndarray) -> np.ndarray:
    """The float32 values a tensor of `type_id` will actually hold."""
    if type_id == F16:
        return values.astype(np.float16).astype(np.float32)
    if type_id == BF16:
        return bf16_to_f32(f32_to_bf16(values))
    return values.astype(np.float32)


def normal(seed: int, ne, scale: float = 3.0) -> np.ndarray:
    """Normal float32 values of shape `ne` (ggml order), in numpy order."""
    n0, n1, n2, n3 = ne4(ne)
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n3, n2, n1, n0)) * scale).astype(np.float32)


def add_input(
    g: OpGraph, type_id: int, values: np.ndarray, layout: str = "contig", pad: int = 3
) -> int:
    """A tensor with logical values `values` (numpy order ne3, ne2, ne1, ne0) in some memory layout.

    contig: plain leaf; padded: rows padded by `pad` elements (still ggml-contiguous over dims
    1..3); permuted: dims 1 and 2 swapped in memory (rows contiguous, dims 1/2 not);
    transposed: dims 0 and 1 swapped in memory (nb0 != type size).
    """
    values = np.asarray(values).reshape((1,) * (4 - values.ndim) + values.shape)
    n3, n2, n1, n0 = values.shape
    ts = TYPE_SIZE[type_id]
    if layout == "contig":
        return g.input(type_id, (n0, n1, n2, n3), encode(type_id, values))
    if layout == "padded":
        phys = np.zeros((n3, n2, n1, n0 + pad), values.dtype)
        phys[..., :n0] = values
        leaf = g.input(type_id, (n0 + pad, n1, n2, n3), encode(type_id, phys))
        row = (n0 + pad) * ts
        return g.view(leaf, (n0, n1, n2, n3), (ts, row, row * n1, row * n1 * n2))
    if layout == "permuted":
        phys = np.ascontiguousarray(values.transpose(0, 2, 1, 3))
        leaf = g.input(type_id, (n0, n2, n1, n3), encode(type_id, phys))
        row = n0 * ts
        return g.view(leaf, (n0, n1, n2, n3), (ts, row * n2, row, row * n1 * n2))
    if layout == "transposed":
        phys = np.ascontiguousarray(values.transpose(0, 1, 3, 2))
        leaf = g.input(type_id, (n1, n0, n2, n3), encode(type_id, phys))
        plane = n0 * n1 * ts
        return g.view(leaf, (n0, n1, n2, n3), (ts * n1, ts, plane, plane * n2))
    raise ValueError(layout)


def run_both(g: OpGraph, outs: list[int], ref: int, ours: int) -> tuple[list[bytes], list[bytes]]:
    return g.run(ref, outs), g.run(ours, outs)


def assert_same_bytes(g: OpGraph, out: int, ref: int, ours: int) -> bytes:
    """`out` computed by both servers: the same bytes. rpcnet's bytes."""
    (r,), (o,) = run_both(g, [out], ref, ours)
    assert r == o
    return o
