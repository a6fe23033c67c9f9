"""Reference rpc server: REAL llama.cpp ``ggml_backend_rpc_start_server`` from the wheel.

Runs under the reference env (see tests/support/refenv.py, ``start_reference_server``):

    rpc_server.py HOST:PORT [--threads N] [--devices CPU[,DEV...]] [--cache-dir DIR]

Equivalent to llama.cpp's ``rpc-server -H HOST -p PORT -t N -d DEVICES [-c]`` except that the cache
directory is given explicitly. The wheel's ``llama_cpp_py_sync.rpc.start_rpc_server`` always
passes ``cache_dir=NULL``, so the native function is called directly through the wheel's cffi
binding:

    void ggml_backend_rpc_start_server(const char * endpoint, const char * cache_dir,
                                       size_t n_threads, size_t n_devices,
                                       ggml_backend_dev_t * devices);

It blocks forever (serving one client at a time). A watchdog thread exits the process when its
parent dies, so a crashed test run leaves no server behind.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time


def _watch_parent(parent: int) -> None:
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.5)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoint", help="HOST:PORT to listen on (IPv4 literal)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--devices", default="CPU", help="comma-separated ggml device names")
    parser.add_argument("--cache-dir", default=None, help="enable the hash cache in this dir")
    args = parser.parse_args()

    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()

    from llama_cpp_py_sync._cffi_bindings import (
        get_backend_lib,
        get_ffi,
        get_lib,
        get_rpc_lib,
    )

    ffi = get_ffi()
    core = get_lib()
    if not core.llama_supports_rpc():
        print("native library built without RPC support", file=sys.stderr)
        return 2
    core.llama_backend_init()  # registers the CPU backend
    backend = get_backend_lib()
    rpc = get_rpc_lib()

    names = [name for name in args.devices.split(",") if name]
    handles = [backend.ggml_backend_dev_by_name(name.encode()) for name in names]
    if not handles or any(handle == ffi.NULL for handle in handles):
        print(f"unknown device in {names}", file=sys.stderr)
        return 2
    cache = ffi.NULL
    if args.cache_dir:
        os.makedirs(args.cache_dir, exist_ok=True)
        cache = os.fsencode(args.cache_dir)
    # cffi releases the GIL during the call, so the watchdog thread keeps running.
    rpc.ggml_backend_rpc_start_server(
        args.endpoint.encode("ascii"),
        cache,
        args.threads,
        len(handles),
        ffi.new("ggml_backend_dev_t[]", handles),
    )
    print("ggml_backend_rpc_start_server returned (bind failed?)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
