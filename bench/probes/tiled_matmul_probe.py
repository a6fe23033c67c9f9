"""Probe: where does the reference's MUL_MAT stop matching rpcnet's kernel, bit for bit?

For each weight type, M and K, sends MUL_MAT graphs with N = 1..NMAX activation rows to the
REAL reference rpc-server and compares every output with `_native.matmul_quant` (llamafile
dispatch on, i.e. what rpcnet's MUL_MAT runs). Prints one line per (type, M, K): the N values
that differ and how many elements. Run from the repo root with the worktree's venv:

    PYTHONPATH=tests python bench/probes/tiled_matmul_probe.py [TYPE ...]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from rpcnet import _native
from support import refenv
from support.opgraph import OpGraph, as_f32

F32, MUL_MAT, MUL_MAT_ID, I32 = 0, 29, 30, 26
TYPES = {
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "IQ4_XS": 23,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "IQ4_NL": 20,
    "MXFP4": 39,
}
SHAPES = [(37, 256), (64, 512), (17, 1280), (48, 768)]
NMAX = 40


def quantize(sources: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        np.savez(Path(tmp) / "in.npz", **sources)
        refenv.run_probe(
            "v8", "quantize_rows", Path(tmp) / "in.npz", Path(tmp) / "out.npz", timeout=300
        )
        with np.load(Path(tmp) / "out.npz") as q:
            return {k: q[k] for k in q.files}


def main(names: list[str]) -> None:
    names = names or list(TYPES)
    rng = np.random.default_rng(0)
    src = {}
    for name in names:
        for m, k in SHAPES:
            w = rng.standard_normal((m, k)).astype(np.float32)
            w *= np.logspace(-1, 1, m, dtype=np.float32)[:, None]
            src[f"t{TYPES[name]}_{m}_{k}"] = w
    q = quantize(src)
    port = refenv.free_port()
    proc = refenv.start_reference_server("v8", port=port)
    try:
        for name in names:
            t = TYPES[name]
            for m, k in SHAPES:
                wq = q[f"t{t}_{m}_{k}"]
                g = OpGraph()
                w = g.input(t, (k, m), wq.reshape(-1))
                outs = []
                for n in range(1, NMAX + 1):
                    xv = (rng.standard_normal((n, k)) * rng.uniform(0.1, 5, (n, 1))).astype(
                        np.float32
                    )
                    outs.append((g.op(MUL_MAT, F32, (m, n), (w, g.input(F32, (k, n), xv))), xv))
                ref = g.run(port, [o for o, _ in outs])
                bad = {}
                for portable in (False, True):
                    _native.set_portable_kernels(portable)
                    for (_, xv), r in zip(outs, ref, strict=True):
                        n = xv.shape[0]
                        want = as_f32(r, (m, n)).reshape(n, m)
                        got = np.empty((n, m), np.float32)
                        _native.matmul_quant(t, wq, wq.shape[1], xv, got, 2, True)
                        diff = int(np.sum(got.view(np.uint32) != want.view(np.uint32)))
                        if diff:
                            bad.setdefault(("P" if portable else "S") + str(n), diff)
                _native.set_portable_kernels(False)
                print(f"{name} M={m} K={k}: {'OK' if not bad else bad}", flush=True)
    finally:
        refenv.stop_process(proc)


if __name__ == "__main__":
    main(sys.argv[1:])
