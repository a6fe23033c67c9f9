"""MUL_MAT_ID as one native step (`_native.mul_mat_id_step`) and the router's native ops.

For every expert type rpcnet computes: experts quantized by llama.cpp's own quantizer (the
reference env), tokens routed so that one expert gets 10 rows (ggml's tiled K-quant kernel) and
the others one to three. Oracles:

* ggml's definition in NumPy (`test_matmul_quant.oracle`: weights dequantized by the gguf
  package, activations quantized by an independent NumPy version of ggml's x86 quantizers, the
  dot in float64), per (token, slot);
* the REAL reference rpc-server running the same MUL_MAT_ID graph (bit for bit);
* one `_native.matmul_quant` per expert over the rows routed to it (bit for bit, any threads).

ARGSORT, SUM_ROWS and CLAMP steps are checked against NumPy's stable argsort, a float64 sum
and ggml's clamp macros written out.
"""

from __future__ import annotations

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.compute.kernels.kernel_table import select
from rpcnet.compute.ops import Op
from support import refenv, require
from support.opgraph import OpGraph, as_f32
from test_matmul_quant import TYPES, _tensor, k_values, oracle

F32, I32, MUL_MAT_ID = 0, 26, 30
N_EXP, M, TOKENS, SLOTS = 5, 37, 10, 3


@pytest.fixture(scope="module")
def experts(tmp_path_factory) -> dict[int, np.ndarray]:
    """{type: bytes (N_EXP * M, row bytes) from llama.cpp's quantizer}, K = k_values()[0]."""
    tmp = tmp_path_factory.mktemp("moe-quant")
    rng = np.random.default_rng(35)
    sources = {}
    for type_id in TYPES.values():
        k = k_values(type_id)[0]
        w = rng.standard_normal((N_EXP * M, k)).astype(np.float32)
        w *= np.logspace(-2, 1, N_EXP * M, dtype=np.float32)[:, None]
        sources[type_id] = w
    quantized = {t: w for t, w in sources.items() if t != F32}
    np.savez(tmp / "in.npz", **{f"t{t}_{w.shape[1]}": w for t, w in quantized.items()})
    refenv.run_probe("v8", "quantize_rows", tmp / "in.npz", tmp / "out.npz", timeout=300)
    out = {}
    with np.load(tmp / "out.npz") as q:
        for t, w in sources.items():
            out[t] = w.view(np.uint8).copy() if t == F32 else q[f"t{t}_{w.shape[1]}"]
    return out


def routing(rng: np.random.Generator) -> np.ndarray:
    """(TOKENS, SLOTS) ids: slot 0 is expert 0 for every token (10 rows: the tiled kernels),
    the others distinct experts from 1..3 (expert 4 is never selected)."""
    ids = np.zeros((TOKENS, SLOTS), np.int32)
    for t in range(TOKENS):
        ids[t, 1:] = rng.choice(np.arange(1, N_EXP - 1), SLOTS - 1, replace=False)
    return ids


def arg(a: np.ndarray, ne: tuple[int, ...], elem: int):
    """A C-contiguous array as a step's tensor argument (buffer, offset, ne, nb)."""
    nb = [elem]
    for n in ne[:-1]:
        nb.append(nb[-1] * n)
    return (a.reshape(-1).view(np.uint8), 0, ne, tuple(nb))


def run_step(type_id, wq, k, x, ids, threads=2):
    """The one-call MUL_MAT_ID: x (TOKENS, rows per token, K) -> out (TOKENS, SLOTS, M)."""
    block, block_bytes, _ = _native.matmul_quant_block(type_id)
    out = np.full((TOKENS, SLOTS, M), np.nan, np.float32)
    step = _native.mul_mat_id_step(
        type_id,
        (
            wq.reshape(-1),
            0,
            (k // block, M, N_EXP, 1),
            (block_bytes, wq.shape[1], wq.shape[1] * M, wq.size),
        ),
        arg(x, (k, x.shape[1], TOKENS, 1), 4),
        arg(ids, (SLOTS, TOKENS, 1, 1), 4),
        arg(out, (M, SLOTS, TOKENS, 1), 4),
        threads,
    )
    step()
    return out


@pytest.mark.parametrize("name", sorted(TYPES))
@pytest.mark.parametrize("per_token", [1, SLOTS])  # up/gate (one row per token), down (per slot)
def test_one_call_matches_ggml_definition_per_expert(name, per_token, experts):
    type_id = TYPES[name]
    k = k_values(type_id)[0]
    wq = experts[type_id]
    rng = np.random.default_rng(type_id * 3 + per_token)
    x = (rng.standard_normal((TOKENS, per_token, k)) * rng.uniform(0.1, 10, (TOKENS, 1, 1))).astype(
        np.float32
    )
    ids = routing(rng)
    got = run_step(type_id, wq, k, x, ids)
    checked = 0
    for t in range(TOKENS):
        for s in range(SLOTS):
            e = int(ids[t, s])
            want, scale = oracle(type_id, wq[e * M : (e + 1) * M], k, x[t, s % per_token][None])
            err = np.abs(got[t, s] - want[0])
            assert np.all(err <= 1e-5 * scale[0] + 1e-30), (name, t, s, np.max(err / scale[0]))
            checked += 1
    assert checked == TOKENS * SLOTS and np.isfinite(got).all()
    # the same bits as one product per expert over the rows routed to it, at any thread count
    per_expert = np.full_like(got, np.nan)
    for e in np.unique(ids):
        tok, slot = np.nonzero(ids == e)
        rows = np.ascontiguousarray(x[tok, slot % per_token])
        res = np.empty((rows.shape[0], M), np.float32)
        _native.matmul_quant(type_id, wq[e * M : (e + 1) * M], wq.shape[1], rows, res, 1)
        per_expert[tok, slot] = res
    for threads in (1, 3):
        again = run_step(type_id, wq, k, x, ids, threads)
        assert np.array_equal(again.view(np.uint32), per_expert.view(np.uint32)), (name, threads)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_one_call_is_bit_exact_with_reference_server(name, experts, reference_v8, rpcnet_v8):
    """The same MUL_MAT_ID graph on the reference rpc-server and on rpcnet (its native step),
    both forms of activations: every output bit equal."""
    type_id = TYPES[name]
    k = k_values(type_id)[0]
    wq = experts[type_id]
    rng = np.random.default_rng(type_id + 100)
    g = OpGraph()
    e = g.input(type_id, (k, M, N_EXP), wq.reshape(-1))
    ids = routing(rng)
    idt = g.input(I32, (SLOTS, TOKENS), ids.reshape(-1))
    outs = []
    for per_token in (1, SLOTS):
        xv = rng.standard_normal((TOKENS, per_token, k)).astype(np.float32)
        b = g.input(F32, (k, per_token, TOKENS), xv.reshape(-1))
        outs.append(g.op(MUL_MAT_ID, F32, (M, SLOTS, TOKENS), (e, b, idt)))
    ref, ours = g.run(reference_v8, outs), g.run(rpcnet_v8, outs)
    for r, o in zip(ref, ours, strict=True):
        want, got = as_f32(r, (M, SLOTS, TOKENS)), as_f32(o, (M, SLOTS, TOKENS))
        assert np.isfinite(want).all()
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (
            f"{name}: max |d| {np.max(np.abs(got - want)):.3g}"
        )


def test_native_step_serves_every_expert_type():
    for name, type_id in TYPES.items():
        k = k_values(type_id)[0]
        node = _tensor(
            F32,
            (M, SLOTS, TOKENS),
            MUL_MAT_ID,
            (
                _tensor(type_id, (k, M, N_EXP)),
                _tensor(F32, (k, 1, TOKENS)),
                _tensor(I32, (SLOTS, TOKENS)),
            ),
        )
        assert select(node).name == "mul_mat_id_native", name


def test_expert_id_out_of_range_raises():
    type_id = TYPES["Q8_0"]
    k = k_values(type_id)[0]
    wq = np.zeros((N_EXP * M, k // 32 * 34), np.uint8)
    x = np.ones((TOKENS, 1, k), np.float32)
    for bad in (N_EXP, -1):
        ids = np.zeros((TOKENS, SLOTS), np.int32)
        ids[3, 2] = bad
        with pytest.raises(ValueError, match="expert index"):
            run_step(type_id, wq, k, x, ids)


def test_router_ops_against_numpy():
    rng = np.random.default_rng(8)
    # router rows of a prefill: 64 experts per token, ties and signed zeros included
    x = rng.standard_normal((70, 64)).astype(np.float32)
    x[:, 5] = x[:, 9]
    x[0, :4] = [0.0, -0.0, 0.0, -0.0]
    for descending in (True, False):
        out = np.full(x.shape, -7, np.int32)
        _native.argsort_step(arg(x, (64, 70, 1, 1), 4), arg(out, (64, 70, 1, 1), 4), descending)()
        want = np.argsort(-x if descending else x, axis=1, kind="stable")
        assert np.array_equal(out, want), descending
    w = (rng.random((300, 8)) * rng.choice([1e-8, 1.0, 1e6], (300, 8))).astype(np.float32)
    sums = np.full((300, 1), np.nan, np.float32)
    _native.sum_rows_step(arg(w, (8, 300, 1, 1), 4), arg(sums, (1, 300, 1, 1), 4), 2)()
    want = np.array([sum(float(v) for v in row) for row in w], np.float64).astype(np.float32)
    assert np.array_equal(sums[:, 0], want)
    c = np.array([-5.0, 0.25, 9.0, np.nan, 6e-5, 1e-9], np.float32)
    lo, hi = np.float32(6.103515625e-05), np.float32(np.inf)
    expect = np.array([lo, 0.25, 9.0, hi, lo, lo], np.float32)  # MAX(MIN(x, hi), lo)
    _native.clamp_step(arg(c, (6, 1, 1, 1), 4), arg(c, (6, 1, 1, 1), 4), float(lo), float(hi))()
    assert np.array_equal(c, expect)


@pytest.mark.parametrize("fa", ["0", "1"])
def test_moe_plans_run_as_one_native_call(fa, tmp_path, monkeypatch):
    """A real client's qwen3moe graphs (prefill and single-token decode, q8_0 experts): every
    computed node is a native step, so each plan runs as one detached call (Python is entered
    once per graph, as for a dense llama)."""
    import rpcnet.server.session as session_mod
    from support.inproc import ServerThread
    from support.models import ensure_model
    from support.numerics_zoo import spec

    require.reference_env("v8")
    model = ensure_model(spec("qwen3moe", "q8_0"), tmp_path / "models")
    compile_plan = session_mod.compile_plan
    plans: list[tuple[int, int]] = []  # (computed MUL_MAT_ID nodes, steps of the plan)

    def keep(nodes, *args, **kwargs):
        plan = compile_plan(nodes, *args, **kwargs)
        plans.append((sum(n.op == Op.MUL_MAT_ID for n in nodes), len(plan.steps)))
        return plan

    monkeypatch.setattr(session_mod, "compile_plan", keep)
    server = ServerThread(proto=8, mem=1 << 30).start()
    try:
        refenv.run_probe(
            "v8",
            "generate",
            "--model",
            model,
            "--endpoint",
            server.endpoint,
            "--out",
            tmp_path / "out",
            "--tokens",
            "1,40,41,300,77,250",
            "--threads",
            "1",
            "--flash-attn",
            fa,
            "--prefill",
            "3",
            timeout=300,
        )
    finally:
        server.stop()
    moe = [steps for products, steps in plans if products]
    assert len(moe) >= 2, plans  # the prefill and the decodes after it
    assert all(steps == 1 for steps in moe), plans
