"""Replay the cargo-fuzz corpora (fuzz/corpus/<target>/) and any crashers (fuzz/artifacts/<target>/)
through the Python face of the same native functions.

Each input is decoded exactly as its fuzz target decodes it (layouts in fuzz/fuzz_targets/*.rs and
docs/fuzzing.md). Every call must either succeed or raise its narrow ``NativeError`` subclass, and
the outcome must agree with the same exact-arithmetic reference the fuzz targets assert.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rpcnet import _native as n
from support import require

FUZZ = Path(__file__).resolve().parent.parent / "fuzz"
TARGETS = ("frame_header", "rpc_tensor", "graph_decode", "regions")
U64_MAX = (1 << 64) - 1
I64_MAX = (1 << 63) - 1
USIZE_MAX = U64_MAX  # the native module is built for 64-bit targets only
T = n.RPC_TENSOR_SIZE


def _inputs() -> list[Any]:
    params = []
    for kind in ("corpus", "artifacts"):
        for target in TARGETS:
            folder = FUZZ / kind / target
            if not folder.is_dir():
                continue
            for path in sorted(folder.iterdir()):
                if path.is_file() and not path.name.startswith("."):
                    params.append(pytest.param(target, path, id=f"{kind}/{target}/{path.name}"))
    return params


INPUTS = _inputs()


def outcome(exc: type[n.NativeError], fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
    """(True, result) or (False, error) when `fn` raised exactly `exc`; anything else propagates."""
    try:
        return True, fn(*args)
    except n.NativeError as e:
        assert type(e) is exc, f"{fn.__name__} raised {type(e).__name__}, expected {exc.__name__}"
        assert isinstance(e.reason, str) and e.reason
        return False, e


def u64s(data: bytes, count: int) -> list[int]:
    """`count` little-endian u64 from `data`, zero-padded when short (as the targets read)."""
    padded = data[: 8 * count].ljust(8 * count, b"\0")
    return list(struct.unpack(f"<{count}Q", padded))


# --------------------------------------------------------------------------- frame_header

# cmd -> (v8 rule, v7 rule); ("=", n) exact size, (">=", n) minimum, None unknown in the dialect.
RULES: dict[int, tuple[tuple[str, int], tuple[str, int] | None]] = {
    0: (("=", 12), ("=", 12)),
    1: (("=", 4), ("=", 4)),
    2: (("=", 4), ("=", 4)),
    3: (("=", 8), ("=", 8)),
    4: (("=", 8), ("=", 8)),
    5: (("=", 9), ("=", 9)),
    6: ((">=", 305), (">=", 305)),
    7: (("=", 312), ("=", 312)),
    8: (("=", 312), ("=", 312)),
    9: (("=", 592), ("=", 592)),
    10: ((">=", 16), (">=", 8)),
    11: (("=", 4), ("=", 4)),
    12: (("=", 296), ("=", 296)),
    13: (("=", 3260), ("=", 3260)),
    14: (("=", 24), ("=", 24)),
    15: (("=", 0), ("=", 0)),
    16: (("=", 12), ("=", 4)),
    17: (("=", 313), ("=", 313)),
    18: ((">=", 328), None),
    19: (("=", 328), None),
    20: (("=", 80), None),
    21: (("=", 300), None),
    22: (("=", 4), None),
}


def header_ok(proto: int, cmd: int, size: int, max_data: int, max_graph: int) -> bool:
    rules = RULES.get(cmd)
    rule = None if rules is None else rules[0 if proto == 8 else 1]
    if rule is None:
        return False
    op, need = rule
    if not (size == need if op == "=" else size >= need):
        return False
    cap = {6: max_data, 18: max_data, 10: max_graph}.get(cmd, U64_MAX)
    return size <= cap


def replay_frame_header(data: bytes) -> None:
    flags = data[0] if data else 0
    rest = data[1:]
    proto = 7 if flags & 1 else 8
    if flags & 2:
        (cmd,) = u64s(rest, 1)
        rest = rest[8:]
    else:
        cmd = rest[0] if rest else 0
        rest = rest[1:]
    size, max_data, max_graph = u64s(rest, 3)
    ok, err = outcome(n.FrameError, n.check_header, proto, cmd, size, max_data, max_graph)
    assert ok == header_ok(proto, cmd, size, max_data, max_graph), (proto, cmd, size)
    if not ok:
        assert (err.cmd, err.size) == (cmd, size)


# --------------------------------------------------------------------------- rpc_tensor


def selector(b: int) -> int:
    return b if b < 0xF0 else USIZE_MAX - (b - 0xF0)


def check_tensor(t: n.RpcTensor, raw: bytes) -> None:
    assert t.to_bytes() == raw
    assert n.decode_tensor(raw) == t
    assert t.id == int.from_bytes(raw[0:8], "little")
    assert t.type == int.from_bytes(raw[8:12], "little")
    assert t.ne == struct.unpack_from("<4I", raw, 20)
    assert t.nb == struct.unpack_from("<4I", raw, 36)
    assert t.op_params == raw[56:120]
    assert t.src == struct.unpack_from("<10Q", raw, 124)
    assert t.data == int.from_bytes(raw[220:228], "little")
    assert t.flags == struct.unpack_from("<i", raw, 120)[0]
    assert t.use_count == struct.unpack_from("<i", raw, 292)[0]
    assert isinstance(t.name, str) and isinstance(repr(t), str)
    hash(t)
    for i in range(16):
        t.op_param_i32(i)
        t.op_param_f32(i)
    with pytest.raises(IndexError):
        t.op_param_i32(16)
    outcome(n.TensorError, t.nbytes)
    ok, count = outcome(n.TensorError, t.nelements)
    assert ok == ggml_nelements_ok(t.ne)
    if ok:
        assert count == t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3] <= I64_MAX


def ggml_nelements_ok(ne: tuple[int, ...]) -> bool:
    """ggml_new_tensor_impl's assert: from ne0, each dim > 1 needs INT64_MAX // n > product."""
    running = ne[0]
    if running > I64_MAX:
        return False
    for dim in ne[1:]:
        if dim > 1:
            if dim > I64_MAX or I64_MAX // dim <= running:
                return False
            running *= dim
    return True


def replay_rpc_tensor(data: bytes) -> None:
    if len(data) < 2:
        return
    offset, count = selector(data[0]), selector(data[1])
    buf = data[2:]
    for view in (buf, memoryview(bytearray(buf))):
        ok, t = outcome(n.TensorError, n.decode_tensor, view, offset)
        assert ok == (offset + T <= len(buf))
        if ok:
            check_tensor(t, buf[offset : offset + T])
        ok, ts = outcome(n.TensorError, n.decode_tensors, view, offset, count)
        assert ok == (offset + count * T <= len(buf))
        if ok:
            assert len(ts) == count
            for i, t in enumerate(ts):
                check_tensor(t, buf[offset + i * T : offset + (i + 1) * T])


# --------------------------------------------------------------------------- graph_decode


def graph_len(proto: int, p: bytes) -> int | None:
    """Payload bytes the counts require, None when the payload is too short."""
    header = 16 if proto == 8 else 8
    if len(p) < header:
        return None
    (n_nodes,) = struct.unpack_from("<I", p, 12 if proto == 8 else 4)
    nodes_end = header + 8 * n_nodes
    if len(p) < nodes_end + 4:
        return None
    (n_tensors,) = struct.unpack_from("<I", p, nodes_end)
    need = nodes_end + 4 + T * n_tensors
    return need if len(p) >= need else None


def encode_graph(proto: int, g: n.Graph) -> bytes:
    out = struct.pack("<I", g.device)
    if proto == 8:
        out += struct.pack("<Q", g.uid)
    out += struct.pack(f"<I{len(g.nodes)}Q", len(g.nodes), *g.nodes)
    out += struct.pack("<I", len(g.tensors)) + b"".join(t.to_bytes() for t in g.tensors)
    return out


def replay_graph_decode(data: bytes) -> None:
    for proto in (8, 7):
        need = graph_len(proto, data)
        for view in (data, bytearray(data)):
            ok, g = outcome(n.GraphError, n.decode_graph, proto, view)
            assert ok == (need is not None), (proto, len(data))
            if ok:
                if proto == 7:
                    assert g.uid == 0
                assert encode_graph(proto, g) == data[:need]
                assert isinstance(repr(g), str)


# --------------------------------------------------------------------------- regions


def ref_region_2d(
    base: int,
    size: int,
    data: int,
    tn: int,
    off: int,
    row: int,
    n_copies: int,
    stride: int,
    payload: int | None,
) -> bool:
    if n_copies == 0 or row == 0:
        return False
    rows_ok = row * n_copies == payload if payload is not None else row * n_copies <= U64_MAX
    span = (n_copies - 1) * stride + row
    end = base + size
    return (
        rows_ok
        and span <= U64_MAX
        and end <= U64_MAX
        and data >= base
        and data + off + span <= end
        and off + span <= tn
    )


def replay_regions(data: bytes) -> None:
    if not data:
        return
    op = data[0] % 5
    a = u64s(data[1:], 9)
    if op == 0:
        d, nbytes, base, size = a[:4]
        want = base + size <= U64_MAX and d >= base and d + nbytes <= base + size
        got, _ = outcome(n.TensorError, n.check_tensor_in_buffer, *a[:4])
    elif op == 1:
        base, size, d, off, length, tn = a[:6]
        start, end = d + off, base + size
        want = end <= U64_MAX and base <= start < end and start + length <= end
        want = want and off + length <= tn
        got, _ = outcome(n.TensorError, n.check_region, *a[:6])
    elif op == 2:
        base, size, d, off, length, tn = a[:6]
        want = off + length <= tn and d >= base and d - base + off + length <= size
        got, _ = outcome(n.TensorError, n.check_memset, *a[:6])
    else:
        payload = a[8] if op == 3 else None
        want = ref_region_2d(*a[:8], payload)
        got, _ = outcome(n.TensorError, n.check_region_2d, *a[:8], payload)
    assert got == want, (op, a)


REPLAY = {
    "frame_header": replay_frame_header,
    "rpc_tensor": replay_rpc_tensor,
    "graph_decode": replay_graph_decode,
    "regions": replay_regions,
}


def test_corpus_present() -> None:
    if not (FUZZ / "Cargo.toml").is_file():
        require.missing("fuzz/ is not shipped here (e.g. an sdist)")
    for target in TARGETS:
        folder = FUZZ / "corpus" / target
        assert folder.is_dir() and any(folder.iterdir()), f"empty corpus {folder}"


@pytest.mark.parametrize(("target", "path"), INPUTS)
def test_replay(target: str, path: Path) -> None:
    REPLAY[target](path.read_bytes())
