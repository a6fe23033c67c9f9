"""Numerics: rpcnet's logits against the REAL reference rpc-server's, for the same client.

The real v8 llama.cpp client runs each generated model teacher-forced (8 positions, every layer
on the server) three times with the same options: against the reference rpc-server, against an
in-process rpcnet server and on its own CPU backend. Per case:

* ``rel = max|rpcnet - reference| / max|reference|`` over the ``[8, n_vocab]`` logits is at most
  ``BOUND`` (1e-3) and the argmax agrees on every step;
* where the reference gives exactly the client's local numbers (every weight type the local CPU
  backend does not repack), rpcnet must also be within ``BOUND`` of the local run (checked for
  the setups without flash attention, ``LOCAL_CHECKED``).

Cases (see ``CASES``): llama GQA runs the full matrix of weight types x attention setups (flash
attention off/on, KV cache f16/q8_0, one batch or prefill then single-token decode); llama MHA,
qwen3, qwen3moe, gemma2-style (post norms, soft-capping, sliding window, tied head, GEGLU) and
phi3-style (fused QKV and gate|up) models run a diagonal of it. The models (support.numerics_zoo)
have spread logits (checked by ``test_logits_are_spread``), so the argmax check means something.

``pytest -s`` prints the table of errors; ``RPCNET_NUMERICS_REPORT=FILE`` writes it as JSON;
``RPCNET_E2E_CACHE=DIR`` keeps the generated models between runs. docs/numerics.md describes the
results.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.compute import graph
from support import refenv, require
from support.inproc import ServerThread
from support.models import ensure_model, tensor_types
from support.numerics_zoo import FAMILIES, WEIGHT_TYPES, spec

BOUND = 1e-3
TOKENS = "1,40,41,300,77,250,12,101"
PROBE_TIMEOUT = 180.0
#: weight types the client's local CPU backend repacks on x86 (AVX2): local != reference there
LOCALLY_REPACKED = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}

ATTENTION: dict[str, tuple[str, ...]] = {
    "fa0": ("--flash-attn", "0"),
    "fa1-decode": ("--flash-attn", "1", "--prefill", "4"),
    "fa1-kvq8": ("--flash-attn", "1", "--type-k", "q8_0", "--type-v", "q8_0", "--prefill", "4"),
    "fa0-kq8": ("--flash-attn", "0", "--type-k", "q8_0"),  # V stays f16 without FA
}

#: setups where the local run is compared too (one batch: no thread-dependent FA split)
LOCAL_CHECKED = ("fa0", "fa0-kq8")

_DIAGONAL = {
    "llama-mha": [("f16", "fa1-decode"), ("q8_0", "fa1-kvq8"), ("Q5_K_M", "fa0"),
                  ("IQ4_XS", "fa0-kq8")],
    "qwen3": [("f32", "fa0"), ("bf16", "fa1-decode"), ("Q4_K_M", "fa1-kvq8"), ("Q6_K", "fa0-kq8")],
    "qwen3moe": [("f32", "fa1-decode"), ("q8_0", "fa0"), ("q4_0", "fa1-kvq8"),
                 ("Q4_K_M", "fa0-kq8")],
    "gemma2": [("f32", "fa0"), ("f16", "fa1-kvq8"), ("q8_0", "fa1-decode"), ("q8_0", "fa0"),
               ("Q4_K_M", "fa0"), ("Q6_K", "fa0-kq8")],
    "phi3": [("f32", "fa1-decode"), ("bf16", "fa0"), ("q8_0", "fa0-kq8"), ("Q5_K_M", "fa1-kvq8"),
             ("IQ4_XS", "fa0")],
}  # fmt: skip

CASES = [("llama-gqa", w, a) for w in WEIGHT_TYPES for a in ATTENTION] + [
    (family, w, a) for family, pairs in _DIAGONAL.items() for w, a in pairs
]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def _require_refenv() -> None:
    require.reference_env("v8")
    require.module("gguf")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = os.environ.get("RPCNET_E2E_CACHE")
    return Path(cache) if cache else tmp_path_factory.mktemp("numerics-models")


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The REAL reference rpc-server and an in-process rpcnet server (both CPU, v8)."""
    port = refenv.free_port()
    log = tmp_path_factory.mktemp("numerics-ref") / "rpc-server.log"
    proc = refenv.start_reference_server("v8", port=port, log_path=log)
    ours = ServerThread(proto=8, mem=2 << 30).start()
    try:
        yield {"reference": f"127.0.0.1:{port}", "rpcnet": ours.endpoint, "local": "local"}
    finally:
        ours.stop()
        refenv.stop_process(proc)


@dataclass
class Runner:
    models: Path
    out: Path
    endpoints: dict[str, str]
    count: int = 0

    def model(self, family: str, wtype: str) -> Path:
        return ensure_model(spec(family, wtype), self.models)

    def logits(self, path: Path, where: str, opts: tuple[str, ...]) -> np.ndarray:
        self.count += 1
        result = refenv.run_probe(
            "v8",
            "generate",
            "--model",
            path,
            "--endpoint",
            self.endpoints[where],
            "--out",
            self.out / f"{self.count:03d}-{where}",
            "--tokens",
            TOKENS,
            "--threads",
            "1",
            *opts,
            timeout=PROBE_TIMEOUT,
        )
        if where != "local":
            assert result["device"].startswith("RPC"), result
        logits = np.load(result["logits_path"])
        assert np.isfinite(logits).all(), f"{where}: logits not finite"
        return logits


@pytest.fixture(scope="module")
def runner(model_dir: Path, endpoints, tmp_path_factory) -> Runner:
    return Runner(model_dir, tmp_path_factory.mktemp("numerics-out"), endpoints)


@pytest.fixture(scope="module")
def table() -> Iterator[list[dict]]:
    rows: list[dict] = []
    yield rows
    if not rows:
        return
    print("\nnumerics: rel = max|rpcnet - reference| / max|reference| (bound 1e-3)")
    print(f"  {'case':34s} {'rel':>9s} {'argmax':>7s} {'ref-local':>9s} {'min gap':>8s}")
    for r in rows:
        print(
            f"  {r['case']:34s} {r['rel']:9.2e} {r['argmax_bad']:>3d}/{r['steps']:<3d}"
            f" {r['ref_vs_local']:9.2e} {r['min_gap']:8.1e}"
        )
    report = os.environ.get("RPCNET_NUMERICS_REPORT")
    if report:
        Path(report).write_text(json.dumps(rows, indent=1))


# ----------------------------------------------------------------------------- helpers


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    return float(diff.max() / max(float(np.abs(ref).max()), 1e-30))


def top2_gaps(logits: np.ndarray) -> np.ndarray:
    """Per step: (largest - second largest logit) / max|logits|."""
    top = np.sort(logits, axis=1)[:, -2:]
    return (top[:, 1] - top[:, 0]) / float(np.abs(logits).max())


def argmax_mismatches(got: np.ndarray, ref: np.ndarray) -> list[tuple[int, int, int]]:
    return [
        (i, int(a), int(b))
        for i, (a, b) in enumerate(zip(ref.argmax(axis=1), got.argmax(axis=1), strict=True))
        if a != b
    ]


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_are_spread(runner: Runner, family: str) -> None:
    """The argmax check only means something if the top of each row is not a lone spike: a
    vocabulary of hundreds and, on most steps, top-1 probability below 1/2 with a top-2 gap
    far above the float noise."""
    logits = runner.logits(runner.model(family, "f32"), "local", ATTENTION["fa0"])
    assert logits.shape[1] >= 256
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    assert np.median(p.max(axis=1)) < 0.5, f"peaked logits: top-1 p {p.max(axis=1)}"
    assert np.median(top2_gaps(logits)) > 10 * BOUND, top2_gaps(logits)


@pytest.mark.parametrize(
    ("family", "wtype", "attention"), CASES, ids=[f"{f}-{w}-{a}" for f, w, a in CASES]
)
def test_logits_match_reference(
    runner: Runner, table: list[dict], family: str, wtype: str, attention: str
) -> None:
    path = runner.model(family, wtype)
    opts = ATTENTION[attention]
    ref = runner.logits(path, "reference", opts)
    got = runner.logits(path, "rpcnet", opts)
    assert got.shape == ref.shape
    rel = rel_error(got, ref)
    bad = argmax_mismatches(got, ref)
    local = runner.logits(path, "local", opts) if attention in LOCAL_CHECKED else None
    ref_vs_local = rel_error(ref, local) if local is not None else float("nan")
    table.append(
        {
            "case": f"{family}/{wtype}/{attention}",
            "rel": rel,
            "argmax_bad": len(bad),
            "steps": int(ref.shape[0]),
            "ref_vs_local": ref_vs_local,
            "rel_vs_local": rel_error(got, local) if local is not None else float("nan"),
            "min_gap": float(top2_gaps(ref).min()),
            "repacked_locally": sorted(LOCALLY_REPACKED & set(tensor_types(path).values())),
        }
    )
    assert rel <= BOUND, f"rel error vs reference {rel:.3e} > {BOUND:.0e}"
    assert not bad, f"argmax differs from the reference at (step, reference, rpcnet) {bad}"
    if local is not None and ref_vs_local == 0.0:  # else the client repacks weights locally
        assert rel_error(got, local) <= BOUND
        assert not argmax_mismatches(got, local)


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("attention", ["fa0", "fa1-decode"])
def test_plans_are_native(
    runner: Runner, monkeypatch: pytest.MonkeyPatch, family: str, attention: str
) -> None:
    """Every node of every architecture's prefill and decode plans (q8_0 weights, FA off and
    on) runs in the native plan: a run of them is one call, with no Python between nodes."""
    outside: list[str] = []
    plans: list[int] = []
    batch = graph.batch_native_steps

    def spy(steps: list) -> list:
        plans.append(len(steps))
        outside.extend(repr(s) for s in steps if not isinstance(s, _native.NativeStep))
        return batch(steps)

    monkeypatch.setattr(graph, "batch_native_steps", spy)
    runner.logits(runner.model(family, "q8_0"), "rpcnet", ATTENTION[attention])
    assert plans, "no plan was compiled"
    assert not outside, f"steps outside the native plan: {outside}"
