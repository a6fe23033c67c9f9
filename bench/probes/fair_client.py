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

import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support" / "probes"))

import llama_api  # noqa: E402


def _wait_for(path: Path | None, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while path is not None and not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.002)


def main(argv: list[str]) -> int:
    parser = llama_api.client_parser()
    parser.add_argument("--mode", choices=("decode", "prefill"), required=True)
    parser.add_argument("--tg", type=int, default=64)
    parser.add_argument("--pp", type=int, default=512)
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--ready", type=Path)
    parser.add_argument("--start", type=Path)
    parser.add_argument("--stop", type=Path)
    args = parser.parse_args(argv)

    ffi, lib = llama_api.open_llama()
    params, _ = llama_api.model_params(ffi, lib, args.endpoint)
    model = llama_api.load_model(ffi, lib, args.model, params)
    vocab = llama_api.n_vocab(lib, model)
    n_ctx = max(args.pp, 8 + args.tg) + 16
    ctx = llama_api.new_context(ffi, lib, model, n_ctx, n_ctx, n_ctx, args.threads)
    mem = lib.llama_get_memory(ctx)

    decode = functools.partial(llama_api.decode, lib, ctx)
    tokens = functools.partial(llama_api.prompt, vocab)

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
            decode([llama_api.step_token(vocab, i)], 8 + i)
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
