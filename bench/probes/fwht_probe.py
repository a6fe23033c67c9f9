"""Probe: MUL_MAT with op_params[1] = 1 (ggml's "src0 is Hadamard" hint, which llama.cpp sets on
the KV-cache rotation of a quantized KV cache): the reference runs ggml_compute_forward_fwht
instead of a matmul. Compare it with a NumPy butterfly and with rpcnet.

    PYTHONPATH=tests python bench/probes/fwht_probe.py
"""

from __future__ import annotations

import numpy as np
from support import refenv
from support.inproc import ServerThread
from support.opgraph import OpGraph, as_f32, pack_params

F32, MUL_MAT = 0, 29


def fwht_rows(x: np.ndarray) -> np.ndarray:
    """Scale by 1/sqrtf(n) first, then the in-place butterflies len = 1, 2, 4, ... in float32."""
    n = x.shape[-1]
    y = (x * (np.float32(1.0) / np.sqrt(np.float32(n)))).astype(np.float32)
    length = 1
    while length < n:
        y = y.reshape(*x.shape[:-1], n // (2 * length), 2, length)
        u, v = y[..., 0, :].copy(), y[..., 1, :].copy()
        y[..., 0, :], y[..., 1, :] = u + v, u - v
        y = y.reshape(x.shape)
        length *= 2
    return y


def main() -> None:
    rng = np.random.default_rng(4)
    port = refenv.free_port()
    proc = refenv.start_reference_server("v8", port=port)
    srv = ServerThread(mem=1 << 30).start()
    try:
        for size in (64, 128, 256):
            g = OpGraph()
            w = g.input(F32, (size, size), rng.standard_normal((size, size)).astype(np.float32))
            cases = []
            for n in (1, 2, 4, 7, 16):
                xv = rng.standard_normal((n, size)).astype(np.float32)
                out = g.op(
                    MUL_MAT,
                    F32,
                    (size, n),
                    (w, g.input(F32, (size, n), xv)),
                    params=pack_params(0, 1),
                )
                cases.append((n, out, xv))
            ids = [c[1] for c in cases]
            ref, ours = g.run(port, ids), g.run(srv.port, ids)
            for (n, _, xv), r, o in zip(cases, ref, ours, strict=True):
                a = as_f32(r, (size, n)).reshape(n, size)
                b = as_f32(o, (size, n)).reshape(n, size)
                want = fwht_rows(xv)
                print(
                    f"{size} N={n}: ref==numpy-fwht {np.array_equal(a, want)} "
                    f"rpcnet==ref {np.array_equal(a.view(np.uint32), b.view(np.uint32))}"
                )
    finally:
        srv.stop()
        refenv.stop_process(proc)


if __name__ == "__main__":
    main()
