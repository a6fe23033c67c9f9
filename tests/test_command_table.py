"""The command table against the Rust codec and the spec, and one dialect rule through a socket.

The codec (`_native`) and the spec's lists are the references here: the table must name every
command the codec knows exactly once per dialect, agree with its fixed request sizes and caps,
and keep the v8-only commands (spec §14) out of v7.
"""

from __future__ import annotations

import inspect
import logging
import struct

import pytest
from rpcnet import _native
from rpcnet.server.command_table import COMMANDS, Mode, Order, Payload, rows
from rpcnet.server.session import STAGING_FREE, Session
from support.raw import RawConn, frame

DIALECTS = (7, 8)
V8_ONLY_IDS = {18, 19, 20, 21, 22}  # SET/GET_TENSOR_2D and COMM_* (spec §14)
# Spec §8.6: commands ordered after the connection's running graphs.
AFTER_GRAPHS = {
    "FREE_BUFFER",
    "BUFFER_CLEAR",
    "MEMSET_TENSOR",
    "SET_TENSOR",
    "SET_TENSOR_2D",
    "SET_TENSOR_HASH",
    "INIT_TENSOR",
    "GET_TENSOR",
    "GET_TENSOR_2D",
    "COPY_TENSOR",
}
QUEUED_BEHIND_GRAPHS = {"COMM_ALLREDUCE"}
BIG = 1 << 62


def codec_ids(proto: int) -> dict[int, str]:
    """Every command id the codec accepts in `proto`, with its name."""
    names = {cmd: _native.command_name(proto, cmd) for cmd in range(256)}
    return {cmd: name for cmd, name in names.items() if not name.startswith("UNKNOWN")}


@pytest.mark.parametrize("proto", DIALECTS)
def test_every_codec_command_has_exactly_one_row(proto):
    table = rows(proto)
    assert len(table) == 256
    present = {cmd: row.name for cmd, row in enumerate(table) if row is not None}
    assert present == codec_ids(proto)
    for cmd, row in enumerate(table):
        if row is not None:
            assert int(row.cmd) == cmd
    ids = [int(row.cmd) for row in COMMANDS]
    assert len(ids) == len(set(ids))


def test_v7_has_no_v8_only_command():
    assert V8_ONLY_IDS <= set(codec_ids(8))
    assert {cmd for cmd, row in enumerate(rows(7)) if row is not None}.isdisjoint(V8_ONLY_IDS)
    assert {int(row.cmd) for row in COMMANDS if 7 not in row.dialects} == V8_ONLY_IDS


@pytest.mark.parametrize("proto", DIALECTS)
def test_fixed_sizes_agree_with_the_codec(proto):
    for row in filter(None, rows(proto)):
        codec = _native.request_size(proto, row.cmd)
        assert row.request_size == codec, row.name
        assert (row.payload is Payload.FIXED) == (codec is not None), row.name
        if codec is not None:
            # why a fixed payload is never counted against --mem: it is always this small
            assert codec <= STAGING_FREE, row.name
            _native.check_header(proto, row.cmd, codec, 0, 0)
            with pytest.raises(_native.FrameError):
                _native.check_header(proto, row.cmd, codec + 1, BIG, BIG)


@pytest.mark.parametrize("proto", DIALECTS)
def test_each_variable_payload_has_the_cap_the_codec_applies(proto):
    for row in filter(None, rows(proto)):
        if row.payload is Payload.FIXED:
            assert row.cap is None, row.name
            continue
        assert row.cap in ("max_data", "max_graph"), row.name
        size = 1 << 20
        capped = {"max_data": BIG, "max_graph": BIG, row.cap: size - 1}
        with pytest.raises(_native.FrameError, match="exceeds the limit"):
            _native.check_header(proto, row.cmd, size, capped["max_data"], capped["max_graph"])
        other = {"max_data": 0, "max_graph": 0, row.cap: size}
        _native.check_header(proto, row.cmd, size, other["max_data"], other["max_graph"])


def test_every_handler_is_a_session_method():
    for row in COMMANDS:
        name = row.handler.__name__
        assert getattr(Session, name) is row.handler, row.name
        params = list(inspect.signature(row.handler).parameters)
        if row.payload is Payload.STREAMED:
            assert row.prefix > 0 and len(params) == 3, row.name  # (self, prefix, data_len)
        else:
            assert row.prefix == 0 and len(params) == 2, row.name  # (self, payload)


def test_ordering_follows_the_spec():
    after = {row.name for row in COMMANDS if row.order is Order.AFTER_GRAPHS}
    queued = {row.name for row in COMMANDS if row.order is Order.BEHIND_GRAPHS}
    assert after == AFTER_GRAPHS
    assert queued == QUEUED_BEHIND_GRAPHS
    assert {row.name for row in COMMANDS if row.waits} == AFTER_GRAPHS


def test_modes_of_the_commands_that_need_io():
    modes = {row.name: row.mode for row in COMMANDS}
    assert modes["SET_TENSOR"] is Mode.STREAMED
    assert modes["SET_TENSOR_HASH"] is Mode.CACHE
    assert modes["GRAPH_COMPUTE"] is modes["GRAPH_RECOMPUTE"] is Mode.WORKER
    assert {name for name, mode in modes.items() if mode is Mode.PEER} == {
        "COMM_INIT",
        "COMM_ALLREDUCE",
        "COMM_FREE",
    }
    # the protocol callback never waits: the commands whose effects await I/O stay out of it
    awaiting = {"HELLO", "SET_TENSOR_HASH", "COMM_INIT"}
    assert {row.name for row in COMMANDS if not row.in_callback} >= awaiting


V8_ONLY_FRAMES = {  # well-formed v8 requests: only the dialect refuses them
    18: frame(18, bytes(_native.RPC_TENSOR_SIZE + 32)),
    19: frame(19, bytes(_native.RPC_TENSOR_SIZE + 32)),
    20: frame(20, bytes(80)),
    21: frame(21, bytes(4 + _native.RPC_TENSOR_SIZE)),
    22: frame(22, bytes(4)),
}


@pytest.mark.parametrize("cmd", sorted(V8_ONLY_FRAMES))
def test_v8_only_command_on_v7_closes_only_that_connection(server_v7, caplog, cmd):
    caplog.set_level(logging.WARNING, logger="rpcnet.server")
    bystander = RawConn(server_v7.port)
    conn = RawConn(server_v7.port)
    conn.send(V8_ONLY_FRAMES[cmd])
    assert conn.closed_by_peer()
    conn.close()
    assert struct.unpack("<I", bystander.call(15, b"", 4))[0] == 1  # DEVICE_COUNT still served
    bystander.close()
    lines = [r.getMessage() for r in caplog.records if "closing connection" in r.getMessage()]
    assert len(lines) == 1 and f"unknown command {cmd}" in lines[0], lines
