"""Probe (runs under the reference env): one REAL v8 client's share of a shared server.

    fair_client.py MODEL HOST:PORT --mode decode|prefill [--tg 64] [--pp 512] [--reps 4]
                   [--threads 2] [--start FILE] [--stop FILE] [--ready FILE]

Every layer and the output head on the endpoint. After loading and a warm-up (the graphs built
and cached on both sides) the probe writes ``--ready`` and waits for ``--start`` to exist:
- ``decode``: a prompt of 8 tokens, then ``--tg`` single-token decodes, each timed;
- ``prefill``: prompts of ``--pp`` tokens (one batch, the KV cache cleared before each), back
  to back, ``--reps`` of them, or until ``--stop`` exists when it is given.
Prints one JSON line: {"mode", "seconds": [per token or per prompt], "wall_s", "tokens"}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _wait_for(path: Path | None, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while path is not None and not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.002)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("endpoint")
    parser.add_argument("--mode", choices=("decode", "prefill"), required=True)
    parser.add_argument("--tg", type=int, default=64)
    parser.add_argument("--pp", type=int, default=512)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ready", type=Path)
    parser.add_argument("--start", type=Path)
    parser.add_argument("--stop", type=Path)
    args = parser.parse_args(argv)

    from llama_cpp_py_sync._cffi_bindings import get_ffi, get_lib
    from llama_cpp_py_sync.rpc import rpc_devices

    ffi, lib = get_ffi(), get_lib()

    @ffi.callback("void(enum ggml_log_level, const char *, void *)")
    def _quiet(level, text, user_data):
        if level >= 4:
            sys.stderr.write(ffi.string(text).decode("utf-8", "replace"))

    lib.llama_log_set(_quiet, ffi.NULL)
    lib.llama_backend_init()
    params = lib.llama_model_default_params()
    params.n_gpu_layers = 999
    keep = ffi.new(
        "ggml_backend_dev_t[]", [*rpc_devices([args.endpoint], include_local=False), ffi.NULL]
    )
    params.devices = keep
    model = lib.llama_model_load_from_file(args.model.encode(), params)
    if model == ffi.NULL:
        raise RuntimeError("load failed")
    n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
    n_ctx = max(args.pp, 8 + args.tg) + 16
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
    cparams.n_seq_max = 1
    cparams.n_threads = cparams.n_threads_batch = args.threads
    cparams.flash_attn_type = 0
    cparams.no_perf = True
    ctx = lib.llama_init_from_model(model, cparams)
    if ctx == ffi.NULL:
        raise RuntimeError("context failed")
    mem = lib.llama_get_memory(ctx)

    def decode(tokens: list[int], pos0: int) -> None:
        batch = lib.llama_batch_init(len(tokens), 0, 1)
        try:
            batch.n_tokens = len(tokens)
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = pos0 + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if i == len(tokens) - 1 else 0
            if lib.llama_decode(ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            lib.llama_get_logits_ith(ctx, -1)
        finally:
            lib.llama_batch_free(batch)

    def tokens(n: int, seed: int) -> list[int]:
        return [(seed * 7919 + i * 104729) % (n_vocab - 10) + 5 for i in range(n)]

    # warm-up: every graph of the timed part built and cached on both sides
    if args.mode == "prefill":
        decode(tokens(args.pp, 1), 0)
    else:
        decode(tokens(8, 1), 0)
        decode([11], 8)
    lib.llama_memory_clear(mem, True)
    if args.ready is not None:
        args.ready.touch()
    _wait_for(args.start)

    seconds: list[float] = []
    t0 = time.perf_counter()
    if args.mode == "decode":
        decode(tokens(8, 3), 0)
        for i in range(args.tg):
            t1 = time.perf_counter()
            decode([(i * 31) % (n_vocab - 10) + 5], 8 + i)
            seconds.append(time.perf_counter() - t1)
        n_tokens = args.tg
    else:
        rep = 0
        while (rep < args.reps) if args.stop is None else not args.stop.exists():
            lib.llama_memory_clear(mem, True)
            t1 = time.perf_counter()
            decode(tokens(args.pp, 2 + rep), 0)
            seconds.append(time.perf_counter() - t1)
            rep += 1
        n_tokens = args.pp * rep
    wall = time.perf_counter() - t0
    lib.llama_free(ctx)
    lib.llama_model_free(model)
    print(json.dumps({"mode": args.mode, "seconds": seconds, "wall_s": wall, "tokens": n_tokens}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
