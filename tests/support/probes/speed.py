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

import functools
import json
import sys
import time

import llama_api


def main(argv: list[str]) -> int:
    parser = llama_api.client_parser()
    parser.add_argument("--pp", default="64")
    parser.add_argument("--tg", type=int, default=32)
    parser.add_argument("--flash-attn", type=int, default=0)
    parser.add_argument("--depth", type=int, default=0, help="KV positions filled before tg")
    parser.add_argument("--split-mode", choices=tuple(llama_api.SPLIT_MODES), default=None)
    parser.add_argument("--tensor-split", default=None, help="per-device proportions, e.g. 1,1")
    args = parser.parse_args(argv)
    pp_sizes = [int(x) for x in args.pp.split(",") if x]

    ffi, lib = llama_api.open_llama()
    n_gpu_layers = 0 if args.endpoint == "local" else 999
    params, _ = llama_api.model_params(ffi, lib, args.endpoint, n_gpu_layers)
    llama_api.split_model(ffi, lib, params, args.tensor_split, args.split_mode)
    t0 = time.perf_counter()
    model = llama_api.load_model(ffi, lib, args.model, params)
    batch = max(pp_sizes + [8] + ([256] if args.depth else []))
    n_ctx = max(pp_sizes + [0]) + args.tg + 16 + args.depth
    ctx = llama_api.new_context(ffi, lib, model, n_ctx, batch, batch, args.threads, args.flash_attn)
    load_s = time.perf_counter() - t0
    vocab = llama_api.n_vocab(lib, model)
    mem = lib.llama_get_memory(ctx)

    decode = functools.partial(llama_api.decode, lib, ctx)
    tokens = functools.partial(llama_api.prompt, vocab)

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
            decode([llama_api.step_token(vocab, i)], d + 9 + i)
        result["tg"] = round(args.tg / (time.perf_counter() - t0), 3)
    lib.llama_free(ctx)
    lib.llama_model_free(model)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
