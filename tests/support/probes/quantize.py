"""Probe: quantize a GGUF with the REAL llama.cpp quantizer (``llama_model_quantize``).

Runs under the reference env::

    run_probe("v8", "quantize", "--model", f32_gguf, "--out", q_gguf, "--type", "Q4_K_M")

``--type`` is a ``llama_ftype`` name without the ``LLAMA_FTYPE_MOSTLY_`` prefix, case-insensitive
(``q8_0``, ``q4_0``, ``Q4_K_M``, ``Q5_K_M``, ``Q6_K``, ``IQ4_XS``, ``f16``, ``bf16``, ...). The
parameters are ``llama_model_quantize_default_params()`` (the same as ``llama-quantize`` without
options: output/token-embedding types chosen by llama.cpp's mixing rules, no imatrix) except
``nthread`` and the optional ``--pure`` / ``--output-type`` / ``--token-embd-type`` overrides.
IQ4_XS (like Q4_K/Q5_K/Q6_K) does not need an importance matrix; only the 1-3 bit IQ types do.

Tensors whose rows do not divide into the type's block size (256 for K- and IQ4_XS quants) get
a fallback type chosen by llama.cpp (e.g. q5_0/q8_0/IQ4_NL), so use n_embd/n_ff multiples of 256
when a test wants the requested type to really appear. Check the result with gguf.GGUFReader.

Prints one JSON line: ``{"out", "ftype", "ftype_name", "rc", "seconds", "size"}``; exits 1 when
the library returns non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import llama_api

# ggml_type ids for the optional per-tensor overrides
GGML_TYPES = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "q2_k": 10,
    "q3_k": 11,
    "q4_k": 12,
    "q5_k": 13,
    "q6_k": 14,
    "iq4_nl": 20,
    "iq4_xs": 23,
    "bf16": 30,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="quantize a GGUF with llama_model_quantize")
    parser.add_argument("--model", required=True, help="input GGUF (f32/f16/bf16)")
    parser.add_argument("--out", required=True, help="output GGUF")
    parser.add_argument("--type", required=True, help="llama_ftype name, e.g. Q4_K_M, q8_0")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pure", action="store_true", help="no k-quant mixtures")
    parser.add_argument("--output-type", choices=sorted(GGML_TYPES), default=None)
    parser.add_argument("--token-embd-type", choices=sorted(GGML_TYPES), default=None)
    parser.add_argument("--verbose", action="store_true", help="keep llama.cpp's log output")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    ffi, lib = llama_api.open_llama(verbose=args.verbose)

    name = args.type.upper()
    if name in ("F32", "ALL_F32"):
        ftype = lib.LLAMA_FTYPE_ALL_F32
    else:
        attr = "LLAMA_FTYPE_MOSTLY_" + name
        if not hasattr(lib, attr):
            raise SystemExit(f"unknown ftype {args.type!r}")
        ftype = getattr(lib, attr)

    params = ffi.new("llama_model_quantize_params *", lib.llama_model_quantize_default_params())
    params.nthread = args.threads
    params.ftype = ftype
    params.pure = bool(args.pure)
    if args.output_type:
        params.output_tensor_type = GGML_TYPES[args.output_type]
    if args.token_embd_type:
        params.token_embedding_type = GGML_TYPES[args.token_embd_type]

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    t0 = time.perf_counter()
    rc = lib.llama_model_quantize(args.model.encode(), args.out.encode(), params)
    seconds = time.perf_counter() - t0
    result = {
        "out": args.out,
        "ftype": int(ftype),
        "ftype_name": ffi.string(lib.llama_ftype_name(ftype)).decode(),
        "rc": int(rc),
        "seconds": round(seconds, 4),
        "size": os.path.getsize(args.out) if rc == 0 and os.path.exists(args.out) else 0,
    }
    print(json.dumps(result), flush=True)
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
