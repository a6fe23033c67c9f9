"""The CUDA kernels' block math (compute/cuda/src/blocks.cuh), built for the host with g++.

The same header the kernels include is compiled into a small shared library
(tests/support/cuda_blockmath_harness.cpp) and checked on weights made by the REAL llama.cpp
quantizer (``llama_model_quantize --pure``, one model per type) against independent oracles:
``gguf.quants.dequantize`` for every weight type, a NumPy q8_1 quantizer written from ggml's
reference definition, and float64 dot products of the dequantized values.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.cuda_quant import (
    FLOAT_TYPES,
    FTYPES,
    QUANT_TYPES,
    dequant_q8_1,
    q8_1_oracle,
    real_quantized_rows,
)

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "python" / "rpcnet" / "compute" / "cuda" / "src"
HARNESS = ROOT / "tests" / "support" / "cuda_blockmath_harness.cpp"


@pytest.fixture(scope="session")
def lib(tmp_path_factory) -> ctypes.CDLL:
    gxx = shutil.which("g++")
    assert gxx, "g++ is required for the CUDA block-math tests (apt-get install g++)"
    out = tmp_path_factory.mktemp("cuda_host") / "blockmath.so"
    cmd = [
        gxx,
        "-O2",
        "-std=c++14",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-shared",
        "-fPIC",
        f"-I{SRC}",
        str(HARNESS),
        "-o",
        str(out),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    so = ctypes.CDLL(str(out))
    u8p, f32p = ctypes.POINTER(ctypes.c_uint8), ctypes.POINTER(ctypes.c_float)
    so.rpc_block_bytes.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    so.rpc_dequantize.argtypes = [ctypes.c_int, u8p, f32p, ctypes.c_int64]
    so.rpc_quantize_q8_1.argtypes = [f32p, u8p, ctypes.c_int64]
    so.rpc_quantize_q8_1.restype = None
    so.rpc_dot_q8_1.argtypes = [ctypes.c_int, u8p, u8p, ctypes.c_int64, f32p]
    so.rpc_host_float_to_half.argtypes = [ctypes.c_float]
    so.rpc_host_float_to_half.restype = ctypes.c_uint16
    so.rpc_host_half_to_float.argtypes = [ctypes.c_uint16]
    so.rpc_host_half_to_float.restype = ctypes.c_float
    so.rpc_host_float_to_bf16.argtypes = [ctypes.c_float]
    so.rpc_host_float_to_bf16.restype = ctypes.c_uint16
    so.rpc_host_dp4a.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    so.rpc_host_prmt.argtypes = [ctypes.c_uint32] * 3
    so.rpc_host_prmt.restype = ctypes.c_uint32
    return so


def _u8(a: np.ndarray):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


def _f32(a: np.ndarray):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


@pytest.fixture(scope="session")
def real_tensors(tmp_path_factory):
    return real_quantized_rows(tmp_path_factory)


def _type_id(name: str) -> int:
    import gguf

    return int(gguf.GGMLQuantizationType[name])


def _dequant(lib, type_name: str, raw: np.ndarray, n: int) -> np.ndarray:
    rows = raw.shape[0]
    flat = np.ascontiguousarray(raw).reshape(-1)
    out = np.empty(rows * n, np.float32)
    assert lib.rpc_dequantize(_type_id(type_name), _u8(flat), _f32(out), rows * n) == 0
    return out.reshape(rows, n)


def test_block_sizes_match_gguf(lib):
    import gguf

    for name in (*FLOAT_TYPES, *QUANT_TYPES):
        qk = ctypes.c_int()
        nbytes = lib.rpc_block_bytes(_type_id(name), ctypes.byref(qk))
        assert (qk.value, nbytes) == gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]], name


@pytest.mark.parametrize("type_name", ["F32", *FTYPES])
def test_dequantize_matches_gguf(lib, real_tensors, type_name):
    from gguf.quants import dequantize as gguf_dequantize

    raw, n = real_tensors[type_name]
    ours = _dequant(lib, type_name, raw, n)
    oracle = np.asarray(gguf_dequantize(raw, _gguf_type(type_name)), np.float32).reshape(
        raw.shape[0], n
    )
    assert np.any(oracle != 0)
    np.testing.assert_array_equal(ours, oracle, err_msg=type_name)


def _gguf_type(name: str):
    import gguf

    return gguf.GGMLQuantizationType[name]


def _quantize_q8_1(lib, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty(x.size // 32 * 36, np.uint8)
    lib.rpc_quantize_q8_1(_f32(x), _u8(out), x.size)
    return out


def test_quantize_q8_1_matches_ggml_definition(lib):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(32 * 512).astype(np.float32) * rng.uniform(1e-3, 50, 32 * 512)
    x[:32] = 0.0  # an all-zero block: d = 0, q = 0
    x[32:64] = np.linspace(-127, 127, 32)  # exact .5 ties go away from zero
    x[64:96] = rng.integers(-3, 4, 32) * np.float32(0.5)
    ours = _quantize_q8_1(lib, x)
    np.testing.assert_array_equal(ours, q8_1_oracle(x))


@pytest.mark.parametrize("type_name", QUANT_TYPES)
def test_dot_q8_1_matches_float64(lib, real_tensors, type_name):
    """Weight-row x q8_1-activation dot products (dp4a path) vs float64 of the same values, and
    vs the unquantized activation within the bound q8_1 rounding allows."""
    raw, n = real_tensors[type_name]
    w = _dequant(lib, type_name, raw, n).astype(np.float64)
    rng = np.random.default_rng(_type_id(type_name))
    for r in range(raw.shape[0]):
        x = rng.standard_normal(n).astype(np.float32) * np.float32(rng.uniform(0.01, 10))
        y = _quantize_q8_1(lib, x)
        got = ctypes.c_float()
        row = np.ascontiguousarray(raw[r])
        assert lib.rpc_dot_q8_1(_type_id(type_name), _u8(row), _u8(y), n, ctypes.byref(got)) == 0
        yq = dequant_q8_1(y)
        exact_q = float(np.dot(w[r], yq))
        scale = float(np.abs(w[r] * yq).sum())
        assert abs(got.value - exact_q) <= 2e-6 * scale + 1e-30, (type_name, r)
        # |x - yq| per element is at most half a step plus the step's own half rounding
        d = np.repeat(np.abs(x).reshape(-1, 32).max(axis=1) / 127.0, 32)
        bound = float((np.abs(w[r]) * d * 0.57).sum()) + 2e-6 * scale
        assert abs(got.value - float(np.dot(w[r], x.astype(np.float64)))) <= bound, (type_name, r)


def test_half_conversions_match_numpy(lib):
    every_half = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    back = np.array([lib.rpc_host_half_to_float(int(h)) for h in every_half], np.float32)
    oracle = every_half.view(np.float16).astype(np.float32)
    finite = np.isfinite(oracle)
    np.testing.assert_array_equal(back[finite], oracle[finite])
    assert np.all(np.isnan(back[~finite]) == np.isnan(oracle[~finite]))

    rng = np.random.default_rng(2)
    x = np.concatenate(
        [
            rng.standard_normal(20000).astype(np.float32) * np.float32(1e3),
            (rng.standard_normal(20000) * 1e-6).astype(np.float32),  # subnormal halves
            np.array(
                [65504, 65519.99, 65520, 1e9, -1e9, 6e-8, 3e-8, 2.9802322e-08, 0.0, -0.0],
                np.float32,
            ),
            # exact ties between neighbouring halves round to even
            (np.arange(1024, 2048, dtype=np.float32) + np.float32(0.5)),
        ]
    )
    ours = np.array([lib.rpc_host_float_to_half(float(v)) for v in x], np.uint16)
    with np.errstate(over="ignore"):  # the out-of-range values are meant to become infinities
        oracle16 = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(ours, oracle16)


def test_bf16_rounding_matches_ggml_definition(lib):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(20000) * 10.0 ** rng.integers(-30, 30, 20000)).astype(np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    # ggml_compute_fp32_to_bf16 for non-NaN inputs
    oracle = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    ours = np.array([lib.rpc_host_float_to_bf16(float(v)) for v in x], np.uint16)
    np.testing.assert_array_equal(ours, oracle)


def test_dp4a_host_matches_numpy(lib):
    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, (2000, 4), dtype=np.int64)
    b = rng.integers(-128, 128, (2000, 4), dtype=np.int64)
    c = rng.integers(-(2**20), 2**20, 2000)
    pack = lambda v: int(np.uint32((v & 0xFF) @ (1 << np.arange(0, 32, 8))).view(np.int32))  # noqa: E731
    for i in range(2000):
        got = lib.rpc_host_dp4a(pack(a[i]), pack(b[i]), int(c[i]))
        assert got == int((a[i] * b[i]).sum() + c[i])


def test_prmt_host_matches_ptx_definition(lib):
    """PTX prmt.b32 (default mode) per the ISA: byte i of the result is byte c&7 of the 8-byte
    {b, a}, sign-replicated when c&8, c being selector nibble i."""
    rng = np.random.default_rng(14)
    for _ in range(3000):
        a, b, s = (int(v) for v in rng.integers(0, 2**32, 3, dtype=np.uint64))
        src = a.to_bytes(4, "little") + b.to_bytes(4, "little")
        want = 0
        for i in range(4):
            c = (s >> (4 * i)) & 15
            byte = src[c & 7]
            if c & 8:
                byte = 0xFF if byte & 0x80 else 0
            want |= byte << (8 * i)
        assert lib.rpc_host_prmt(a, b, s) == want
