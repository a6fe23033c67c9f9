"""What the probes share (runs under the reference env): the REAL llama.cpp C API through the
wheel's cffi binding, set up the same way by every probe.

A probe script imports it as a sibling module (its own directory is first on ``sys.path``);
``bench/probes`` scripts put ``tests/support/probes`` there first. ``ffi.new`` arrays that the
library keeps pointers to, and the log callback, are held in ``_KEEP`` for the process's life.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}  # enum llama_split_mode

_KEEP: list[Any] = []


def client_parser() -> argparse.ArgumentParser:
    """The arguments every client probe of one model and endpoint takes: MODEL HOST:PORT and
    ``--threads`` (the client's CPU threads)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("endpoint")
    parser.add_argument("--threads", type=int, default=2)
    return parser


def open_llama(verbose: bool = False) -> tuple[Any, Any]:
    """(ffi, lib) with the backends initialised; llama.cpp's log reduced to errors unless
    ``verbose``."""
    from llama_cpp_py_sync._cffi_bindings import get_ffi, get_lib

    ffi, lib = get_ffi(), get_lib()
    if not verbose:

        @ffi.callback("void(enum ggml_log_level, const char *, void *)")
        def _quiet(level, text, user_data):  # keep errors (level 4) visible
            if level >= 4:
                sys.stderr.write(ffi.string(text).decode("utf-8", "replace"))

        _KEEP.append(_quiet)
        lib.llama_log_set(_quiet, ffi.NULL)
    lib.llama_backend_init()
    return ffi, lib


def model_params(ffi: Any, lib: Any, endpoint: str, n_gpu_layers: int = 999) -> tuple[Any, int]:
    """(llama_model_params, number of RPC devices): ``n_gpu_layers`` on the RPC servers of
    ``endpoint`` (HOST:PORT, several comma-separated, or "local": no device given)."""
    params = lib.llama_model_default_params()
    params.n_gpu_layers = n_gpu_layers
    if endpoint == "local":
        return params, 0
    from llama_cpp_py_sync.rpc import rpc_devices

    endpoints = [e.strip() for e in endpoint.split(",") if e.strip()]
    devices = rpc_devices(endpoints, include_local=False)
    _KEEP.append(ffi.new("ggml_backend_dev_t[]", [*devices, ffi.NULL]))
    params.devices = _KEEP[-1]
    return params, len(devices)


def split_model(
    ffi: Any, lib: Any, params: Any, tensor_split: str | None, mode: str | None
) -> None:
    """How the model is placed across several devices: ``tensor_split`` proportions ("1,1")
    and the split ``mode`` (a :data:`SPLIT_MODES` name), each when given."""
    if tensor_split:
        split = [float(x) for x in tensor_split.split(",")]
        n_max = max(int(lib.llama_max_devices()), len(split))
        _KEEP.append(ffi.new("float[]", split + [0.0] * (n_max - len(split))))
        params.tensor_split = _KEEP[-1]
    if mode is not None:
        params.split_mode = SPLIT_MODES[mode]


def load_model(ffi: Any, lib: Any, path: str, params: Any) -> Any:
    model = lib.llama_model_load_from_file(path.encode(), params)
    if model == ffi.NULL:
        raise RuntimeError(f"failed to load {path}")
    return model


def n_vocab(lib: Any, model: Any) -> int:
    return int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model)))


def new_context(
    ffi: Any,
    lib: Any,
    model: Any,
    n_ctx: int,
    n_batch: int,
    n_ubatch: int,
    threads: int,
    flash_attn: int = 0,
    **fields: Any,
) -> Any:
    """A context for one sequence, no perf counters; ``fields`` set further
    llama_context_params fields by name."""
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_batch = n_batch
    cparams.n_ubatch = n_ubatch
    cparams.n_seq_max = 1
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.flash_attn_type = flash_attn
    cparams.no_perf = True
    for name, value in fields.items():
        setattr(cparams, name, value)
    ctx = lib.llama_init_from_model(model, cparams)
    if ctx == ffi.NULL:
        raise RuntimeError("failed to create the llama context")
    return ctx


def decode(lib: Any, ctx: Any, tokens: list[int], pos0: int, all_logits: bool = False) -> None:
    """One ``llama_decode`` of ``tokens`` at positions ``pos0``...; logits for the last token
    (read back, which waits for the result) or, with ``all_logits``, for every token (left for
    the caller to read)."""
    batch = lib.llama_batch_init(len(tokens), 0, 1)
    try:
        batch.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 1 if all_logits or i == len(tokens) - 1 else 0
        rc = lib.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        if not all_logits:
            lib.llama_get_logits_ith(ctx, -1)
    finally:
        lib.llama_batch_free(batch)


def prompt(vocab: int, n: int, seed: int) -> list[int]:
    """``n`` deterministic token ids spread over the vocabulary (none of the first 5)."""
    return [(seed * 7919 + i * 104729) % (vocab - 10) + 5 for i in range(n)]


def step_token(vocab: int, i: int) -> int:
    """The token of the ``i``-th single-token decode."""
    return (i * 31) % (vocab - 10) + 5


def wait_barrier(directory: str | os.PathLike[str], n: int, timeout: float, poll: float) -> None:
    """Write this probe's ready file into ``directory``, then wait until ``n`` probes have
    (clients that start together)."""
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, f"ready-{os.getpid()}"), "w").close()
    deadline = time.monotonic() + timeout
    while sum(name.startswith("ready-") for name in os.listdir(directory)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {directory}: fewer than {n} probes ready")
        time.sleep(poll)
