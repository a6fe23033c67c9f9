"""The RDMA transport's framing over the loopback fake verbs layer (no NIC needed).

What runs for real here: RdmaTransport (chunking, inline decision, receive ring and reposting,
message reassembly, strict boundaries, stop/liveness), activate_qp's order of verbs calls,
RdmaEndpoint, ResponseFramer and RdmaServerStream. What is faked: the queue pair itself
(tests/support/fakeverbs.py models RC delivery, RNR waits and the QP state machine).
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from rpcnet import _native
from rpcnet.transport.base import ConnectionClosed, TransportClosed, TransportError
from rpcnet.transport.caps import RdmaCaps
from rpcnet.transport.rdma import (
    RDMA_CHUNK,
    RX_DEPTH,
    RdmaActivationError,
    RdmaServerStream,
    RdmaUnavailable,
    ResponseFramer,
    verbs,
)
from support import require
from support.fakeverbs import (
    FakeFabric,
    FakeQueuePair,
    FakeVerbs,
    FakeVerbsError,
    fake_pair,
)


def run_in_thread(fn, *args):
    """Start fn(*args) on a thread; returns a join() that re-raises its exception."""
    box: dict = {}

    def target():
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()

    def join(timeout=30):
        t.join(timeout)
        assert not t.is_alive(), "thread did not finish"
        if "error" in box:
            raise box["error"]
        return box.get("result")

    return join


# ------------------------------------------------------------------------------------ chunking


def test_send_is_cut_into_256k_messages_that_end_with_the_call():
    fabric = FakeFabric()
    a, b = fake_pair(fabric)
    data = os.urandom(2 * RDMA_CHUNK + 1000)
    a.send(data)  # 3 messages; the ring of 24 absorbs them without a reader
    a.send(b"\x0e")  # a 1-byte call is its own message
    assert fabric.stats.messages == [RDMA_CHUNK, RDMA_CHUNK, 1000, 1]
    assert a.stats.messages_sent == 4 and a.stats.inline_sent == 1
    assert b.recv(len(data)) == data
    assert b.recv(1) == b"\x0e"


def test_inline_up_to_the_qp_limit_only():
    fabric = FakeFabric()
    a, _ = fake_pair(fabric, max_inline=64)
    a.send(bytes(64))
    a.send(bytes(65))
    assert a.stats.inline_sent == 1 and a.stats.messages_sent == 2


def test_empty_send_sends_nothing_and_flush_is_a_no_op():
    fabric = FakeFabric()
    a, b = fake_pair(fabric)
    a.send(b"")
    a.flush()
    assert fabric.stats.messages == []
    assert b.recv(0) == b""
    assert not b.has_data()


# ------------------------------------------------------------------------------------ receiving


def test_reads_reassemble_across_and_within_messages():
    a, b = fake_pair()
    a.send(b"abc")
    a.send(b"defgh")
    assert b.recv(2) == b"ab"  # part of a message: the rest stays, the buffer is not reposted
    assert len(b.qp.posted) == RX_DEPTH - 2
    assert b.recv(4) == b"cdef"  # finishes message 1 (reposted), starts message 2
    assert b.recv(2) == b"gh"
    assert len(b.qp.posted) == RX_DEPTH
    assert b.stats.reposted == 2


def test_strict_receiver_refuses_what_a_reference_receiver_would_overrun():
    a, b = fake_pair(strict=True)
    a.send(b"\x0e" + bytes(8))  # cmd byte and size in ONE send: wrong for the reference
    with pytest.raises(TransportError, match="9 bytes where the reader wanted 1"):
        b.recv(1)
    a2, b2 = fake_pair(strict=True)
    a2.send(b"\x0e")
    a2.send(bytes(8))
    assert b2.recv(1) == b"\x0e" and b2.recv(8) == bytes(8)


def test_ring_is_reposted_under_a_long_transfer():
    """40 MiB through a 24 x 256 KiB ring: the sender waits (RNR) until buffers come back."""
    fabric = FakeFabric()
    a, b = fake_pair(fabric, strict=False)
    data = os.urandom(40 << 20)
    join = run_in_thread(a.send, data)
    out = bytearray(len(data))
    view = memoryview(out)
    pos = 0
    for step in (1, 7, RDMA_CHUNK - 3, 5 << 20, 333_333):  # reads never aligned to messages
        b.recv_into(view[pos : pos + step])
        pos += step
    b.recv_into(view[pos:])
    join()
    assert out == data
    messages = -(-len(data) // RDMA_CHUNK)
    assert len(fabric.stats.messages) == messages
    assert b.stats.reposted == messages
    assert fabric.stats.rnr_waits > 0, "the ring must have run dry at least once"
    assert len(b.qp.posted) == RX_DEPTH, "every buffer is posted again at the end"


def test_both_directions_at_once():
    a, b = fake_pair()
    x, y = os.urandom(9 << 20), os.urandom(7 << 20)
    ja = run_in_thread(a.send, x)
    jb = run_in_thread(b.send, y)
    ra = run_in_thread(b.recv, len(x))
    rb = run_in_thread(a.recv, len(y))
    ja(), jb()
    assert ra() == x and rb() == y


# ------------------------------------------------------------------------------------ stop, errors


def test_wait_readable_and_stop():
    a, b = fake_pair()
    assert not b.has_data()
    join = run_in_thread(b.wait_readable)
    a.send(b"x")
    assert join() is True
    assert b.has_data() and b.recv(1) == b"x"
    join = run_in_thread(b.wait_readable)
    b.stop.set()
    assert join() is False
    with pytest.raises(TransportClosed):
        b.recv(1)


def test_peer_liveness_ends_a_wait():
    a, b = fake_pair()
    gone = threading.Event()
    b.peer_closed = gone.is_set
    join = run_in_thread(b.recv, 4)
    gone.set()
    with pytest.raises(TransportClosed, match="peer closed"):
        join()


def test_send_to_a_closed_peer_fails_with_a_completion_error():
    a, b = fake_pair()
    b.close()
    with pytest.raises(TransportError, match="RETRY_EXC_ERR"):
        a.send(b"hello")


def test_queue_pair_state_machine_is_enforced():
    fabric = FakeFabric()
    qp = FakeQueuePair(fabric, bytes(16))
    with pytest.raises(FakeVerbsError):
        qp.post_recv(0)  # RESET
    qp.to_init()
    qp.post_recv(0)
    with pytest.raises(FakeVerbsError, match="posted twice"):
        qp.post_recv(0)
    with pytest.raises(FakeVerbsError):
        qp.post_send(1, True)  # not RTS
    with pytest.raises(FakeVerbsError, match="PSN"):
        qp.to_rtr(RdmaCaps(0x1234, 0x1, bytes(16)))


# ------------------------------------------------------------------------------------ endpoints


def test_caps_follow_the_reference_layout():
    provider = FakeVerbs()
    ep = provider.probe("10.0.0.7")
    qpn, psn, gid = _native.rdma_decode_caps(ep.caps)
    assert qpn == ep.qp.qpn and psn == qpn & 0xFFFFFF
    assert gid == _native.rdma_target_gid("10.0.0.7")


@pytest.mark.parametrize("step", ["init", "rtr", "rts"])
def test_activation_failure_releases_the_queue_pair(step):
    fabric = FakeFabric()
    good = FakeVerbs(fabric).probe("10.0.0.1")
    bad = FakeVerbs(fabric, fail_at=step).probe("10.0.0.2")
    with pytest.raises(RdmaActivationError, match=f"injected failure at {step}"):
        bad.activate(good.caps)
    assert bad.qp.state == "CLOSED"
    with pytest.raises(RdmaActivationError, match="advertised no RDMA"):
        FakeVerbs(fabric).probe("10.0.0.3").activate(bytes(24))


def test_probe_uses_the_resolver_and_its_environment():
    ports = [
        _native.RdmaPort(
            "mlx5_0",
            1,
            [_native.RdmaGid(3, _native.rdma_target_gid("10.0.0.1"), "RoCE v2", "eth0")],
            "4: ACTIVE",
            "Ethernet",
        )
    ]
    ep = FakeVerbs(ports=ports, environ={}).probe("10.0.0.1")
    assert "mlx5_0 port 1 GID 3 (RoCE v2)" in ep.description
    with pytest.raises(RdmaUnavailable, match="no RDMA GID matches local address 10.9.9.9"):
        FakeVerbs(ports=ports, environ={}).probe("10.9.9.9")
    with pytest.raises(RdmaUnavailable, match="RDMA disabled: GGML_RPC_NO_RDMA is set"):
        FakeVerbs(ports=ports, environ={"GGML_RPC_NO_RDMA": "1"}).probe("10.0.0.1")


# ------------------------------------------------------------------------------------ server side


def test_response_framer_separates_size_and_payload():
    f = ResponseFramer()
    rsp = (16).to_bytes(8, "little") + bytes(range(16))
    pieces = [bytes(p) for p in f.split(memoryview(rsp + (0).to_bytes(8, "little")))]
    assert pieces == [rsp[:8], rsp[8:], bytes(8)]
    # large responses arrive as header, then payload view(s); a split header is reassembled
    big = (1000).to_bytes(8, "little")
    assert [bytes(p) for p in f.split(memoryview(big[:3]))] == []
    assert [bytes(p) for p in f.split(memoryview(big[3:]))] == [big]
    assert [len(p) for p in f.split(memoryview(bytes(600)))] == [600]
    assert [len(p) for p in f.split(memoryview(bytes(400)))] == [400]


class _FakeTcpStream:
    """The bits of StreamProtocol that RdmaServerStream uses for liveness and fallback."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.eof = True
        self.closed = False
        self.fast_path = None

    async def at_eof(self) -> bool:
        await self.event.wait()
        return self.eof

    def close(self) -> None:
        self.closed = True


async def test_server_stream_reads_writes_and_ends_on_tcp_eof():
    client, server = fake_pair(strict=True)
    client.strict = True
    tcp = _FakeTcpStream()
    stream = RdmaServerStream(server, tcp, "peer")
    client.send(b"\x0f")
    client.send(bytes(8))
    assert await stream.at_eof() is False
    assert await stream.readexactly(9) == b"\x0f" + bytes(8)  # our reads need not match sends
    stream.write((4).to_bytes(8, "little") + b"\x01\x00\x00\x00")  # one write, two messages
    await stream.drain()
    assert client.recv(8) == (4).to_bytes(8, "little")
    assert client.recv(4) == b"\x01\x00\x00\x00"
    waiting = asyncio.ensure_future(stream.at_eof())
    await asyncio.sleep(0.05)
    tcp.event.set()  # the client's TCP socket closed
    assert await asyncio.wait_for(waiting, 5) is True
    stream.close()
    assert tcp.closed


async def test_both_server_streams_are_byte_streams():
    from rpcnet.server.stream import StreamProtocol
    from rpcnet.transport.base import ByteStream

    client, server = fake_pair()
    stream = RdmaServerStream(server, _FakeTcpStream(), "peer")
    try:
        assert isinstance(stream, ByteStream)
        assert isinstance(StreamProtocol(), ByteStream)
        assert not isinstance(object(), ByteStream)
    finally:
        stream.close()
        client.close()


async def test_server_stream_maps_transport_errors_to_connection_closed():
    client, server = fake_pair()
    stream = RdmaServerStream(server, _FakeTcpStream(), "peer")
    client.close()
    stream.write((1).to_bytes(8, "little") + b"\x01")
    with pytest.raises(ConnectionClosed, match="RETRY_EXC_ERR"):
        await stream.drain()
    stream.close()


# ------------------------------------------------------------------------------------ real pyverbs


def test_work_requests_and_qp_attributes_fit_the_real_pyverbs_classes():
    """Builds every pyverbs object PyverbsQueuePair uses that needs no device (skipped where
    pyverbs is not installed; no NIC needed where it is)."""
    try:
        pv = verbs.import_pyverbs()
    except verbs.RdmaUnavailable as exc:
        require.missing(f"pyverbs: {exc}")
    e = pv.enums
    init = verbs.qp_init_attr(pv, None, None)
    assert init.qp_type == e.IBV_QPT_RC and init.max_inline_data == verbs.INLINE_REQUEST
    assert init.max_recv_wr == RX_DEPTH + 4 and init.max_send_wr == verbs.MAX_SEND_WR
    attr, mask = verbs.init_attr(pv, 1)
    assert attr.qp_state == e.IBV_QPS_INIT and mask & e.IBV_QP_ACCESS_FLAGS
    remote = RdmaCaps(0x2A5, 0x2A5, bytes(_native.rdma_target_gid("10.0.0.2")))
    attr, mask = verbs.rtr_attr(pv, 1, 3, e.IBV_MTU_4096, remote)
    assert (attr.dest_qp_num, attr.rq_psn, attr.min_rnr_timer) == (0x2A5, 0x2A5, 1)
    assert attr.ah_attr.dgid == "0000:0000:0000:0000:0000:ffff:0a00:0002"
    assert (attr.ah_attr.sgid_index, attr.ah_attr.hop_limit, attr.ah_attr.is_global) == (3, 1, 1)
    assert mask & e.IBV_QP_AV and mask & e.IBV_QP_DEST_QPN
    attr, mask = verbs.rts_attr(pv, 1, 0x2A5)
    assert (attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.sq_psn) == (14, 7, 7, 0x2A5)
    wr = verbs.recv_wr(pv, 0x10000, 7, 5)
    assert wr.wr_id == 5 and wr.num_sge == 1
    wr = verbs.send_wr(pv, 0x20000, 9, 100, True)
    assert wr.opcode == e.IBV_WR_SEND
    assert wr.send_flags == e.IBV_SEND_SIGNALED | e.IBV_SEND_INLINE
