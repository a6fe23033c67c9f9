"""Memory-amplification attacks over real sockets against a real `rpcnet serve` process.

Every graph here passes validation (all tensors lie inside the attacker's buffer) but uses
zero-stride or overlapping views whose *logical* size is far larger than their bytes. Each one
must either compute within the scratch budget (checked against a NumPy oracle) or close its
connection; the server's peak RSS (VmHWM) stays under its limits plus a fixed overhead, and an
honest connection opened before the attacks keeps being served throughout.
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from rpcnet.compute.ops import Glu, Op
from rpcnet.ggml_types import GgmlType
from support.opgraph import OpGraph, as_f32, pack_params
from support.raw import RawConn
from support.refenv import free_port
from support.serve import start_rpcnet

MiB = 1 << 20
MEM = 512 * MiB
MAX_SCRATCH = 128 * MiB
MAX_NODES = 8192
# Interpreter, NumPy, BLAS threads and allocator slack; far below any amplification here.
OVERHEAD = 192 * MiB
GET_DEVICE_MEMORY = 11

rng = np.random.default_rng(11)


def proc_status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


class Target:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc = start_rpcnet(
            self.port,
            "--mem",
            str(MEM),
            "--max-scratch",
            str(MAX_SCRATCH),
            "--max-graph-nodes",
            str(MAX_NODES),
            capture=True,
        )
        self.honest = RawConn(self.port)
        honest_graph(self.port)  # warm up NumPy/BLAS before the baseline
        self.baseline = proc_status(self.proc.pid, "VmRSS")

    def peak(self) -> int:
        return proc_status(self.proc.pid, "VmHWM")

    def device_memory(self) -> tuple[int, int]:
        free, total = struct.unpack("<QQ", self.honest.call(GET_DEVICE_MEMORY, bytes(4), 16))
        return free, total

    def stop(self) -> str:
        self.honest.close()
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        return out


@pytest.fixture(scope="module")
def target():
    t = Target()
    yield t
    if t.proc.poll() is None:
        t.stop()


def run_or_closed(graph: OpGraph, port: int, outputs: list[int]) -> list[bytes] | None:
    """The outputs' bytes, or None when the server closed the connection."""
    try:
        return graph.run(port, outputs)
    except (ConnectionError, OSError):
        return None


def honest_graph(port: int) -> None:
    g = OpGraph()
    x = rng.standard_normal((4, 32), dtype=np.float32)
    a = g.input(GgmlType.F32, (32, 4), x)
    out = g.op(Op.ADD, GgmlType.F32, (32, 4), (a, a))
    (raw,) = g.run(port, [out])
    np.testing.assert_array_equal(as_f32(raw, (32, 4))[0, 0], x + x)


def attack(target: Target, graph: OpGraph, outputs: list[int], must_close: bool = False):
    result = run_or_closed(graph, target.port, outputs)
    if must_close:
        assert result is None, "the server computed a graph over its scratch budget"
    # The process is bounded, and the honest connection is still served.
    assert target.peak() < target.baseline + MEM + OVERHEAD, (
        f"peak RSS {target.peak() >> 20} MiB over baseline {target.baseline >> 20} MiB + limits"
    )
    free, total = target.device_memory()
    assert total == MEM
    honest_graph(target.port)
    return result


def row_view(g: OpGraph, type_id: int, values: np.ndarray, ne, nb) -> int:
    """A view repeating one stored row through zero strides."""
    leaf = g.input(type_id, (values.size,), values)
    return g.view(leaf, ne, nb)


# --- MUL_MAT ---------------------------------------------------------------------------------


def test_mul_mat_broadcast_batch_computes_without_repeating_weights(target):
    # The amplification: 1024x1024 weights broadcast over a zero-stride batch of 512.
    # Repeating the weights would take 2 GiB; the server holds 512 MiB in all.
    w = rng.standard_normal((1024, 1024), dtype=np.float32)
    x = rng.standard_normal(1024, dtype=np.float32)
    g = OpGraph()
    a = g.input(GgmlType.F32, (1024, 1024), w)
    b = row_view(g, GgmlType.F32, x, (1024, 1, 512, 1), (4, 4096, 0, 0))
    out = g.op(Op.MUL_MAT, GgmlType.F32, (1024, 1, 512, 1), (a, b))
    (raw,) = attack(target, g, [out])
    got = as_f32(raw, (1024, 1, 512, 1))[0, :, 0]
    want = w.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-4, atol=1e-3)


def test_mul_mat_overlapping_output_is_refused(target):
    w = rng.standard_normal((1024, 1024), dtype=np.float32)
    g = OpGraph()
    a = g.input(GgmlType.F32, (1024, 1024), w)
    b = row_view(g, GgmlType.F32, w[0], (1024, 1, 1 << 20, 1), (4, 4096, 0, 0))
    out = g.op(Op.MUL_MAT, GgmlType.F32, (1024, 1, 1 << 20, 1), (a, b), nb=(4, 4096, 0, 0))
    attack(target, g, [out], must_close=True)


# --- MUL_MAT_ID ------------------------------------------------------------------------------


def _mul_mat_id(n_tok: int, out_nb=None) -> tuple[OpGraph, int, np.ndarray]:
    k, m, n_exp = 64, 32, 4
    experts = rng.standard_normal((n_exp, m, k), dtype=np.float32)
    x = rng.standard_normal(k, dtype=np.float32)
    g = OpGraph()
    a = g.input(GgmlType.F32, (k, m, n_exp), experts)
    b = row_view(g, GgmlType.F32, x, (k, 1, n_tok, 1), (4, 4 * k, 0, 0))
    ids = row_view(g, GgmlType.I32, np.array([2], np.int32), (1, n_tok, 1, 1), (4, 0, 0, 0))
    out = g.op(Op.MUL_MAT_ID, GgmlType.F32, (m, 1, n_tok, 1), (a, b, ids), nb=out_nb)
    return g, out, experts[2].astype(np.float64) @ x.astype(np.float64)


def test_mul_mat_id_zero_stride_tokens_compute(target):
    g, out, want = _mul_mat_id(1 << 16)
    (raw,) = attack(target, g, [out])
    got = as_f32(raw, (32, 1, 1 << 16, 1))[0, :, 0]
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-4, atol=1e-4)


def test_mul_mat_id_overlapping_output_is_refused(target):
    g, out, _ = _mul_mat_id(1 << 24, out_nb=(4, 128, 0, 0))
    attack(target, g, [out], must_close=True)


# --- FLASH_ATTN_EXT --------------------------------------------------------------------------


def _flash(n_q: int, n_kv: int, zero_q: bool) -> tuple[OpGraph, int, np.ndarray]:
    d, n_head = 64, 4
    q_vals = rng.standard_normal((n_head, 1 if zero_q else n_q, d), dtype=np.float32)
    k_row = rng.standard_normal(d, dtype=np.float32)
    v = rng.standard_normal((n_kv, d), dtype=np.float32)
    mask_row = -rng.random(n_kv).astype(np.float16)
    g = OpGraph()
    if zero_q:
        leaf = g.input(GgmlType.F32, (d, 1, n_head), q_vals)
        q = g.view(leaf, (d, n_q, n_head, 1), (4, 0, 4 * d, 4 * d * n_head))
    else:
        q = g.input(GgmlType.F32, (d, n_q, n_head), q_vals)
    k = row_view(g, GgmlType.F32, k_row, (d, n_kv, 1, 1), (4, 0, 4 * d, 4 * d))
    vt = g.input(GgmlType.F32, (d, n_kv), v)
    mask = row_view(g, GgmlType.F16, mask_row, (n_kv, 1 << 20, 1, 1), (2, 0, 0, 0))
    params = pack_params(0.125, 0.0, 0.0, 0)
    out = g.op(Op.FLASH_ATTN_EXT, GgmlType.F32, (d, n_head, n_q, 1), (q, k, vt, mask), params)
    # Every key is the same row: the scores differ only by the mask, for every head and query.
    m = mask_row.astype(np.float64)
    p = np.exp(m - m.max())
    return g, out, (p / p.sum()) @ v.astype(np.float64)


def test_flash_attn_zero_stride_keys_and_mask_compute(target):
    g, out, want = _flash(n_q=4, n_kv=8192, zero_q=False)
    (raw,) = attack(target, g, [out])
    got = as_f32(raw, (64, 4, 4, 1))[0]  # (n_q, n_head, d)
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-4, atol=1e-5)


def test_flash_attn_huge_broadcast_query_is_refused(target):
    # 4 Mi zero-stride query rows: 4 GiB of logical queries behind 1 KiB of bytes.
    g = OpGraph()
    d, n_head, n_q = 64, 4, 1 << 22
    leaf = g.input(GgmlType.F32, (d, 1, n_head), rng.standard_normal((n_head, d), dtype=np.float32))
    q = g.view(leaf, (d, n_q, n_head, 1), (4, 0, 4 * d, 4 * d * n_head))
    k = row_view(g, GgmlType.F32, rng.standard_normal(d, dtype=np.float32), (d, 256), (4, 0, 0, 0))
    v = row_view(g, GgmlType.F32, rng.standard_normal(d, dtype=np.float32), (d, 256), (4, 0, 0, 0))
    params = pack_params(0.125, 0.0, 0.0, 0)
    out = g.op(
        Op.FLASH_ATTN_EXT,
        GgmlType.F32,
        (d, n_head, n_q, 1),
        (q, k, v),
        params,
        nb=(4, 4 * d, 0, 0),
    )
    attack(target, g, [out], must_close=True)


# --- SOFT_MAX --------------------------------------------------------------------------------


def test_soft_max_broadcast_mask_computes(target):
    # The mask repeats one row 1 Mi times: converting all of it would take 1 GiB.
    x = rng.standard_normal((8, 64, 256), dtype=np.float32)
    mask_row = -rng.random(256).astype(np.float16)
    g = OpGraph()
    a = g.input(GgmlType.F32, (256, 64, 8), x)
    mask = row_view(g, GgmlType.F16, mask_row, (256, 1 << 20, 1, 1), (2, 0, 0, 0))
    out = g.op(Op.SOFT_MAX, GgmlType.F32, (256, 64, 8), (a, mask), pack_params(0.5, 0.0))
    (raw,) = attack(target, g, [out])
    w = x.astype(np.float64) * 0.5 + mask_row.astype(np.float64)
    e = np.exp(w - w.max(axis=-1, keepdims=True))
    np.testing.assert_allclose(
        as_f32(raw, (256, 64, 8))[0], e / e.sum(-1, keepdims=True), atol=1e-6
    )


def test_soft_max_overlapping_rows_are_refused(target):
    g = OpGraph()
    a = row_view(g, GgmlType.F32, np.ones(256, np.float32), (256, 1 << 20, 8), (4, 0, 0, 0))
    out = g.op(
        Op.SOFT_MAX, GgmlType.F32, (256, 1 << 20, 8), (a,), pack_params(1.0, 0.0), nb=(4, 0, 0, 0)
    )
    attack(target, g, [out], must_close=True)


# --- GET_ROWS --------------------------------------------------------------------------------


def test_get_rows_many_rows_of_a_tiny_source_compute(target):
    src = rng.standard_normal((4, 16), dtype=np.float32)
    n_rows = 1 << 18  # 16 MiB of output from 256 bytes of rows and 4 bytes of ids
    g = OpGraph()
    a = g.input(GgmlType.F32, (16, 4), src)
    ids = row_view(g, GgmlType.I32, np.array([3], np.int32), (n_rows, 1, 1, 1), (0, 0, 0, 0))
    out = g.op(Op.GET_ROWS, GgmlType.F32, (16, n_rows), (a, ids))
    (raw,) = attack(target, g, [out])
    got = as_f32(raw, (16, n_rows))[0, 0]
    np.testing.assert_array_equal(got, np.broadcast_to(src[3], got.shape))


def test_get_rows_into_overlapping_output_is_refused(target):
    g = OpGraph()
    a = g.input(GgmlType.F32, (16, 4), rng.standard_normal((4, 16), dtype=np.float32))
    ids = row_view(g, GgmlType.I32, np.array([1], np.int32), (1 << 26, 1, 1, 1), (0, 0, 0, 0))
    out = g.op(Op.GET_ROWS, GgmlType.F32, (16, 1 << 26), (a, ids), nb=(4, 0, 0, 0))
    attack(target, g, [out], must_close=True)


# --- CPY / CONT ------------------------------------------------------------------------------


@pytest.mark.parametrize("op, dst_type", [(Op.CONT, GgmlType.F32), (Op.CPY, GgmlType.F16)])
def test_copy_of_broadcast_view_computes(target, op, dst_type):
    row = rng.standard_normal(1024, dtype=np.float32)
    g = OpGraph()
    src = row_view(g, GgmlType.F32, row, (1024, 4096), (4, 0, 0, 0))
    out = g.op(op, dst_type, (1024, 4096), (src,))
    (raw,) = attack(target, g, [out])
    dtype = np.float32 if dst_type == GgmlType.F32 else np.float16
    got = np.frombuffer(raw, dtype).reshape(4096, 1024)
    np.testing.assert_array_equal(got, np.broadcast_to(row.astype(dtype), got.shape))


def test_copy_into_overlapping_destination_is_refused(target):
    g = OpGraph()
    src = row_view(g, GgmlType.F32, np.ones(1024, np.float32), (1024, 1 << 20), (4, 0, 0, 0))
    out = g.op(Op.CPY, GgmlType.F16, (1024, 1 << 20), (src,), nb=(2, 0, 0, 0))
    attack(target, g, [out], must_close=True)


# --- ROPE ------------------------------------------------------------------------------------


def _rope_params(n_dims: int) -> bytes:
    return pack_params(0, n_dims, 0, 0, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0, 0, 0, 0, 0, 0)


def test_rope_of_broadcast_rows_computes(target):
    d, n_head, n_tok = 64, 8, 512
    row = rng.standard_normal(d, dtype=np.float32)
    g = OpGraph()
    x = row_view(g, GgmlType.F32, row, (d, n_head, n_tok), (4, 0, 0, 0))
    pos = g.input(GgmlType.I32, (n_tok,), np.arange(n_tok, dtype=np.int32))
    out = g.op(Op.ROPE, GgmlType.F32, (d, n_head, n_tok), (x, pos), _rope_params(d))
    (raw,) = attack(target, g, [out])
    got = as_f32(raw, (d, n_head, n_tok))[0]  # (n_tok, n_head, d)
    # ggml's normal mode: pairs (x[2i], x[2i+1]) turn by p * base^(-2i/n_dims).
    theta = np.arange(n_tok)[:, None] * 10000.0 ** (-np.arange(0, d, 2) / d)
    x0, x1 = row[0::2].astype(np.float64), row[1::2].astype(np.float64)
    want = np.empty((n_tok, d))
    want[:, 0::2] = x0 * np.cos(theta) - x1 * np.sin(theta)
    want[:, 1::2] = x0 * np.sin(theta) + x1 * np.cos(theta)
    np.testing.assert_allclose(got, np.broadcast_to(want[:, None], got.shape), atol=2e-3)


def test_rope_into_overlapping_output_is_refused(target):
    d, n_head, n_tok = 64, 1 << 14, 1 << 10
    g = OpGraph()
    x = row_view(g, GgmlType.F32, np.ones(d, np.float32), (d, n_head, n_tok), (4, 0, 0, 0))
    pos = g.input(GgmlType.I32, (n_tok,), np.arange(n_tok, dtype=np.int32))
    out = g.op(
        Op.ROPE, GgmlType.F32, (d, n_head, n_tok), (x, pos), _rope_params(d), nb=(4, 0, 0, 0)
    )
    attack(target, g, [out], must_close=True)


# --- GLU and binary ops ----------------------------------------------------------------------


def test_glu_of_broadcast_views_computes(target):
    xa, xg = rng.standard_normal((2, 1024), dtype=np.float32)
    g = OpGraph()
    a = row_view(g, GgmlType.F32, xa, (1024, 4096), (4, 0, 0, 0))
    gate = row_view(g, GgmlType.F32, xg, (1024, 4096), (4, 0, 0, 0))
    out = g.op(Op.GLU, GgmlType.F32, (1024, 4096), (a, gate), pack_params(int(Glu.SWIGLU), 0))
    (raw,) = attack(target, g, [out])
    xa64 = xa.astype(np.float64)
    want = xa64 / (1 + np.exp(-xa64)) * xg
    got = as_f32(raw, (1024, 4096))[0, 0]
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-5, atol=1e-6)


def test_glu_into_overlapping_output_is_refused(target):
    g = OpGraph()
    a = row_view(g, GgmlType.F32, np.ones(1024, np.float32), (1024, 1 << 20), (4, 0, 0, 0))
    out = g.op(
        Op.GLU,
        GgmlType.F32,
        (1024, 1 << 20),
        (a, a),
        pack_params(int(Glu.SWIGLU), 0),
        nb=(4, 0, 0, 0),
    )
    attack(target, g, [out], must_close=True)


def test_binary_broadcast_of_zero_stride_views_computes(target):
    row = rng.standard_normal(1024, dtype=np.float32)
    col = rng.standard_normal(1024, dtype=np.float32)
    g = OpGraph()
    a = row_view(g, GgmlType.F32, row, (1024, 4096), (4, 0, 0, 0))
    b = g.input(GgmlType.F32, (1024, 1), col)
    out = g.op(Op.MUL, GgmlType.F32, (1024, 4096), (a, b))
    (raw,) = attack(target, g, [out])
    got = as_f32(raw, (1024, 4096))[0, 0]
    np.testing.assert_array_equal(got, np.broadcast_to(row * col, got.shape))


def test_binary_into_overlapping_output_is_refused(target):
    g = OpGraph()
    a = row_view(g, GgmlType.F32, np.ones(1024, np.float32), (1024, 1 << 20), (4, 0, 0, 0))
    out = g.op(Op.ADD, GgmlType.F32, (1024, 1 << 20), (a, a), nb=(4, 0, 0, 0))
    attack(target, g, [out], must_close=True)


# --- graph shape -----------------------------------------------------------------------------


def _scale_chain(n_nodes: int) -> tuple[OpGraph, int]:
    g = OpGraph()
    cur = g.input(GgmlType.F32, (1,), np.array([0.5], np.float32))
    for _ in range(n_nodes):
        cur = g.op(Op.SCALE, GgmlType.F32, (1,), (cur,), pack_params(1.0, 1.0))
    return g, cur


def test_graph_at_the_node_limit_computes(target):
    g, last = _scale_chain(MAX_NODES - 1)  # plus the input: exactly MAX_NODES tensors
    (raw,) = attack(target, g, [last])
    assert np.frombuffer(raw, np.float32)[0] == 0.5 + (MAX_NODES - 1)


def test_graph_over_the_node_limit_is_refused(target):
    g, last = _scale_chain(MAX_NODES)
    attack(target, g, [last], must_close=True)


def test_deep_view_chain_computes(target):
    row = rng.standard_normal(256, dtype=np.float32)
    g = OpGraph()
    cur = g.input(GgmlType.F32, (256,), row)
    for _ in range(MAX_NODES - 2):
        cur = g.view(cur, (256, 1, 1, 1), (4, 1024, 1024, 1024))
    out = g.op(Op.CONT, GgmlType.F32, (256,), (cur,))
    (raw,) = attack(target, g, [out])
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32), row)


# --- afterwards ------------------------------------------------------------------------------


def test_memory_returns_and_refusals_are_logged(target):
    """Runs last in this module: every attack's buffers, plans and scratch are released."""
    deadline = time.monotonic() + 10
    while True:
        free, total = target.device_memory()
        if free == total or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert free == total, f"{total - free} bytes still held after every attacker left"
    log = target.stop()
    refusals = [line for line in log.splitlines() if "compute scratch" in line]
    assert refusals, log[-2000:]
    assert all("closing connection" in line and "--max-scratch" in line for line in refusals)
    assert not any("internal error" in line or "Traceback" in line for line in log.splitlines())
