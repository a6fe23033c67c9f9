"""Probe: teacher-forced logits from the REAL llama.cpp, with every layer on an RPC server.

Runs under the reference env::

    run_probe("v8", "generate", "--model", gguf, "--endpoint", "127.0.0.1:50052",
              "--tokens", "1,5,9,300", "--out", out_dir)

``--endpoint local`` runs the same evaluation on the local CPU backend (the baseline to compare
against). ``--barrier DIR --barrier-n N``: start evaluating only when N probes are ready
(clients that share a server at once). ``--endpoint A,B`` uses several RPC servers at once (one
device each, layers split between them by their free memory, or by ``--tensor-split 1,1``;
``--split-mode tensor`` splits every weight across two servers instead, which needs
``--flash-attn 1``). The model is loaded with
``n_gpu_layers`` (default 999: all layers and the output head) on the RPC device(s); the KV
cache follows (``offload_kqv``). Tokens are evaluated teacher-forced, logits requested for every
position: the first ``--prefill`` tokens (default: all) as one ``llama_decode`` batch, the
remaining ones one token per ``llama_decode`` (the decode path, which reuses graphs:
GRAPH_RECOMPUTE). ``--n-ubatch`` splits batches into micro-batches.

Writes ``<out>/logits.npy`` (float32, shape ``[n_tokens, n_vocab]``) and prints one JSON line::

    {"logits_path", "n_tokens", "n_vocab", "argmax": [...], "client_protocol", "endpoint",
     "device", "load_s", "eval_s"}

``--pooling mean|cls|last|none`` runs the model as an embedding model instead (context
``embeddings = true``, that pooling type; all tokens must fit in one micro-batch): the file then
holds the pooled sequence embedding, float32 ``[1, n_embd]`` (``none``: the per-token
embeddings, ``[n_tokens, n_embd]``), ``"kind": "embeddings"`` and ``"n_embd"`` are added to the
JSON and ``argmax`` is the argmax of each row.

The llama C API is called through the wheel's cffi binding (``llama_model_load_from_file``,
``llama_init_from_model``, ``llama_batch_init``, ``llama_decode``, ``llama_get_logits``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import llama_api
import numpy as np

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="teacher-forced logits via llama.cpp")
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--endpoint", default="local", help='HOST:PORT, several comma-separated, or "local"'
    )
    parser.add_argument("--tokens", required=True, help="comma-separated token ids")
    parser.add_argument("--out", required=True, help="directory for logits.npy")
    parser.add_argument("--n-gpu-layers", type=int, default=999)
    parser.add_argument("--flash-attn", type=int, default=0, help="-1 auto, 0 off, 1 on")
    parser.add_argument("--n-ctx", type=int, default=0, help="0: max(256, n_tokens)")
    parser.add_argument("--n-batch", type=int, default=0, help="0: max(n_ctx, n_tokens)")
    parser.add_argument("--n-ubatch", type=int, default=0, help="0: n_batch")
    parser.add_argument("--prefill", type=int, default=-1, help="tokens in the first batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--type-k", choices=sorted(GGML_TYPES), default=None)
    parser.add_argument("--type-v", choices=sorted(GGML_TYPES), default=None)
    parser.add_argument("--no-offload-kqv", action="store_true")
    parser.add_argument("--tensor-split", default=None, help="per-device proportions, e.g. 1,1")
    parser.add_argument(
        "--split-mode",
        choices=sorted(llama_api.SPLIT_MODES),
        default=None,
        help="llama_model_params.split_mode (default: the library's, layer); tensor needs FA on",
    )
    parser.add_argument(
        "--pooling", choices=sorted(POOLING), default=None, help="embeddings instead of logits"
    )
    parser.add_argument(
        "--barrier",
        default=None,
        help="directory: evaluate only once --barrier-n probes have written a ready file there",
    )
    parser.add_argument("--barrier-n", type=int, default=1)
    parser.add_argument("--verbose", action="store_true", help="keep llama.cpp's log output")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
    if not tokens:
        raise SystemExit("no tokens")

    from llama_cpp_py_sync._cffi_bindings import get_rpc_lib

    ffi, lib = llama_api.open_llama(verbose=args.verbose)
    rpc = get_rpc_lib()
    model_params, n_devices = llama_api.model_params(ffi, lib, args.endpoint, args.n_gpu_layers)
    llama_api.split_model(ffi, lib, model_params, args.tensor_split, args.split_mode)
    device_name = f"RPC x{n_devices}" if args.endpoint != "local" else "CPU"

    t0 = time.perf_counter()
    model = llama_api.load_model(ffi, lib, args.model, model_params)
    n_ctx = args.n_ctx or max(256, len(tokens))
    n_batch = args.n_batch or max(n_ctx, len(tokens))
    fields: dict = {"embeddings": args.pooling is not None, "offload_kqv": not args.no_offload_kqv}
    if args.pooling is not None:
        fields["pooling_type"] = POOLING[args.pooling]
    if args.type_k:
        fields["type_k"] = GGML_TYPES[args.type_k]
    if args.type_v:
        fields["type_v"] = GGML_TYPES[args.type_v]
    ctx = llama_api.new_context(
        ffi,
        lib,
        model,
        n_ctx,
        n_batch,
        args.n_ubatch or n_batch,
        args.threads,
        args.flash_attn,
        **fields,
    )
    load_s = time.perf_counter() - t0

    n_vocab = llama_api.n_vocab(lib, model)
    n_embd = lib.llama_model_n_embd(model)
    prefill = len(tokens) if args.prefill < 0 else min(args.prefill, len(tokens))
    chunks = [tokens[:prefill]] if prefill else []
    chunks += [[t] for t in tokens[prefill:]]
    rows = []
    if args.barrier:
        llama_api.wait_barrier(args.barrier, args.barrier_n, timeout=120.0, poll=0.005)
    t0 = time.perf_counter()
    pos = 0
    for chunk in chunks:
        llama_api.decode(lib, ctx, chunk, pos, all_logits=True)
        if args.pooling is None:
            ptr = lib.llama_get_logits(ctx)
            shape = (len(chunk), n_vocab)
        elif args.pooling == "none":
            ptr = lib.llama_get_embeddings(ctx)
            shape = (len(chunk), n_embd)
        else:
            ptr = lib.llama_get_embeddings_seq(ctx, 0)
            shape = (1, n_embd)
        if ptr == ffi.NULL:
            raise RuntimeError("llama.cpp returned no output")
        data = np.frombuffer(ffi.buffer(ptr, 4 * shape[0] * shape[1]), dtype=np.float32)
        rows.append(data.reshape(shape).copy())
        pos += len(chunk)
    eval_s = time.perf_counter() - t0
    logits = np.concatenate(rows)

    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "logits.npy")
    np.save(out_path, logits)
    lib.llama_free(ctx)
    lib.llama_model_free(model)
    result = {
        "logits_path": out_path,
        "n_tokens": len(tokens),
        "n_vocab": int(n_vocab),
        "argmax": [int(i) for i in logits.argmax(axis=1)],
        "finite": bool(np.isfinite(logits).all()),
        "client_protocol": f"{rpc.RPC_PROTO_MAJOR_VERSION}.{rpc.RPC_PROTO_MINOR_VERSION}."
        f"{rpc.RPC_PROTO_PATCH_VERSION}",
        "endpoint": args.endpoint,
        "device": device_name,
        "split_mode": args.split_mode or "default",
        "load_s": round(load_s, 4),
        "eval_s": round(eval_s, 4),
    }
    if args.pooling is not None:
        result.update(kind="embeddings", n_embd=int(n_embd), pooling=args.pooling)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
