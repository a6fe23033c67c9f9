"""Probe (runs under the reference env): llama-bench-like speeds of the REAL v8 client.

    engine_speed.py MODEL HOST:PORT [--pp 64,256] [--tg 32] [--depth 1536 --depth-fa 0,1]
                    [--threads 2] [--warm-prompt 8] [--barrier DIR --barrier-n N] [--no-plain]
                    [--reps 1] [--turns DIR --turn-id 0|1] [--fa 0|1|auto]

Every layer (and the output head) on the endpoint. Measurements, each on a cleared KV cache:
- ``pp N``: one batch of N tokens (logits for the last), timed after a warm-up batch of N;
- ``tg``: a warm-up prompt of ``--warm-prompt`` tokens and one warm-up token, then ``tg``
  single-token decodes; ``pp`` and ``tg`` share one context, flash attention ``--fa`` (default
  0: off; ``auto``: llama.cpp's choice);
- ``depth``: per flash-attention setting in ``--depth-fa``, a fresh context; a warm-up batch of
  one ubatch (512) is cleared, then a prompt of ``--depth`` tokens is timed (ubatches of 512),
  then one warm-up token and ``tg`` timed single-token decodes after it. KV cache f16.
With ``--reps R``, each ``pp`` and ``tg`` measurement runs R times (each on a cleared KV cache,
as llama-bench's repetitions; the decodes after ``--depth`` on the cache cut back to the
prompt) and the median is reported. With ``--barrier DIR``, the timed
decodes start only once ``--barrier-n`` probes have written their ready file into DIR (several
clients decoding at once). With ``--turns DIR``, two probes (``--turn-id`` 0 and 1, same
arguments, each on its own server) take turns: every timed step (one repetition, a model load, a
context) runs while the other probe waits, so the two servers are measured alternately seconds
apart and a drift of a shared host's speed hits both alike. Prints one JSON line:
{"load_s": s, "pp": {"64": tok/s}, "tg": tok/s, "depth": {"fa0": {"pp": tok/s, "tg": tok/s}}}
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "support" / "probes"))

import llama_api  # noqa: E402

UBATCH_DEPTH = 512
#: --fa: llama_flash_attn_type (LLAMA_FLASH_ATTN_TYPE_AUTO is -1)
FLASH_ATTN = {"auto": -1, "0": 0, "1": 1}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Turns:
    """Alternation with one other probe through the file DIR/turn (the id whose turn it is;
    absent: probe 0's). Both probes enter the same number of turns."""

    def __init__(self, directory: Path | None, me: int, timeout: float = 1800.0) -> None:
        self.path = None if directory is None else directory / "turn"
        self.me, self.timeout = me, timeout
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)

    def _holder(self) -> int:
        assert self.path is not None
        try:
            return int(self.path.read_text() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def __enter__(self) -> None:
        if self.path is None:
            return
        deadline = time.monotonic() + self.timeout
        while self._holder() != self.me:
            if time.monotonic() > deadline:
                raise TimeoutError(f"turns {self.path}: the other probe never passed the turn")
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(f".{self.me}")
        tmp.write_text(str(1 - self.me))
        tmp.replace(self.path)  # atomic: the other probe never reads a half-written file


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def main(argv: list[str]) -> int:
    parser = llama_api.client_parser()
    parser.add_argument("--pp", default="64,256")
    parser.add_argument("--tg", type=int, default=32)
    parser.add_argument("--depth", type=int, default=0)
    parser.add_argument("--depth-fa", default="0,1")
    parser.add_argument("--warm-prompt", type=int, default=8)
    parser.add_argument("--no-plain", action="store_true", help="only the --depth measurements")
    parser.add_argument("--reps", type=int, default=1, help="repetitions; the median is kept")
    parser.add_argument("--barrier", type=Path)
    parser.add_argument("--barrier-n", type=int, default=1)
    parser.add_argument("--turns", type=Path, help="take turns with another probe (see above)")
    parser.add_argument("--turn-id", type=int, choices=(0, 1), default=0)
    parser.add_argument("--fa", choices=sorted(FLASH_ATTN), default="0", help="pp/tg's context")
    args = parser.parse_args(argv)
    turn = Turns(args.turns, args.turn_id)
    pp_sizes = _ints(args.pp)
    reps = max(args.reps, 1)

    ffi, lib = llama_api.open_llama()
    params, _ = llama_api.model_params(ffi, lib, args.endpoint)
    with turn:
        t0 = time.perf_counter()
        model = llama_api.load_model(ffi, lib, args.model, params)
    vocab = llama_api.n_vocab(lib, model)

    def context(n_ctx: int, n_batch: int, n_ubatch: int, flash_attn: int):
        return llama_api.new_context(
            ffi, lib, model, n_ctx, n_batch, n_ubatch, args.threads, flash_attn
        )

    decode = functools.partial(llama_api.decode, lib)
    tokens = functools.partial(llama_api.prompt, vocab)

    def timed_decodes(ctx, pos0: int, barrier: bool) -> float:
        decode(ctx, [11], pos0)  # warm-up of the single-token graph at this depth
        if barrier and args.barrier is not None:
            llama_api.wait_barrier(args.barrier, args.barrier_n, timeout=900.0, poll=0.01)
        t0 = time.perf_counter()
        for i in range(args.tg):
            decode(ctx, [llama_api.step_token(vocab, i)], pos0 + 1 + i)
        return args.tg / (time.perf_counter() - t0)

    result: dict = {"pp": {}, "depth": {}}
    if not args.no_plain and (pp_sizes or args.tg):
        warm = max(args.warm_prompt, 1)
        with turn:
            ctx = context(
                max(pp_sizes + [warm]) + args.tg + 16,
                max(pp_sizes + [warm]),
                max(pp_sizes + [warm]),
                FLASH_ATTN[args.fa],
            )
            result["load_s"] = round(time.perf_counter() - t0, 3)
        mem = lib.llama_get_memory(ctx)
        for n in pp_sizes:
            speeds = []
            for rep in range(reps):
                with turn:
                    if rep == 0:  # warm-up: graphs built and cached on both sides
                        lib.llama_memory_clear(mem, True)
                        decode(ctx, tokens(n, 1), 0)
                    lib.llama_memory_clear(mem, True)
                    t1 = time.perf_counter()
                    decode(ctx, tokens(n, 2), 0)
                    speeds.append(n / (time.perf_counter() - t1))
            result["pp"][str(n)] = round(_median(speeds), 3)
        if args.tg:
            speeds = []
            for rep in range(reps):
                with turn:
                    lib.llama_memory_clear(mem, True)
                    decode(ctx, tokens(warm, 3), 0)
                    speeds.append(timed_decodes(ctx, warm, barrier=rep == 0))
            result["tg"] = round(_median(speeds), 3)
        with turn:
            lib.llama_free(ctx)
    if args.depth:
        for fa in _ints(args.depth_fa):
            with turn:
                ctx = context(args.depth + args.tg + 16, args.depth, UBATCH_DEPTH, fa)
                mem = lib.llama_get_memory(ctx)
                decode(ctx, tokens(min(UBATCH_DEPTH, args.depth), 4), 0)
                lib.llama_memory_clear(mem, True)
                t1 = time.perf_counter()
                decode(ctx, tokens(args.depth, 5), 0)
                depth_pp = round(args.depth / (time.perf_counter() - t1), 3)
            entry = {"pp": depth_pp}
            if args.tg:
                speeds = []
                for rep in range(reps):
                    with turn:
                        if rep:  # back to the prompt alone: every repetition decodes at this depth
                            lib.llama_memory_seq_rm(mem, 0, args.depth, -1)
                        speeds.append(timed_decodes(ctx, args.depth, barrier=False))
                entry["tg"] = round(_median(speeds), 3)
            result["depth"][f"fa{fa}"] = entry
            with turn:
                lib.llama_free(ctx)
    result.setdefault("load_s", round(time.perf_counter() - t0, 3))
    with turn:
        lib.llama_model_free(model)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
