"""Probe: one prompt-sized K-quant MUL_MAT (M 2816, K 1024, N 256: the 336 M model's FFN up)
on the REAL reference rpc-server and on rpcnet, both 2 threads, time per graph (upload,
compute, read back; best of 5). Rough: the transfers are in both numbers.

    PYTHONPATH=tests:bench/probes python bench/probes/tiled_speed_probe.py
"""

from __future__ import annotations

import time

import numpy as np
from support import refenv
from support.inproc import ServerThread
from support.opgraph import OpGraph
from tiled_matmul_probe import quantize

F32, MUL_MAT = 0, 29


def best(fn, repeat: int = 5) -> float:
    fn()
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t.append(time.perf_counter() - t0)
    return min(t)


def main() -> None:
    rng = np.random.default_rng(0)
    m, k, n = 2816, 1024, 256
    types = {"Q4_K": 12, "Q6_K": 14, "IQ4_XS": 23}
    sources = {f"t{t}_w": rng.standard_normal((m, k)).astype(np.float32) for t in types.values()}
    q = quantize(sources)
    port = refenv.free_port()
    proc = refenv.start_reference_server("v8", port=port, threads=2)
    srv = ServerThread(mem=1 << 30, threads=2).start()
    try:
        for name, t in types.items():
            g = OpGraph()
            w = g.input(t, (k, m), q[f"t{t}_w"].reshape(-1))
            x = g.input(F32, (k, n), rng.standard_normal((n, k)).astype(np.float32))
            out = g.op(MUL_MAT, F32, (m, n), (w, x))
            ref = best(lambda g=g, out=out: g.run(port, [out]))
            ours = best(lambda g=g, out=out: g.run(srv.port, [out]))
            print(
                f"{name}: reference {ref * 1e3:.1f} ms, rpcnet {ours * 1e3:.1f} ms, "
                f"ratio {ref / ours:.2f}x",
                flush=True,
            )
    finally:
        srv.stop()
        refenv.stop_process(proc)


if __name__ == "__main__":
    main()
