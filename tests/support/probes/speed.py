"""Probe: prefill and decode speed of the REAL llama.cpp client with every layer on an endpoint.

    speed.py MODEL ENDPOINT --pp 64,256 --tg 32 [--threads 2] [--flash-attn 0] [--depth 0]

ENDPOINT is HOST:PORT, several comma-separated (``--split-mode`` and ``--tensor-split`` place the
model across them; tensor split needs ``--flash-attn 1``), or "local". For each pp size: one
batch of that many tokens (logits for the last one only), timed after a warm-up batch; for tg:
one warm-up token, then `tg` single-token decodes (after a `depth`-token
prompt, in 256-token batches, when given). The KV cache is cleared between
measurements. Prints one JSON line:
{"pp": {"64": tokens_per_s, ...}, "tg": tokens_per_s, "load_s": ...}
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("endpoint")
    parser.add_argument("--pp", default="64")
    parser.add_argument("--tg", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--flash-attn", type=int, default=0)
    parser.add_argument("--depth", type=int, default=0, help="KV positions filled before tg")
    parser.add_argument("--split-mode", choices=("none", "layer", "row", "tensor"), default=None)
    parser.add_argument("--tensor-split", default=None, help="per-device proportions, e.g. 1,1")
    args = parser.parse_args(argv)
    pp_sizes = [int(x) for x in args.pp.split(",") if x]

    from llama_cpp_py_sync._cffi_bindings import get_ffi, get_lib

    ffi, lib = get_ffi(), get_lib()

    @ffi.callback("void(enum ggml_log_level, const char *, void *)")
    def _quiet(level, text, user_data):
        if level >= 4:
            sys.stderr.write(ffi.string(text).decode("utf-8", "replace"))

    lib.llama_log_set(_quiet, ffi.NULL)
    lib.llama_backend_init()
    params = lib.llama_model_default_params()
    params.n_gpu_layers = 999
    keep = None
    if args.endpoint != "local":
        from llama_cpp_py_sync.rpc import rpc_devices

        endpoints = [e.strip() for e in args.endpoint.split(",") if e.strip()]
        keep = ffi.new(
            "ggml_backend_dev_t[]", [*rpc_devices(endpoints, include_local=False), ffi.NULL]
        )
        params.devices = keep
    else:
        params.n_gpu_layers = 0
    keep_split = None
    if args.tensor_split:
        split = [float(x) for x in args.tensor_split.split(",")]
        n_max = max(int(lib.llama_max_devices()), len(split))
        keep_split = ffi.new("float[]", split + [0.0] * (n_max - len(split)))
        params.tensor_split = keep_split
    if args.split_mode is not None:
        params.split_mode = {"none": 0, "layer": 1, "row": 2, "tensor": 3}[args.split_mode]
    t0 = time.perf_counter()
    model = lib.llama_model_load_from_file(args.model.encode(), params)
    if model == ffi.NULL:
        raise RuntimeError("load failed")
    n_ctx = max(pp_sizes + [0]) + args.tg + 16 + args.depth
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = n_ctx
    batch = max(pp_sizes + [8] + ([256] if args.depth else []))
    cparams.n_batch = batch
    cparams.n_ubatch = batch
    cparams.n_seq_max = 1
    cparams.n_threads = args.threads
    cparams.n_threads_batch = args.threads
    cparams.flash_attn_type = args.flash_attn
    cparams.no_perf = True
    ctx = lib.llama_init_from_model(model, cparams)
    if ctx == ffi.NULL:
        raise RuntimeError("context failed")
    load_s = time.perf_counter() - t0
    n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model))
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

    result: dict = {"pp": {}, "load_s": round(load_s, 3)}
    for n in pp_sizes:
        lib.llama_memory_clear(mem, True)
        decode(tokens(n, 1), 0)  # warm-up: graphs built and cached on both sides
        lib.llama_memory_clear(mem, True)
        t0 = time.perf_counter()
        decode(tokens(n, 2), 0)
        result["pp"][str(n)] = round(n / (time.perf_counter() - t0), 3)
    if args.tg:
        lib.llama_memory_clear(mem, True)
        d = 0
        while d < args.depth:
            n = min(256, args.depth - d)
            decode(tokens(n, 5 + d), d)
            d += n
        decode(tokens(8, 3), d)
        decode([11], d + 8)  # warm-up of the single-token graph
        t0 = time.perf_counter()
        for i in range(args.tg):
            decode([(i * 31) % (n_vocab - 10) + 5], d + 9 + i)
        result["tg"] = round(args.tg / (time.perf_counter() - t0), 3)
    lib.llama_free(ctx)
    lib.llama_model_free(model)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
