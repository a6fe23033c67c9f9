"""MUL_MAT_ID kernel benchmark: the one-call native step against one native matmul per expert.

In one process, on the shapes of a qwen3moe-style layer (n_embd 1024, expert ff 512: the up /
gate product K 1024 → M 512 and the down product K 512 → M 1024), for 32 experts with 4 used
and 64 with 8 used, one token (decode) and 256 tokens (prefill), q8_0 and Q4_K experts:

- ``per expert``: what the kernel did before the native step, written out here: ids sorted,
  each expert's rows gathered with NumPy, one ``_native.matmul_quant`` call per selected expert
  (each with its own thread fan-out and activation conversion);
- ``one call``: ``_native.mul_mat_id_step`` (rows routed in Rust, each activation row converted
  once, each expert read once, (expert, row chunk) tasks over the threads).

Both give the same bits (checked here). The two run alternately, ``--reps`` times each, and the
median time of each is kept, so a drift of a shared host's speed hits both alike. Writes
bench/results/moe_kernel.json (bench/report.py's format) and regenerates docs/benchmarks.md.

    python bench/bench_moe_kernel.py [--threads 2] [--reps 41]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import report
from rpcnet import _native

RESULT = Path(__file__).resolve().parent / "results" / "moe_kernel.json"
TYPES = {"q8_0": 8, "Q4_K": 12}
PRODUCTS = {"up/gate": (1024, 512), "down": (512, 1024)}  # (K, M)
ROUTERS = {"32x4": (32, 4), "64x8": (64, 8)}


def experts(type_id: int, n_exp: int, m: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Valid blocks with random codes and small positive f16 scales: (n_exp * m, row bytes)."""
    block, block_bytes, _ = _native.matmul_quant_block(type_id)
    raw = rng.integers(0, 256, (n_exp * m, k // block, block_bytes), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    raw[:, :, 0:2] = scale  # q8_0's d, Q4_K's d
    if type_id == 12:
        raw[:, :, 2:4] = scale  # Q4_K's dmin
    return raw.reshape(n_exp * m, -1)


def per_expert(type_id, w, row, m, x, ids, out, threads) -> None:
    """The previous kernel's run(): one native matmul per selected expert."""
    from rpcnet.compute.kernels.moe import expert_groups

    for ex, tok, slot in expert_groups(ids):
        rows = np.ascontiguousarray(x[tok, slot % x.shape[1]]).reshape(-1, x.shape[2])
        res = np.empty((rows.shape[0], m), np.float32)
        _native.matmul_quant(type_id, w[ex * m : (ex + 1) * m], row, rows, res, threads)
        out[tok, slot] = res


def arg(a: np.ndarray, ne: tuple[int, ...], nb: tuple[int, ...]):
    return (a.reshape(-1).view(np.uint8), 0, ne, nb)


def case(type_id, k, m, n_exp, used, tokens, threads, reps, rng) -> tuple[float, float]:
    """Median seconds per call: (per expert, one call)."""
    w = experts(type_id, n_exp, m, k, rng)
    row = w.shape[1]
    block, block_bytes, _ = _native.matmul_quant_block(type_id)
    per_token = 1 if k == 1024 else used  # up/gate read one row per token, down one per slot
    x = rng.standard_normal((tokens, per_token, k)).astype(np.float32)
    ids = np.stack([rng.choice(n_exp, used, replace=False) for _ in range(tokens)]).astype(np.int32)
    old = np.zeros((tokens, used, m), np.float32)
    new = np.zeros((tokens, used, m), np.float32)
    step = _native.mul_mat_id_step(
        type_id,
        (w.reshape(-1), 0, (k // block, m, n_exp, 1), (block_bytes, row, row * m, w.size)),
        arg(x, (k, per_token, tokens, 1), (4, 4 * k, 4 * k * per_token, x.nbytes)),
        arg(ids, (used, tokens, 1, 1), (4, 4 * used, ids.nbytes, ids.nbytes)),
        arg(new, (m, used, tokens, 1), (4, 4 * m, 4 * m * used, new.nbytes)),
        threads,
    )
    times: tuple[list[float], list[float]] = ([], [])
    for rep in range(reps + 2):  # two warm-up rounds
        for side in (0, 1) if rep % 2 == 0 else (1, 0):
            t0 = time.perf_counter()
            if side == 0:
                per_expert(type_id, w, row, m, x, ids, old, threads)
            else:
                step()
            if rep >= 2:
                times[side].append(time.perf_counter() - t0)
    assert np.array_equal(old.view(np.uint32), new.view(np.uint32)), "results differ"
    return statistics.median(times[0]), statistics.median(times[1])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=41)
    p.add_argument("--prefill", type=int, default=256)
    p.add_argument("--json", type=Path, default=RESULT)
    p.add_argument("--no-doc", action="store_true")
    args = p.parse_args(argv)
    load_before = os.getloadavg()[1]
    rng = np.random.default_rng(35)
    rows = []
    for router, (n_exp, used) in ROUTERS.items():
        for tokens in (1, args.prefill):
            for tname, type_id in TYPES.items():
                for product, (k, m) in PRODUCTS.items():
                    reps = args.reps if tokens == 1 else max(5, args.reps // 8)
                    old, new = case(type_id, k, m, n_exp, used, tokens, args.threads, reps, rng)
                    rows.append(
                        [
                            router,
                            str(tokens),
                            tname,
                            product,
                            f"{old * 1e6:.0f}",
                            f"{new * 1e6:.0f}",
                            f"{old / new:.2f}×",
                        ]
                    )
                    print(" | ".join(rows[-1]), flush=True)
    doc = {
        "title": "MUL_MAT_ID: one native call against one matmul per expert",
        "script": "bench/bench_moe_kernel.py",
        "command": "python bench/bench_moe_kernel.py " + " ".join(argv),
        "machine": {**report.host_cpu(), "cores": os.cpu_count()},
        "description": [
            "One MUL_MAT_ID node of a qwen3moe-style layer (n_embd 1024, expert ff 512), "
            "in-process: `per expert` is one `_native.matmul_quant` call per selected expert "
            "over its rows gathered with NumPy (the kernel before the one-call step), `one call` "
            "is `_native.mul_mat_id_step`. Same bits (checked). Random valid blocks; "
            f"`--threads {args.threads}`; the two alternate, medians of {args.reps} calls "
            f"(decode) or {max(5, args.reps // 8)} (prefill)."
        ],
        "tables": [
            {
                "columns": [
                    "experts",
                    "tokens",
                    "type",
                    "product",
                    "per expert µs",
                    "one call µs",
                    "speedup",
                ],
                "rows": rows,
            }
        ],
        "notes": [report.load_note(load_before)],
    }
    report.save(args.json, doc, render_doc=not args.no_doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
