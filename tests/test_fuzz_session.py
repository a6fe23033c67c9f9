"""Session-layer fuzzing over real sockets: random and structure-aware frame sequences.

Whatever arrives, the server answers or closes that connection only: no internal error is
logged, other clients keep being served, and memory returns to its baseline.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rpcnet import _native
from support.hyp import examples
from support.raw import RawConn, frame
from test_bad_input import wait_for_baseline

U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)
SMALL = st.integers(0, 70)
DIM = st.one_of(st.integers(0, 8), st.sampled_from([16, 31, 32, 256, 2**31, 2**32 - 1]))
CMDS_WITH_TENSOR = [6, 7, 8, 9, 12, 13, 17, 18, 19, 21]


# Strategies draw symbolic references ("own buffer", "base + 64") and `build` binds them to the
# connection's real handle and base: the draws must not depend on per-connection values.
Builder = Callable[[int, int], bytes]


@st.composite
def tensor(draw) -> Callable[[int, int], _native.RpcTensor]:
    ne = tuple(draw(st.lists(DIM, min_size=4, max_size=4)))
    nb = tuple(draw(st.lists(st.one_of(st.integers(0, 64), U32), min_size=4, max_size=4)))
    data_kind = draw(st.sampled_from(["base", "near", "any"]))
    data_value = draw(st.integers(-64, 8192) if data_kind == "near" else U64)
    buffer_kind = draw(st.sampled_from(["own", "own", "none", "forged"]))
    fields = dict(
        id=draw(st.integers(0, 6)),
        type=draw(st.one_of(st.integers(0, 45), U32)),
        ne=ne,
        nb=nb,
        op=draw(st.one_of(st.integers(0, 101), U32)),
        op_params=draw(st.binary(max_size=64)),
        flags=draw(st.sampled_from([0, 16, 18, -1])),
        src=tuple(draw(st.lists(st.one_of(st.integers(0, 6), U64), max_size=10))),
        view_src=draw(st.one_of(st.just(0), st.integers(0, 6))),
        view_offs=draw(st.one_of(st.integers(0, 4096), U64)),
    )

    def build(handle: int, base: int) -> _native.RpcTensor:
        buffer = {"own": handle, "none": 0, "forged": handle ^ 1}[buffer_kind]
        data = {"base": base, "near": (base + data_value) % 2**64, "any": data_value}[data_kind]
        return _native.RpcTensor(buffer=buffer, data=data, **fields)

    return build


@st.composite
def frames(draw) -> Builder:
    kind = draw(st.sampled_from(["raw", "tensor", "graph"]))
    if kind == "raw":
        cmd = draw(st.integers(0, 255))
        payload = draw(st.binary(max_size=400))
        return lambda h, b: frame(cmd, payload)
    if kind == "tensor":
        cmd = draw(st.sampled_from(CMDS_WITH_TENSOR))
        lead = struct.pack("<I", 0) if cmd in (13, 21) else b""
        first = draw(tensor())
        second = draw(tensor()) if cmd == 9 else None
        tail = draw(st.lists(st.one_of(SMALL, U64), min_size=4, max_size=4))
        extra = b"".join(struct.pack("<Q", v) for v in tail) + draw(st.binary(max_size=64))

        def build_tensor_frame(h: int, b: int) -> bytes:
            body = lead + first(h, b).to_bytes()
            if second is not None:
                body += second(h, b).to_bytes()
            return frame(cmd, body + extra)

        return build_tensor_frame
    tensors = draw(st.lists(tensor(), max_size=6))
    nodes = draw(st.lists(st.integers(0, 6), max_size=6))
    head = struct.pack("<IQ", draw(st.integers(0, 1)), draw(st.integers(0, 3)))
    cut = draw(st.floats(0, 1))
    whole = draw(st.booleans())

    def build_graph(h: int, b: int) -> bytes:
        body = head + struct.pack("<I", len(nodes)) + b"".join(struct.pack("<Q", n) for n in nodes)
        body += struct.pack("<I", len(tensors)) + b"".join(t(h, b).to_bytes() for t in tensors)
        return frame(10, body if whole else body[: int(len(body) * cut)])

    return build_graph


@settings(
    max_examples=examples(int(os.environ.get("RPCNET_FUZZ_EXAMPLES", "150"))),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzzed_frames_never_hurt_the_server(server, caplog, data):
    caplog.set_level(logging.WARNING)
    conn = RawConn(server.port)
    handle, _ = struct.unpack("<QQ", conn.call(0, struct.pack("<IQ", 0, 8192), 16))
    base = struct.unpack("<Q", conn.call(3, struct.pack("<Q", handle), 8))[0]
    for build in data.draw(st.lists(frames(), min_size=1, max_size=4)):
        try:
            conn.send(build(handle, base))
        except OSError:
            break  # closed by the server: fine
    conn.sock.settimeout(0.2)
    try:
        while conn.sock.recv(1 << 16):
            pass
    except OSError:
        pass
    conn.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors[0].getMessage()
    bystander = RawConn(server.port)
    assert struct.unpack("<I", bystander.call(15, b"", 4))[0] == 1
    bystander.close()
    wait_for_baseline(server, timeout=10)
