"""Probe: f32 MUL_MAT with a 64x64 Hadamard matrix (the KV-rotation llama.cpp adds for a
quantized KV cache), reference vs rpcnet, N = 1..16.

    PYTHONPATH=tests python bench/probes/hadamard_probe.py
"""

from __future__ import annotations

import numpy as np
from support import refenv
from support.inproc import ServerThread
from support.opgraph import OpGraph, as_f32

F32, MUL_MAT = 0, 29


def hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1), np.float32)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def main() -> None:
    rng = np.random.default_rng(3)
    port = refenv.free_port()
    proc = refenv.start_reference_server("v8", port=port)
    srv = ServerThread(mem=1 << 30).start()
    try:
        for size in (64, 128):
            for name, w in [
                ("H/sqrt", hadamard(size) / np.float32(np.sqrt(size))),
                ("H", hadamard(size)),
                ("rand", rng.standard_normal((size, size))),
            ]:
                g = OpGraph()
                wt = g.input(F32, (size, size), np.ascontiguousarray(w, np.float32))
                cases = []
                for n in (1, 2, 3, 4, 8, 16):
                    xv = rng.standard_normal((n, size)).astype(np.float32)
                    x = g.input(F32, (size, n), xv)
                    cases.append((n, g.op(MUL_MAT, F32, (size, n), (wt, x))))
                ids = [c[1] for c in cases]
                ref, ours = g.run(port, ids), g.run(srv.port, ids)
                for (n, _), r, o in zip(cases, ref, ours, strict=True):
                    a, b = as_f32(r, (size, n)), as_f32(o, (size, n))
                    diff = int(np.sum(a.view(np.uint32) != b.view(np.uint32)))
                    print(f"{size} {name} N={n}: {'OK' if not diff else f'{diff} differ'}")
    finally:
        srv.stop()
        refenv.stop_process(proc)


if __name__ == "__main__":
    main()
