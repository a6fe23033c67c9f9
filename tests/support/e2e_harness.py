"""The harness of the end to end runs (tests/test_e2e_models.py): cases of the REAL llama.cpp
clients' ``generate`` probe, run once on the client's own CPU backend (the baseline, cached per
module) and once with the layers on rpcnet servers, and the comparison of their logits (or
pooled embeddings) against the bounds of docs/numerics.md. See docs/e2e.md."""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from support import refenv, require
from support.models import ZOO, ensure_model, tensor_types

#: ``quant``: the bound of docs/numerics.md; ``repacked``: models with weights the client's local
#: CPU backend repacks (Q4_0, Q4_K on AVX2), where even the reference server is ~1.5e-2 from the
#: local run (tests/test_numerics.py holds those to 1e-3 against the reference server instead)
TOLERANCE = {"f32": 1e-3, "f16": 2e-2, "quant": 1e-3, "repacked": 5e-2}
#: on a GPU, whose arithmetic differs from the CPU backend's as ggml-cuda's does (docs/gpu.md)
GPU_TOLERANCE = {"f32": 1e-3, "f16": 1e-2, "quant": 2e-2, "repacked": 5e-2}
#: GPU cases: 12 tokens in one batch (more than the 8 columns of the decode matvec: the prefill
#: path), then 4 single-token decodes
GPU_TOKENS = "1,40,41,300,77,250,12,101,7,99,180,3,64,33,21,150"
GPU_PREFILL = "12"
LOCALLY_REPACKED = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}
TOKENS = "1,40,41,300,77,250,12,101"  # 8 positions, every id < 320 (all vocabularies)
PREFILL = "4"  # decode cases: 4 tokens in one batch, then 4 single-token llama_decode calls
SERVER_MEM = 2 << 30
PROBE_TIMEOUT = 180.0


class LogCapture(logging.Handler):
    """Warnings and errors of the in-process servers (unsupported ops, closed connections)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" [{type(record.exc_info[1]).__name__}: {record.exc_info[1]}]"
        with self._lock:
            self.lines.append(f"{record.levelname} {record.name}: {text}")

    def mark(self) -> int:
        with self._lock:
            return len(self.lines)

    def since(self, mark: int) -> list[str]:
        with self._lock:
            return self.lines[mark:]


@dataclass
class Summary:
    rows: list[dict] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)

    def add(self, **row) -> None:
        self.rows.append(row)

    def fail(self, case: str, reason: str) -> None:
        self.failures.append((case, reason))

    def render(self) -> str:
        lines = ["", "e2e rpcnet vs local (rel = max|diff| / max|ref|):"]
        for r in self.rows:
            lines.append(
                f"  {r['case']:44s} {r['class']:5s} rel {r['rel']:.2e} (tol {r['tol']:.0e})"
                f" near-ties {r['near_ties']}"
            )
        worst: dict[str, float] = {}
        for r in self.rows:
            worst[r["class"]] = max(worst.get(r["class"], 0.0), r["rel"])
        lines.append("  worst per class: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
        if self.failures:
            lines.append("client failures (first rpcnet log line):")
            lines += [f"  {case:44s} {reason}" for case, reason in self.failures]
        return "\n".join(lines)


@dataclass(frozen=True)
class Case:
    model: str
    version: str = "v8"
    servers: tuple[str, ...] = ("v8",)  # keys of the ``servers`` fixture
    opts: tuple[str, ...] = ()  # generate.py options shared by baseline and rpcnet run
    rpc_opts: tuple[str, ...] = ()  # options for the rpcnet run only (placement)
    kv_quant: bool = False
    gpu: bool = False  # served by a GPU: GPU_TOLERANCE

    @property
    def spec(self):
        return ZOO[self.model]

    @property
    def tolerance_class(self) -> str:
        return "quant" if self.kv_quant else self.spec.dtype_class

    def args(self) -> list[str]:
        extra = ["--pooling", "mean"] if self.spec.embedding else []
        return ["--tokens", TOKENS, "--threads", "1", *extra, *self.opts]


class E2E:
    """Runs cases; baselines are cached per (version, model, options) for the whole module."""

    def __init__(self, zoo_dir: Path, work: Path, servers: dict, logs: LogCapture, summary):
        self.zoo_dir = zoo_dir
        self.work = work
        self.servers = servers
        self.logs = logs
        self.summary = summary
        self._baselines: dict[tuple, np.ndarray] = {}
        self._lock = threading.Lock()
        self._count = 0

    def model_path(self, name: str) -> Path:
        with self._lock:
            return ensure_model(ZOO[name], self.zoo_dir)

    def _out(self, tag: str) -> Path:
        with self._lock:
            self._count += 1
            return self.work / f"{self._count:03d}-{tag}"

    def _generate(self, case: Case, endpoint: str, tag: str, *extra: str) -> dict:
        """The client's ``generate`` probe of `case` on `endpoint` ("local": its own CPU)."""
        return refenv.run_probe(
            case.version,
            "generate",
            "--model",
            self.model_path(case.model),
            "--endpoint",
            endpoint,
            "--out",
            self._out(f"{tag}-{case.model}"),
            *case.args(),
            *extra,
            timeout=PROBE_TIMEOUT,
        )

    def baseline(self, case: Case) -> np.ndarray:
        require.reference_env(case.version)
        key = (case.version, case.model, tuple(case.args()))
        with self._lock:
            if key in self._baselines:
                return self._baselines[key]
        logits = np.load(self._generate(case, "local", "local")["logits_path"])
        with self._lock:
            self._baselines[key] = logits
        return logits

    def remote(self, case: Case, name: str = "") -> tuple[np.ndarray, dict]:
        for version in {case.version, *(key[:2] for key in case.servers)}:
            require.reference_env(version)  # the client's and each server's protocol
        endpoints = ",".join(self.servers["get"](key) for key in case.servers)
        mark = self.logs.mark()
        error = None
        try:
            result = self._generate(case, endpoints, "rpc", *case.rpc_opts)
        except refenv.ProbeError as exc:
            error = exc
        if error is not None:
            lines = self.logs.since(mark)
            first = next((ln for ln in lines if "closing connection" in ln), None)
            reason = first or (error.stderr.strip().splitlines() or [str(error)])[-1]
            self.summary.fail(name or case.model, re.sub(r"127\.0\.0\.1:\d+", "*", reason))
            pytest.fail(
                f"client failed against rpcnet ({case}):\n"
                + ("--- rpcnet log ---\n" + "\n".join(lines[-10:]) + "\n" if lines else "")
                + str(error),
                pytrace=False,
            )
        assert result["device"].startswith("RPC"), result
        return np.load(result["logits_path"]), result

    def check(self, name: str, case: Case) -> dict:
        ref = self.baseline(case)
        got, _ = self.remote(case, name)
        return self.compare(name, case, ref, got)

    def tolerance_class(self, case: Case) -> str:
        klass = case.tolerance_class
        if klass == "quant" and case.spec.quant is not None:
            if LOCALLY_REPACKED & set(tensor_types(self.model_path(case.model)).values()):
                return "repacked"
        return klass

    def compare(self, name: str, case: Case, ref: np.ndarray, got: np.ndarray) -> dict:
        klass = self.tolerance_class(case)
        tol = (GPU_TOLERANCE if case.gpu else TOLERANCE)[klass]
        assert got.shape == ref.shape, (got.shape, ref.shape)
        assert np.isfinite(ref).all(), "baseline not finite"
        assert np.isfinite(got).all(), f"rpcnet output not finite: {np.argwhere(~np.isfinite(got))}"
        diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        rel = float(diff.max() / max(float(np.abs(ref).max()), 1e-30))
        near_ties, bad = [], []
        if not case.spec.embedding:
            for i, (a, b) in enumerate(zip(ref.argmax(axis=1), got.argmax(axis=1), strict=True)):
                if a == b:
                    continue
                if ref[i, b] >= ref[i, a] - 2 * diff[i].max():
                    near_ties.append(i)  # reported, but still a failure: argmax must agree
                bad.append((i, int(a), int(b)))
        row = {
            "case": name,
            "class": klass,
            "rel": rel,
            "tol": tol,
            "max_abs": float(diff.max()),
            "near_ties": near_ties,
            "gpu": case.gpu,
            "steps": 0 if case.spec.embedding else int(ref.shape[0]),
            "argmax_differs": len(bad),
        }
        if case.spec.embedding:
            cos = float((ref * got).sum() / (np.linalg.norm(ref) * np.linalg.norm(got)))
            row["cosine"] = cos
        self.summary.add(**row)
        assert rel <= tol, f"{name}: rel error {rel:.3e} > {tol:.0e} (max abs {diff.max():.3e})"
        if case.gpu:  # the GPU bound is over every step (test_cuda_argmax_agreement); a
            # difference must still be a near tie (both within the logits' error of each other)
            bad = [b for b in bad if b[0] not in near_ties]
        assert not bad, f"{name}: argmax differs at (position, local, rpcnet) {bad}"
        return row
