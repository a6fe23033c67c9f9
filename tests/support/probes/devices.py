"""Probe: enumerate the devices of RPC servers with the REAL llama.cpp RPC client.

Runs under the reference env (``run_probe("v8", "devices", "127.0.0.1:50052")``):

    devices.py HOST:PORT [HOST:PORT ...]

Prints one JSON line::

    {"client_protocol": "8.0.0", "servers": [{"endpoint": ..., "devices": [...]}],
     "devices": [{"endpoint", "index", "name", "description", "type", "free", "total",
                  "rpc_free", "rpc_total", "buffer_type", "alignment", "max_size"}]}

``free/total`` come from ``ggml_backend_dev_memory`` on the registered RPC device,
``rpc_free/rpc_total`` from ``ggml_backend_rpc_get_device_memory`` (a GET_DEVICE_MEMORY
request), ``alignment``/``max_size`` from the device's buffer type (GET_ALIGNMENT /
GET_MAX_SIZE). A protocol-version mismatch makes the native client abort the process
(SIGABRT, "RPC server version mismatch" on stderr); the caller sees a non-zero exit.

The ggml C API is declared here with a private cffi FFI (same ABI in v7 and v8), so the probe
does not depend on which functions the wheel's own bindings happen to declare.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.util import find_spec

import cffi

CDEF = """
typedef void * ggml_backend_reg_t;
typedef void * ggml_backend_dev_t;
typedef void * ggml_backend_buffer_type_t;
ggml_backend_reg_t ggml_backend_rpc_add_server(const char * endpoint);
void ggml_backend_rpc_get_device_memory(const char * endpoint, uint32_t device,
                                        size_t * free, size_t * total);
const char *       ggml_backend_reg_name(ggml_backend_reg_t reg);
size_t             ggml_backend_reg_dev_count(ggml_backend_reg_t reg);
ggml_backend_dev_t ggml_backend_reg_dev_get(ggml_backend_reg_t reg, size_t index);
const char * ggml_backend_dev_name(ggml_backend_dev_t device);
const char * ggml_backend_dev_description(ggml_backend_dev_t device);
void         ggml_backend_dev_memory(ggml_backend_dev_t device, size_t * free, size_t * total);
int          ggml_backend_dev_type(ggml_backend_dev_t device);
ggml_backend_buffer_type_t ggml_backend_dev_buffer_type(ggml_backend_dev_t device);
const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
size_t       ggml_backend_buft_get_alignment(ggml_backend_buffer_type_t buft);
size_t       ggml_backend_buft_get_max_size(ggml_backend_buffer_type_t buft);
"""
DEVICE_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL", 4: "META"}


def load_libs() -> tuple[cffi.FFI, object, object]:
    """dlopen the wheel's libggml-base and libggml-rpc (RUNPATH=$ORIGIN resolves the rest)."""
    spec = find_spec("llama_cpp_py_sync")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("llama_cpp_py_sync is not importable (PYTHONPATH?)")
    pkg = list(spec.submodule_search_locations)[0]
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    base = ffi.dlopen(os.path.join(pkg, "libggml-base.so.0"))
    rpc = ffi.dlopen(os.path.join(pkg, "libggml-rpc.so.0"))
    return ffi, base, rpc


def client_protocol() -> str:
    from llama_cpp_py_sync._cffi_bindings import get_rpc_lib

    lib = get_rpc_lib()
    major, minor = lib.RPC_PROTO_MAJOR_VERSION, lib.RPC_PROTO_MINOR_VERSION
    return f"{major}.{minor}.{lib.RPC_PROTO_PATCH_VERSION}"


def text(ffi: cffi.FFI, ptr: object) -> str | None:
    return None if ptr == ffi.NULL else ffi.string(ptr).decode("utf-8", "replace")


def main(endpoints: list[str]) -> int:
    if not endpoints:
        print("usage: devices.py HOST:PORT [HOST:PORT ...]", file=sys.stderr)
        return 2
    ffi, base, rpc = load_libs()
    result: dict = {"client_protocol": client_protocol(), "servers": [], "devices": []}
    free = ffi.new("size_t *")
    total = ffi.new("size_t *")
    for endpoint in endpoints:
        # Connects, does HELLO (aborts on version mismatch), asks the device count.
        reg = rpc.ggml_backend_rpc_add_server(endpoint.encode("ascii"))
        if reg == ffi.NULL:
            raise RuntimeError(f"ggml_backend_rpc_add_server({endpoint}) returned NULL")
        server = {
            "endpoint": endpoint,
            "reg_name": text(ffi, base.ggml_backend_reg_name(reg)),
            "devices": [],
        }
        for index in range(base.ggml_backend_reg_dev_count(reg)):
            dev = base.ggml_backend_reg_dev_get(reg, index)
            base.ggml_backend_dev_memory(dev, free, total)
            info = {
                "endpoint": endpoint,
                "index": index,
                "name": text(ffi, base.ggml_backend_dev_name(dev)),
                "description": text(ffi, base.ggml_backend_dev_description(dev)),
                "type": DEVICE_TYPES.get(base.ggml_backend_dev_type(dev), "?"),
                "free": int(free[0]),
                "total": int(total[0]),
            }
            rpc.ggml_backend_rpc_get_device_memory(endpoint.encode("ascii"), index, free, total)
            info["rpc_free"], info["rpc_total"] = int(free[0]), int(total[0])
            buft = base.ggml_backend_dev_buffer_type(dev)
            info["buffer_type"] = text(ffi, base.ggml_backend_buft_name(buft))
            info["alignment"] = int(base.ggml_backend_buft_get_alignment(buft))
            info["max_size"] = int(base.ggml_backend_buft_get_max_size(buft))
            server["devices"].append(info)
            result["devices"].append(info)
        result["servers"].append(server)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
