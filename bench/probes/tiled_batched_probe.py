"""Probe: batched MUL_MAT (3-D activations) and MUL_MAT_ID with K-quant weights, reference vs
rpcnet (full server path), to find which row count picks ggml's tiled kernel there.

    PYTHONPATH=tests python bench/probes/tiled_batched_probe.py
"""

from __future__ import annotations

import numpy as np
from support import refenv
from support.inproc import ServerThread
from support.opgraph import OpGraph, as_f32
from tiled_matmul_probe import quantize

F32, MUL_MAT, MUL_MAT_ID, I32 = 0, 29, 30, 26


def main() -> None:
    rng = np.random.default_rng(1)
    k, m, n_exp = 256, 24, 4
    q = quantize(
        {
            f"t{t}_e": rng.standard_normal((m * n_exp, k)).astype(np.float32)
            for t in (12, 23, 20, 8, 14)
        }
    )
    port = refenv.free_port()
    proc = refenv.start_reference_server("v8", port=port)
    srv = ServerThread(mem=1 << 30).start()
    try:
        for t in (12, 23, 20, 8, 14):
            wq = q[f"t{t}_e"]
            g = OpGraph()
            w2 = g.input(t, (k, m), wq[:m].reshape(-1))
            w3 = g.input(t, (k, m, n_exp), wq.reshape(-1))
            cases = []
            for n1, n2 in [(3, 4), (4, 2), (7, 2), (8, 1), (1, 8), (2, 8), (8, 3), (9, 2)]:
                x = g.input(F32, (k, n1, n2), rng.standard_normal((n2, n1, k)).astype(np.float32))
                cases.append(
                    (
                        f"MM ne11={n1} ne12={n2}",
                        g.op(MUL_MAT, F32, (m, n1, n2), (w2, x)),
                        (m, n1, n2),
                    )
                )
            for n_tok in (1, 3, 4, 5, 8, 12, 16, 17, 32, 40):
                for used in (1, 2):
                    b = g.input(
                        F32, (k, 1, n_tok), rng.standard_normal((n_tok, k)).astype(np.float32)
                    )
                    ids = np.stack([rng.permutation(n_exp)[:used] for _ in range(n_tok)])
                    ids[: n_tok // 2, 0] = 0  # expert 0 gets at least half the tokens
                    idt = g.input(I32, (used, n_tok), ids.astype(np.int32))
                    cases.append(
                        (
                            f"MMID tok={n_tok} used={used} e0={np.sum(ids == 0)}",
                            g.op(MUL_MAT_ID, F32, (m, used, n_tok), (w3, b, idt)),
                            (m, used, n_tok),
                        )
                    )
            ids_ = [c[1] for c in cases]
            ref, ours = g.run(port, ids_), g.run(srv.port, ids_)
            for (label, _, ne), r, o in zip(cases, ref, ours, strict=True):
                a, b_ = as_f32(r, ne), as_f32(o, ne)
                diff = int(np.sum(a.view(np.uint32) != b_.view(np.uint32)))
                print(f"type {t} {label}: {'OK' if not diff else f'{diff} differ'}", flush=True)
    finally:
        srv.stop()
        refenv.stop_process(proc)


if __name__ == "__main__":
    main()
