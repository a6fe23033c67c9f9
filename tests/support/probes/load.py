"""Probe: time the REAL llama.cpp client loading a model with every layer on an RPC server.

    load.py MODEL HOST:PORT

Only `llama_model_load_from_file` is timed: weights are uploaded (SET_TENSOR, or SET_TENSOR_HASH
for tensors over 10 MiB when the server has a cache). Prints {"load_s": ..., "endpoint": ...}.
"""

from __future__ import annotations

import json
import sys
import time

import llama_api


def main(model_path: str, endpoint: str) -> int:
    ffi, lib = llama_api.open_llama()
    params, _ = llama_api.model_params(ffi, lib, endpoint)
    t0 = time.perf_counter()
    model = llama_api.load_model(ffi, lib, model_path, params)
    elapsed = time.perf_counter() - t0
    lib.llama_model_free(model)
    print(json.dumps({"load_s": round(elapsed, 4), "endpoint": endpoint}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
