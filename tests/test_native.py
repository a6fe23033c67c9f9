"""Python face of rpcnet._native: codec round trips, narrow exceptions, header rules of both
dialects, graph decoding, FNV-1a and chunking."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from rpcnet import _native as n

BIG = (1 << 64) - 1

# Spec §3 / §14: id -> (name, v8 request size, v7 request size, response size).
# Request size None = variable; v7 None for commands v7 lacks. Response None = no response.
COMMANDS = {
    0: ("ALLOC_BUFFER", 12, 12, 16),
    1: ("GET_ALIGNMENT", 4, 4, 8),
    2: ("GET_MAX_SIZE", 4, 4, 8),
    3: ("BUFFER_GET_BASE", 8, 8, 8),
    4: ("FREE_BUFFER", 8, 8, None),
    5: ("BUFFER_CLEAR", 9, 9, None),
    6: ("SET_TENSOR", None, None, None),
    7: ("SET_TENSOR_HASH", 312, 312, 1),
    8: ("GET_TENSOR", 312, 312, -1),
    9: ("COPY_TENSOR", 592, 592, 1),
    10: ("GRAPH_COMPUTE", None, None, None),
    11: ("GET_DEVICE_MEMORY", 4, 4, 16),
    12: ("INIT_TENSOR", 296, 296, None),
    13: ("GET_ALLOC_SIZE", 3260, 3260, 8),
    14: ("HELLO", 24, 24, 28),
    15: ("DEVICE_COUNT", 0, 0, 4),
    16: ("GRAPH_RECOMPUTE", 12, 4, None),
    17: ("MEMSET_TENSOR", 313, 313, None),
    18: ("SET_TENSOR_2D", None, None, None),
    19: ("GET_TENSOR_2D", 328, None, -1),
    20: ("COMM_INIT", 80, None, 1),
    21: ("COMM_ALLREDUCE", 300, None, None),
    22: ("COMM_FREE", 4, None, None),
}
MINIMUM = {(8, 6): 305, (7, 6): 305, (8, 18): 328, (8, 10): 16, (7, 10): 8}
V7_COMMANDS = range(18)


def sample_tensor(**kw) -> n.RpcTensor:
    args = dict(
        id=0x1122334455667788,
        type=8,
        buffer=0xDEADBEEF00000001,
        ne=(64, 3, 2, 1),
        nb=(34, 68, 204, 408),
        op=29,
        op_params=struct.pack("<i f", 10, 0.5),
        flags=-2,
        src=(101, 102, 103),
        view_src=7,
        view_offs=4096,
        data=0x555500001000,
        name="blk.0.attn_q",
        use_count=3,
    )
    args.update(kw)
    return n.RpcTensor(**args)


def graph_payload(proto: int, device: int, uid: int, nodes, tensors) -> bytes:
    head = struct.pack("<I", device) + (struct.pack("<Q", uid) if proto == 8 else b"")
    body = struct.pack("<I", len(nodes)) + b"".join(struct.pack("<Q", x) for x in nodes)
    tail = struct.pack("<I", len(tensors)) + b"".join(t.to_bytes() for t in tensors)
    return head + body + tail


# ---------------------------------------------------------------------------------------------
# constants and exceptions


def test_constants():
    assert (n.PROTO_V8, n.PROTO_V7) == (8, 7)
    assert n.RPC_TENSOR_SIZE == 296
    assert n.MAX_CHUNK == 1 << 30
    assert n.GGML_TYPE_COUNT == 43


def test_exception_hierarchy():
    for cls in (n.FrameError, n.TensorError, n.GraphError):
        assert issubclass(cls, n.NativeError)
    assert issubclass(n.NativeError, Exception)
    assert not issubclass(n.TensorError, n.FrameError)


def test_frame_error_fields():
    with pytest.raises(n.FrameError) as info:
        n.check_header(8, 6, 3, BIG, BIG)
    e = info.value
    assert (e.cmd, e.size) == (6, 3)
    assert "305" in e.reason
    assert e.reason in str(e) and "\n" not in str(e)


def test_tensor_and_graph_error_fields():
    with pytest.raises(n.TensorError) as info:
        n.type_info(43)
    assert "43" in info.value.reason and info.value.reason in str(info.value)
    with pytest.raises(n.GraphError) as ginfo:
        n.decode_graph(8, b"\0" * 15)
    assert "truncated" in ginfo.value.reason and ginfo.value.reason in str(ginfo.value)


# ---------------------------------------------------------------------------------------------
# RpcTensor


def test_tensor_round_trip_and_layout():
    t = sample_tensor()
    b = t.to_bytes()
    assert isinstance(b, bytes) and len(b) == 296
    assert struct.unpack_from("<QIQ", b, 0) == (t.id, 8, t.buffer)
    assert struct.unpack_from("<4I4II", b, 20) == (64, 3, 2, 1, 34, 68, 204, 408, 29)
    assert b[56:64] == struct.pack("<i f", 10, 0.5) and b[64:120] == bytes(56)
    assert struct.unpack_from("<i", b, 120) == (-2,)
    assert struct.unpack_from("<10Q", b, 124) == (101, 102, 103) + (0,) * 7
    assert struct.unpack_from("<QQQ", b, 204) == (7, 4096, 0x555500001000)
    assert b[228:240] == b"blk.0.attn_q" and b[240:292] == bytes(52)
    assert struct.unpack_from("<i", b, 292) == (3,)
    back = n.decode_tensor(b)
    assert back == t and hash(back) == hash(t)
    assert back.to_bytes() == b


def test_tensor_fields():
    t = sample_tensor()
    assert t.id == 0x1122334455667788
    assert t.type == 8
    assert t.ne == (64, 3, 2, 1) and t.nb == (34, 68, 204, 408)
    assert t.op == 29 and t.flags == -2 and t.use_count == 3
    assert t.src == (101, 102, 103, 0, 0, 0, 0, 0, 0, 0)
    assert (t.view_src, t.view_offs, t.data) == (7, 4096, 0x555500001000)
    assert t.name == "blk.0.attn_q"
    assert len(t.op_params) == 64
    assert t.op_param_i32(0) == 10
    assert t.op_param_f32(1) == 0.5
    assert t.op_param_i32(15) == 0
    with pytest.raises(IndexError):
        t.op_param_i32(16)
    with pytest.raises(IndexError):
        t.op_param_f32(16)
    assert t.nbytes() == 64 * 34 // 32 + 2 * 68 + 1 * 204
    assert t.nelements() == 384
    r = repr(t)
    assert r.startswith("RpcTensor(") and "q8_0" in r and "blk.0.attn_q" in r


def test_tensor_defaults_and_contiguous_strides():
    t = n.RpcTensor()
    assert t.ne == (1, 1, 1, 1) and t.nb == (4, 4, 4, 4)
    assert t.op_params == bytes(64) and t.src == (0,) * 10 and t.name == ""
    assert n.RpcTensor(type=0, ne=(4, 3, 2, 1)).nb == (4, 16, 48, 96)
    assert n.RpcTensor(type=8, ne=(64, 3, 1, 1)).nb == (34, 68, 204, 204)
    assert n.RpcTensor(type=1, ne=(5, 2, 1, 1)).nbytes() == 20
    assert n.RpcTensor(type=0, ne=(0, 3, 1, 1)).nbytes() == 0


def test_tensor_constructor_errors():
    with pytest.raises(n.TensorError):
        n.RpcTensor(type=4)  # removed type, contiguous strides unknown
    with pytest.raises(n.TensorError):
        n.RpcTensor(type=0, ne=(1 << 31, 2, 1, 1))  # nb2 does not fit u32
    odd = n.RpcTensor(type=99, nb=(1, 1, 1, 1))  # explicit nb: no type validation
    with pytest.raises(n.TensorError):
        odd.nbytes()
    with pytest.raises(ValueError):
        n.RpcTensor(op_params=bytes(65))
    with pytest.raises(ValueError):
        n.RpcTensor(src=list(range(11)))
    with pytest.raises(ValueError):
        n.RpcTensor(name="x" * 64)
    with pytest.raises(ValueError):
        n.RpcTensor(name="a\0b")
    assert n.RpcTensor(name="x" * 63).name == "x" * 63
    with pytest.raises(OverflowError):
        n.RpcTensor(ne=(1 << 32, 1, 1, 1))
    with pytest.raises(TypeError):
        n.RpcTensor(0)  # keyword-only


def test_op_params_accepts_buffers():
    raw = np.arange(16, dtype=np.int32)
    t = n.RpcTensor(op_params=raw)
    assert t.op_params == raw.tobytes()
    assert n.RpcTensor(op_params=bytearray(b"\x07")).op_param_i32(0) == 7
    assert n.RpcTensor(op_params=memoryview(b"\x01\x02")).op_params[:3] == b"\x01\x02\x00"


def test_tensor_is_frozen():
    t = n.RpcTensor()
    with pytest.raises(AttributeError):
        t.id = 5  # type: ignore[misc]


def test_decode_arbitrary_bytes_round_trip():
    rng = np.random.default_rng(1)
    for _ in range(20):
        raw = rng.integers(0, 256, 296, dtype=np.uint8).tobytes()
        assert n.decode_tensor(raw).to_bytes() == raw


def test_name_decoding():
    raw = bytearray(296)
    raw[228:232] = b"ab\xffc"
    assert n.decode_tensor(raw).name == "ab\ufffdc"
    raw[228:292] = b"z" * 64  # no NUL at all: all 64 bytes
    assert n.decode_tensor(raw).name == "z" * 64
    raw[228:292] = b"q\0" + b"junk" * 15 + b"zz"  # bytes after NUL kept on the wire
    t = n.decode_tensor(raw)
    assert t.name == "q" and t.to_bytes() == bytes(raw)


@pytest.mark.parametrize(
    "wrap",
    [
        bytes,
        bytearray,
        memoryview,
        lambda b: memoryview(b).toreadonly(),
        lambda b: np.frombuffer(b, dtype=np.uint8),
    ],
)
def test_decode_tensor_buffer_types(wrap):
    t = sample_tensor()
    data = b"\xaa" * 5 + t.to_bytes() + b"\xbb"
    assert n.decode_tensor(wrap(data), 5) == t
    assert n.decode_tensor(wrap(data), offset=5) == t


def test_decode_tensor_short_input():
    t = sample_tensor().to_bytes()
    with pytest.raises(n.TensorError) as info:
        n.decode_tensor(t[:295])
    assert "296" in info.value.reason
    with pytest.raises(n.TensorError):
        n.decode_tensor(t, 1)
    with pytest.raises(n.TensorError):
        n.decode_tensor(t, 1 << 62)
    with pytest.raises(OverflowError):
        n.decode_tensor(t, -1)


def test_decode_tensors():
    ts = [sample_tensor(id=i) for i in range(1, 4)]
    data = b"\0" * 4 + b"".join(t.to_bytes() for t in ts)
    assert n.decode_tensors(data, 4, 3) == ts
    assert n.decode_tensors(data, 4, 0) == []
    with pytest.raises(n.TensorError):
        n.decode_tensors(data, 4, 4)
    with pytest.raises(n.TensorError):
        n.decode_tensors(data, 0, 1 << 60)


def test_decode_rejects_non_contiguous():
    arr = np.zeros(600, dtype=np.uint8)[::2]
    with pytest.raises(BufferError):
        n.decode_tensor(arr)
    with pytest.raises(TypeError):
        n.decode_tensor("not a buffer")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# framing


@pytest.mark.parametrize("proto", [8, 7])
def test_command_names(proto):
    valid = range(23) if proto == 8 else V7_COMMANDS
    for cmd in range(256):
        expect = COMMANDS[cmd][0] if cmd in valid else f"UNKNOWN({cmd})"
        assert n.command_name(proto, cmd) == expect
    assert n.command_name(proto, 99) == "UNKNOWN(99)"


@pytest.mark.parametrize("proto", [8, 7])
def test_check_header_every_command(proto):
    valid = range(23) if proto == 8 else V7_COMMANDS
    for cmd in range(256):
        if cmd not in valid:
            with pytest.raises(n.FrameError) as info:
                n.check_header(proto, cmd, 0, BIG, BIG)
            assert (info.value.cmd, info.value.size) == (cmd, 0)
            continue
        fixed = COMMANDS[cmd][1 if proto == 8 else 2]
        if fixed is not None:
            n.check_header(proto, cmd, fixed, 0, 0)
            for bad in {fixed + 1, max(fixed - 1, 0) if fixed else 1, BIG} - {fixed}:
                with pytest.raises(n.FrameError) as info:
                    n.check_header(proto, cmd, bad, BIG, BIG)
                assert (info.value.cmd, info.value.size) == (cmd, bad)
        else:
            low = MINIMUM[(proto, cmd)]
            n.check_header(proto, cmd, low, BIG, BIG)
            n.check_header(proto, cmd, low + 1000, BIG, BIG)
            with pytest.raises(n.FrameError):
                n.check_header(proto, cmd, low - 1, BIG, BIG)


def test_check_header_caps():
    for cmd in (6, 18):
        n.check_header(8, cmd, 4096, 4096, 0)
        with pytest.raises(n.FrameError) as info:
            n.check_header(8, cmd, 4097, 4096, BIG)
        assert "4096" in info.value.reason
    n.check_header(8, 10, 1000, 0, 1000)
    with pytest.raises(n.FrameError):
        n.check_header(8, 10, 1001, BIG, 1000)
    with pytest.raises(n.FrameError):
        n.check_header(7, 10, 1001, BIG, 1000)
    n.check_header(7, 6, 1000, 1000, 0)


def test_check_header_hello_and_recompute():
    for size in (0, 23, 25):
        with pytest.raises(n.FrameError):
            n.check_header(8, 14, size, BIG, BIG)
    n.check_header(8, 14, 24, BIG, BIG)
    n.check_header(8, 16, 12, BIG, BIG)
    n.check_header(7, 16, 4, BIG, BIG)
    with pytest.raises(n.FrameError):
        n.check_header(7, 16, 12, BIG, BIG)


def test_bad_proto():
    for fn in (
        lambda: n.command_name(9, 0),
        lambda: n.check_header(6, 0, 12, 0, 0),
        lambda: n.decode_graph(9, b"\0" * 64),
        lambda: n.request_size(0, 0),
    ):
        with pytest.raises(ValueError):
            fn()


@pytest.mark.parametrize("proto", [8, 7])
def test_request_and_response_sizes(proto):
    valid = range(23) if proto == 8 else V7_COMMANDS
    for cmd in valid:
        _, v8, v7, resp = COMMANDS[cmd]
        assert n.request_size(proto, cmd) == (v8 if proto == 8 else v7)
        assert n.response_size(proto, cmd) == resp
    for cmd in (23 if proto == 8 else 18, 200):
        with pytest.raises(n.FrameError):
            n.request_size(proto, cmd)
        with pytest.raises(n.FrameError):
            n.response_size(proto, cmd)


# ---------------------------------------------------------------------------------------------
# types and sizes


def test_type_info_table():
    removed = {4, 5, 31, 32, 33, 36, 37, 38}
    for tid in range(43):
        if tid in removed:
            with pytest.raises(n.TensorError):
                n.type_info(tid)
        else:
            name, block, size, quant = n.type_info(tid)
            assert block >= 1 and size >= 1 and quant == (block > 1)
    assert n.type_info(0) == ("f32", 1, 4, False)
    assert n.type_info(8) == ("q8_0", 32, 34, True)
    assert n.type_info(14) == ("q6_K", 256, 210, True)
    assert n.type_info(30) == ("bf16", 1, 2, False)
    assert n.type_info(40) == ("nvfp4", 64, 36, True)
    assert n.type_info(42) == ("q2_0", 64, 18, True)
    with pytest.raises(n.TensorError):
        n.type_info(43)


def test_tensor_nbytes():
    assert n.tensor_nbytes(0, (4, 1, 1, 1), (4, 16, 16, 16)) == 16
    assert n.tensor_nbytes(8, (64, 3, 1, 1), (34, 68, 204, 204)) == 204
    assert n.tensor_nbytes(0, (3, 4, 1, 1), (16, 4, 48, 48)) == 4 + 2 * 16 + 3 * 4  # transposed
    assert n.tensor_nbytes(0, (0, 1, 1, 1), (4, 4, 4, 4)) == 0
    with pytest.raises(n.TensorError):
        n.tensor_nbytes(4, (1, 1, 1, 1), (1, 1, 1, 1))
    with pytest.raises(n.TensorError):
        n.tensor_nbytes(0, (3, 1, 1, 1), (BIG, 0, 0, 0))
    big = (1 << 32) - 1
    with pytest.raises(n.TensorError):
        n.tensor_nbytes(0, (big,) * 4, (big,) * 4)


def test_nelements():
    assert n.nelements((2, 3, 4, 5)) == 120
    assert n.nelements([1 << 31, 1 << 31, 1, 1]) == 1 << 62
    big = (1 << 32) - 1
    with pytest.raises(n.TensorError):
        n.nelements((big, big, 1, 1))
    with pytest.raises(n.TensorError):
        n.RpcTensor(ne=(big, big, 1, 1), nb=(4, 4, 4, 4)).nelements()


# ---------------------------------------------------------------------------------------------
# region checks

BASE, SIZE = 0x1000, 0x100


def test_check_tensor_in_buffer():
    n.check_tensor_in_buffer(BASE, SIZE, BASE, SIZE)
    for args in [(BASE - 1, 1), (BASE + 1, SIZE), (BIG, 2)]:
        with pytest.raises(n.TensorError) as info:
            n.check_tensor_in_buffer(*args, BASE, SIZE)
        assert info.value.reason


def test_check_region():
    n.check_region(BASE, SIZE, BASE, 8, 8, 16)
    n.check_region(BASE, SIZE, BASE, 16, 0, 16)
    bad = [
        (BASE, SIZE, BASE - 1, 0, 1, BIG),  # below base
        (BASE, SIZE, BASE, SIZE, 0, BIG),  # d + off == end fails even for len 0
        (BASE, SIZE, BASE, 0, SIZE + 1, BIG),  # past buffer end
        (BASE, SIZE, BASE + 8, BIG - 4, 1, BIG),  # d + off overflows
        (BASE, SIZE, BASE, 8, 9, 16),  # past tensor end (reference aborts)
        (BASE, SIZE, BASE, 8, BIG, BIG),
    ]
    for args in bad:
        with pytest.raises(n.TensorError):
            n.check_region(*args)


def test_check_memset():
    n.check_memset(BASE, SIZE, BASE, 0, 16, 16)
    n.check_memset(BASE, SIZE, BASE + SIZE - 8, 8, 0, 16)
    for args in [
        (BASE, SIZE, BASE, 17, 0, 16),
        (BASE, SIZE, BASE, 8, 9, 16),
        (BASE, SIZE, BASE - 1, 0, 1, 16),
        (BASE, SIZE, BASE + SIZE - 8, 0, 9, 16),
        (BASE, SIZE, BASE + SIZE + 1, 0, 0, 16),
    ]:
        with pytest.raises(n.TensorError):
            n.check_memset(*args)


def test_check_region_2d():
    # (base, size, data, tensor_nbytes, offset, row, n_copies, stride, payload)
    n.check_region_2d(BASE, SIZE, BASE, 64, 0, 4, 4, 16, 16)
    n.check_region_2d(BASE, SIZE, BASE, 64, 12, 4, 4, 16, None)
    n.check_region_2d(BASE, SIZE, BASE, 64, 0, 8, 1, 0, 8)
    n.check_region_2d(BASE, SIZE, BASE, 64, 0, 8, 3, 0, None)
    bad = [
        (BASE, SIZE, BASE, 64, 0, 4, 0, 16, 0),  # n_copies 0
        (BASE, SIZE, BASE, 64, 0, 0, 4, 16, 0),  # size 0
        (BASE, SIZE, BASE, 64, 0, 4, 4, 16, 15),  # payload mismatch
        (BASE, SIZE, BASE, 64, 0, 4, 4, 16, 17),
        (BASE, SIZE, BASE, 64, 0, BIG, 2, 0, None),  # size * n_copies overflows
        (BASE, SIZE, BASE, 64, 0, 1, BIG, 2, None),  # span overflows
        (BASE, SIZE, BASE, 64, 13, 4, 4, 16, None),  # past tensor end
        (BASE, SIZE, BASE + SIZE - 4, 1000, 0, 4, 2, 4, None),  # past buffer end
        (BASE, SIZE, BASE - 1, 10, 0, 1, 1, 0, None),  # below base
    ]
    for args in bad:
        with pytest.raises(n.TensorError):
            n.check_region_2d(*args)


# ---------------------------------------------------------------------------------------------
# graphs


def test_decode_graph_v8():
    ts = [sample_tensor(id=i, name=f"t{i}") for i in (1, 2, 3)]
    g = n.decode_graph(8, graph_payload(8, 2, 24, [3, 2], ts))
    assert (g.device, g.uid) == (2, 24)
    assert g.nodes == [3, 2]
    assert g.tensors == ts
    assert g.tensors is g.tensors  # built once
    assert "tensors=3" in repr(g)


def test_decode_graph_v7():
    ts = [sample_tensor(id=9)]
    g = n.decode_graph(7, graph_payload(7, 1, 0, [9], ts))
    assert (g.device, g.uid, g.nodes, g.tensors) == (1, 0, [9], ts)


@pytest.mark.parametrize("proto", [8, 7])
def test_decode_graph_truncated(proto):
    p = graph_payload(proto, 0, 5, [1, 2], [sample_tensor(id=1), sample_tensor(id=2)])
    n.decode_graph(proto, p)
    for cut in range(len(p)):
        with pytest.raises(n.GraphError):
            n.decode_graph(proto, p[:cut])


def test_decode_graph_minimums_and_trailing():
    with pytest.raises(n.GraphError):
        n.decode_graph(8, bytes(16))  # header ok, n_tensors missing
    assert n.decode_graph(8, bytes(20)).nodes == []
    assert n.decode_graph(7, bytes(12)).tensors == []
    with pytest.raises(n.GraphError):
        n.decode_graph(7, bytes(11))
    p = graph_payload(8, 0, 0, [1], [sample_tensor(id=1)]) + b"\xff" * 100
    assert len(n.decode_graph(8, p).tensors) == 1


def test_decode_graph_huge_counts():
    p = bytearray(20)
    p[12:16] = struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(n.GraphError):
        n.decode_graph(8, p)
    p = bytearray(20)
    p[16:20] = struct.pack("<I", 0xFFFFFFFF)
    with pytest.raises(n.GraphError):
        n.decode_graph(8, p)


@pytest.mark.parametrize(
    "wrap", [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, dtype=np.uint8)]
)
def test_decode_graph_buffer_types(wrap):
    ts = [sample_tensor(id=1)]
    g = n.decode_graph(8, wrap(graph_payload(8, 0, 7, [1], ts)))
    assert g.uid == 7 and g.tensors == ts


def test_decode_graph_large():
    count = 5000
    ts = [n.RpcTensor(id=i + 1, ne=(4, 4, 1, 1), src=(i,)) for i in range(count)]
    g = n.decode_graph(8, graph_payload(8, 0, 1, list(range(1, count + 1)), ts))
    assert len(g.tensors) == count and g.tensors[-1].src[0] == count - 1
    assert g.nodes[-1] == count


# ---------------------------------------------------------------------------------------------
# FNV-1a 64


def test_fnv_vectors():
    assert n.fnv1a64(bytes(range(1, 17))) == 0xE7ECFB4F6E006495
    assert n.fnv1a64(b"") == 0xCBF29CE484222325
    assert n.fnv1a64(b"foobar") == 0x85944171F73967E8


def test_fnv_buffer_types():
    data = bytes(range(1, 17))
    expect = 0xE7ECFB4F6E006495
    assert n.fnv1a64(bytearray(data)) == expect
    assert n.fnv1a64(memoryview(data)) == expect
    assert n.fnv1a64(memoryview(bytearray(data)).toreadonly()) == expect
    assert n.fnv1a64(np.frombuffer(data, dtype=np.uint8)) == expect
    as_u32 = np.frombuffer(data, dtype=np.uint32)  # item size 4: hashed as raw bytes
    assert n.fnv1a64(as_u32) == expect
    ro = np.frombuffer(data, dtype=np.uint8).copy()
    ro.flags.writeable = False
    assert n.fnv1a64(ro) == expect
    assert n.fnv1a64(np.zeros((0,), dtype=np.float32)) == 0xCBF29CE484222325
    with pytest.raises(BufferError):
        n.fnv1a64(np.arange(32, dtype=np.uint8)[::2])


def py_fnv(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & BIG
    return h


def test_fnv_large_and_incremental():
    # 200 KiB crosses the GIL-release threshold; compare against a pure-Python reference.
    data = np.random.default_rng(2).integers(0, 256, 200 * 1024, dtype=np.uint8)
    expect = py_fnv(data.tobytes())
    assert n.fnv1a64(data) == expect
    assert n.fnv1a64(data.tobytes()) == expect
    h = n.Fnv1a64()
    for piece in (data[:7], data[7:100_000].tobytes(), memoryview(data)[100_000:]):
        h.update(piece)
    assert h.digest() == expect
    assert h.hexdigest() == f"{expect:016x}"


def test_fnv_hasher():
    h = n.Fnv1a64()
    assert h.digest() == 0xCBF29CE484222325
    assert h.hexdigest() == "cbf29ce484222325"
    h.update(bytes(range(1, 9)))
    h.update(bytearray(range(9, 17)))
    assert h.hexdigest() == "e7ecfb4f6e006495"
    assert len(n.Fnv1a64().hexdigest()) == 16


# ---------------------------------------------------------------------------------------------
# chunking


def test_chunk_plan():
    assert n.chunk_plan(0) == []
    assert n.chunk_plan(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert n.chunk_plan(8, 4) == [(0, 4), (4, 4)]
    assert n.chunk_plan(5) == [(0, 5)]
    plan = n.chunk_plan(3 * n.MAX_CHUNK + 1)
    assert plan[-1] == (3 * n.MAX_CHUNK, 1) and len(plan) == 4
    assert all(length <= n.MAX_CHUNK for _, length in plan)
    assert n.chunk_plan(BIG, BIG) == [(0, BIG)]
    with pytest.raises(ValueError):
        n.chunk_plan(10, 0)
