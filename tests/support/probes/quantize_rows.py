"""Probe: quantize float32 matrices with the REAL ggml quantizer (``ggml_quantize_chunk``).

Runs under the reference env::

    run_probe("v8", "quantize_rows", in_npz, out_npz)

``in_npz`` holds float32 2-D arrays named ``t<ggml type id>_<anything>``; ``out_npz`` gets the
same names with uint8 arrays (rows, row bytes): what llama.cpp's quantizer writes for each row
(no importance matrix). Prints one JSON line ``{"arrays": N}``.
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import llama_cpp_py_sync
import numpy as np


def main(argv: list[str]) -> int:
    src, dst = argv
    lib = ctypes.CDLL(str(Path(llama_cpp_py_sync.__file__).parent / "libggml-base.so.0"))
    lib.ggml_quantize_init.argtypes = [ctypes.c_int]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_void_p,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_int64,
        ctypes.c_void_p,
    ]
    lib.ggml_row_size.restype = ctypes.c_size_t
    lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
    out = {}
    with np.load(src) as arrays:
        for name in arrays.files:
            type_id = int(name[1:].split("_")[0])
            x = np.ascontiguousarray(arrays[name], dtype=np.float32)
            rows, k = x.shape
            row_bytes = lib.ggml_row_size(type_id, k)
            buf = np.zeros((rows, row_bytes), np.uint8)
            lib.ggml_quantize_init(type_id)
            done = lib.ggml_quantize_chunk(
                type_id, x.ctypes.data, buf.ctypes.data, 0, rows, k, None
            )
            if done != rows * row_bytes:
                raise SystemExit(f"{name}: quantizer wrote {done} of {rows * row_bytes} bytes")
            out[name] = buf
    np.savez(dst, **out)
    print(json.dumps({"arrays": len(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
