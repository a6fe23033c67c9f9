"""The parameter block (compute/cuda/params.py): small uploads wait on the host and reach the
device in one copy, scattered by `rpc_scatter_params` on the emulator, on the strict stand-in
(stream order and capture rules checked), in the order they were sent."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest
from rpcnet.compute.cuda import launch, params
from rpcnet.compute.cuda.device import CupyCapturer
from rpcnet.compute.cuda.execute import PlanRunner
from support.strict_cupy import strict_cuda_backend

H2D, D2H = 1, 2


@pytest.fixture
def be():
    return strict_cuda_backend()


def _receive(be, mem, offset: int, data: bytes) -> None:
    """A SET_TENSOR's bytes as the connection hands them to the backend: piece by piece."""
    sink = be.host_sink(mem, offset, len(data))
    fed = 0
    for piece in sink.pieces():
        piece[:] = data[fed : fed + len(piece)]
        fed += len(piece)


def _events(be, since: int = 0) -> list[tuple]:
    return be.cp.timeline.trace[since:]


def test_pack_lays_the_table_out_as_the_kernel_reads_it():
    writes = [params.Write(0x1122334455667788, b"abc"), params.Write(0x40, bytes(range(20)))]
    out = np.zeros(params.TABLE + params.CAPACITY, np.uint8)
    used = params.pack(writes, out)
    table = params.TABLE
    want = struct.pack("<IIII", 2, 0, 0, 0) + struct.pack("<QII", 0x1122334455667788, table, 3)
    want += struct.pack("<QII", 0x40, table + 16, 20)
    assert out[: len(want)].tobytes() == want
    assert out[table : table + 3].tobytes() == b"abc"
    assert out[table + 16 : table + 36].tobytes() == bytes(range(20))
    assert used == table + 16 + 32  # each write's bytes start 16-byte aligned
    assert params.pack([], out) == 16 and out[:4].tobytes() == b"\0\0\0\0"


def test_the_scatter_puts_every_write_in_place_aligned_or_not(be):
    size = 8192
    mem = be.allocate(size)
    be.fill(mem, 0, size, 0xEE)
    want = np.full(size, 0xEE, np.uint8)
    rng = np.random.default_rng(3)
    # odd sizes and offsets (byte copies), whole 16-byte vectors, a write that overwrites an
    # earlier one (order kept), and one write of a single byte
    for offset, n in [(0, 1), (3, 17), (64, 256), (1000, 4000), (1024, 48), (7000, 33)]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        _receive(be, mem, offset, data)
        want[offset : offset + n] = np.frombuffer(data, np.uint8)
    assert np.array_equal(np.frombuffer(be.to_host(mem, 0, size), np.uint8), want)
    be.cp.assert_clean()


def test_small_uploads_wait_and_reach_the_device_in_one_copy(be):
    mem = be.allocate(4096)
    mark = len(_events(be))
    for i in range(5):
        _receive(be, mem, 256 * i, bytes([i + 1]) * 100)
    assert _events(be, mark) == [], "a small upload was copied on its own"
    got = be.to_host(mem, 0, 1280)
    assert [e[0:2] for e in _events(be, mark)] == [
        ("copy", H2D),
        ("kernel", "rpc_scatter_params"),
        ("copy", D2H),
    ]
    for i in range(5):
        assert bytes(got[256 * i : 256 * i + 100]) == bytes([i + 1]) * 100
    be.cp.assert_clean()


def test_a_large_upload_lands_after_the_small_ones_before_it(be):
    big = params.SMALL + 4096
    mem = be.allocate(big)
    _receive(be, mem, 0, b"\x01" * 64)
    _receive(be, mem, 0, b"\x02" * big)  # staged, straight to the device
    _receive(be, mem, 32, b"\x03" * 16)  # waits again
    got = bytes(be.to_host(mem, 0, 64))
    assert got == b"\x02" * 32 + b"\x03" * 16 + b"\x02" * 16
    be.cp.assert_clean()


def test_a_receive_that_fails_half_way_leaves_nothing_pending(be):
    mem = be.allocate(4096)
    pieces = be.host_sink(mem, 0, 100).pieces()
    next(pieces)[:10] = b"x" * 10  # the connection dropped here
    pieces.close()
    assert len(be.pending) == 0


def test_a_freed_buffers_pending_writes_are_dropped(be):
    kept, freed = be.allocate(4096), be.allocate(4096)
    _receive(be, kept, 0, b"k" * 8)
    _receive(be, freed, 0, b"f" * 8)
    be.free(freed)
    assert [w.data for w in be.pending.take()] == [bytearray(b"k" * 8)]


def test_a_full_block_is_applied_before_the_next_write_waits(be):
    mem = be.allocate(16 * (params.ENTRIES + 1))
    mark = len(_events(be))
    for i in range(params.ENTRIES + 1):
        _receive(be, mem, 16 * i, bytes([i]) * 16)
    assert [e[0] for e in _events(be, mark)] == ["copy", "kernel"]  # the first 64, at once
    assert len(be.pending) == 1
    got = bytes(be.to_host(mem, 0, 16 * (params.ENTRIES + 1)))
    assert got == b"".join(bytes([i]) * 16 for i in range(params.ENTRIES + 1))


def _copy_plan(be, src_mem, dst_mem, n: int, touched: tuple) -> SimpleNamespace:
    """A one-kernel plan: dst = src (f32), run by the GPU's plan runner."""
    src = be.view(src_mem, 0, (n,), (4,), np.float32)
    dst = be.view(dst_mem, 0, (n,), (4,), np.float32)
    return SimpleNamespace(
        steps=[lambda: launch.cpy(be, src, dst)],
        uid=1,
        buffers=frozenset({1, 2}),
        written=(),
        touched=touched,
    )


def test_a_plan_scatters_its_inputs_first_and_replays_never_scatter_old_bytes(be):
    n = 64
    src_mem, dst_mem, other = be.allocate(4 * n), be.allocate(4 * n), be.allocate(64)
    region = SimpleNamespace(array=src_mem, size=4 * n)
    plan = _copy_plan(be, src_mem, dst_mem, n, (region,))
    runner = PlanRunner(be, CupyCapturer(be.stream), fatal=lambda exc: pytest.fail(str(exc)))
    modes = []
    for step in range(4):
        x = np.arange(n, dtype=np.float32) + 100 * step
        _receive(be, src_mem, 0, x.tobytes())
        _receive(be, other, 0, b"o" * 64)  # not the plan's: stays pending
        mark = len(_events(be))
        modes.append(runner.run(plan, "session"))
        if modes[-1] == "replayed":
            assert [e[0:2] for e in _events(be, mark)] == [("copy", H2D), ("graph",)]
        assert len(be.pending) == 1  # the other buffer's write
        got = np.frombuffer(be.to_host(dst_mem, 0, 4 * n), np.float32)
        assert np.array_equal(got, x)
    assert modes == ["eager", "captured", "replayed", "replayed"]
    # a replay with nothing pending copies the input as it is now, not the last step's
    y = np.full(n, -1.0, np.float32)
    be.to_device(src_mem, 0, y.tobytes())  # straight to the device
    assert runner.run(plan, "session") == "replayed"
    assert np.array_equal(np.frombuffer(be.to_host(dst_mem, 0, 4 * n), np.float32), y)
    be.cp.assert_clean()
