"""Probe: time the REAL llama.cpp client loading a model with every layer on an RPC server.

    load.py MODEL HOST:PORT

Only `llama_model_load_from_file` is timed: weights are uploaded (SET_TENSOR, or SET_TENSOR_HASH
for tensors over 10 MiB when the server has a cache). Prints {"load_s": ..., "endpoint": ...}.
"""

from __future__ import annotations

import json
import sys
import time


def main(model_path: str, endpoint: str) -> int:
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
    devices = ffi.new(
        "ggml_backend_dev_t[]", [*rpc_devices([endpoint], include_local=False), ffi.NULL]
    )
    params.devices = devices
    t0 = time.perf_counter()
    model = lib.llama_model_load_from_file(model_path.encode(), params)
    elapsed = time.perf_counter() - t0
    if model == ffi.NULL:
        raise RuntimeError(f"failed to load {model_path}")
    lib.llama_model_free(model)
    print(json.dumps({"load_s": round(elapsed, 4), "endpoint": endpoint}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
