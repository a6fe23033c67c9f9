"""The CUDA kernels EXECUTED on the CPU: the real launchers of compute/cuda/launch.py drive the
real kernel sources (src/*.cu), compiled with g++ against tests/support/cuda_emu/emu.h (CUDA's
grid, blocks, __syncthreads and warp shuffles on fibers), and are checked against NumPy oracles
written like test_cuda_gpu.py's: gguf.quants for weights, ggml's q8_1 definition, float64
formulas. No GPU or CUDA toolkit; g++ is required (the tests fail without it, never skip).

Weights are random blocks (every bit pattern of the quants, sane half scales), dequantized by
gguf. Results are those of the host's libm without FMA contraction, so the tolerances are the
GPU tests' own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from rpcnet.compute.cuda import launch, launch_attention
from support.cuda_emu import DevArray, EmuBackend, compile_test_module
from support.cuda_kernel_checks import (
    GLU_ORACLES,
    check_binary_broadcast,
    check_flash_attn_decode,
    check_glu,
    check_rms_norm,
    check_rope,
)
from support.cuda_quant import (
    dequant_q8_1,
    float_activations,
    q8_1_oracle,
    soft_max_case,
)

#: byte offsets of the half scales in one block, per quant type (ggml-common.h)
HALF_FIELDS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "MXFP4": (),  # an e8m0 byte, set apart
}
QUANT_TYPES = list(HALF_FIELDS)
ALL_TYPES = ["F32", "F16", "BF16", *QUANT_TYPES]
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS")


@pytest.fixture(scope="module")
def be() -> EmuBackend:
    return EmuBackend()


def _gguf_type(name: str):
    import gguf

    return gguf.GGMLQuantizationType[name]


def _gguf_dequant(type_name: str, raw: np.ndarray, n: int) -> np.ndarray:
    from gguf.quants import dequantize

    out = dequantize(np.ascontiguousarray(raw), _gguf_type(type_name))
    return np.asarray(out, np.float32).reshape(raw.shape[0], n)


def random_rows(type_name: str, rows: int, k: int, seed: int) -> np.ndarray:
    """rows x k weights of `type_name` as raw bytes [rows, row_bytes]."""
    rng = np.random.default_rng(seed)
    if type_name == "F32":
        return rng.standard_normal((rows, k)).astype(np.float32).view(np.uint8)
    if type_name == "F16":
        return rng.standard_normal((rows, k)).astype(np.float16).view(np.uint8)
    if type_name == "BF16":
        bits = rng.standard_normal((rows, k)).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8)
    import gguf

    qk, nbytes = gguf.GGML_QUANT_SIZES[_gguf_type(type_name)]
    raw = rng.integers(0, 256, (rows, k // qk, nbytes), dtype=np.uint8)
    for off in HALF_FIELDS[type_name]:
        scales = rng.uniform(1e-3, 5e-2, (rows, k // qk)).astype(np.float16)
        raw[:, :, off : off + 2] = scales.view(np.uint8).reshape(rows, k // qk, 2)
    if type_name == "MXFP4":
        raw[:, :, 0] = rng.integers(118, 128, (rows, k // qk))  # 2^-9 .. 2^0
    return raw.reshape(rows, -1)


def _mmvq_activations(y: np.ndarray, type_name: str) -> np.ndarray:
    """The activation values the MMVQ kernels multiply (test_cuda_gpu.py's oracle)."""
    if type_name not in K_QUANTS:
        return dequant_q8_1(q8_1_oracle(y))
    b = y.reshape(-1, 256)
    pick = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, pick, axis=-1)
    iscale = np.divide(np.float32(-127), mx, out=np.zeros_like(mx), where=mx != 0)
    q = np.minimum(np.float32(127), np.rint(iscale * b))
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (d.astype(np.float64) * q).reshape(-1)  # the f32 scale, as q8_K keeps it


def test_quantize_q8_1_is_byte_exact(be):
    rng = np.random.default_rng(5)
    k, ncols = 1024, 3
    x = (rng.standard_normal((ncols, k)) * rng.uniform(0.01, 30, (ncols, k))).astype(np.float32)
    x[0, :32] = 0.0  # d = 0
    x[1, 32:64] = np.linspace(-127, 127, 32)  # exact .5 ties
    out = be.zeros(launch.q8_1_bytes(k, ncols), np.uint8)
    launch.quantize_q8_1(be, be.asarray(x), out, k, ncols, k)
    np.testing.assert_array_equal(be.asnumpy(out), q8_1_oracle(x.reshape(-1)))


def test_quantize_q8_1_as_q8_k(be):
    rng = np.random.default_rng(6)
    k, ncols = 512, 2
    x = rng.standard_normal((ncols, k)).astype(np.float32)
    x[1, :256] = 0.0
    out = be.zeros(launch.q8_1_bytes(k, ncols), np.uint8)
    launch.quantize_q8_1(be, be.asarray(x), out, k, ncols, k, as_q8_k=True)
    blocks = be.asnumpy(out).reshape(-1, 36)  # an f32 scale, then the 32 quants
    scale = blocks[:, :4].copy().view(np.float32).astype(np.float64)
    got = (scale * blocks[:, 4:].view(np.int8)).reshape(-1)
    want = np.concatenate([_mmvq_activations(x[c], "Q4_K") for c in range(ncols)])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("ncols", [1, 3])
@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_matvec_matches_float64(be, type_name, ncols, split):
    k, m = 2048, 22  # 22 rows: not a multiple of the warps per block
    raw = random_rows(type_name, m, k, seed=len(type_name) + ncols)
    w = _gguf_dequant(type_name, raw, k).astype(np.float64)
    y = np.random.default_rng(ncols).standard_normal((ncols, k)).astype(np.float32)
    dst = be.full((ncols, m), np.nan, np.float32)
    scratch = be.zeros(launch.q8_1_bytes(k, ncols), np.uint8)
    launch.matvec(be, type_name, be.asarray(raw), be.asarray(y), dst, k, m, ncols, scratch, split)
    got = be.asnumpy(dst).astype(np.float64)
    if type_name in ("F32", "F16", "BF16"):
        yq = float_activations(y, type_name)
    else:
        yq = np.stack([_mmvq_activations(y[c], type_name) for c in range(ncols)])
    want, scale = yq @ w.T, np.abs(yq) @ np.abs(w).T
    assert np.all(np.abs(got - want) <= 1e-5 * scale + 1e-30), type_name


def test_matvec_adds_the_residual_in_place(be):
    k, m = 512, 9
    raw = random_rows("Q4_K", m, k, seed=3)
    w = _gguf_dequant("Q4_K", raw, k).astype(np.float64)
    y = np.random.default_rng(3).standard_normal((1, k)).astype(np.float32)
    res = np.random.default_rng(4).standard_normal((1, m)).astype(np.float32)
    dst = be.asarray(res)
    scratch = be.zeros(launch.q8_1_bytes(k, 1), np.uint8)
    launch.matvec(be, "Q4_K", be.asarray(raw), be.asarray(y), dst, k, m, 1, scratch, add=dst)
    yq = _mmvq_activations(y[0], "Q4_K")
    want = yq @ w.T + res[0]
    scale = np.abs(yq) @ np.abs(w).T + np.abs(res[0])
    assert np.all(np.abs(be.asnumpy(dst)[0] - want) <= 1e-5 * scale)


def test_float_matvec_on_rows_not_16_byte_aligned(be):
    """The scalar path of the float matvec (weights 2 bytes off a 16-byte boundary)."""
    k, m = 256, 7
    raw = random_rows("F16", m, k, seed=17)
    base = be.zeros(raw.size + 16, np.uint8)
    w_dev = base[2 : 2 + raw.size]
    w_dev[:] = raw.reshape(-1)
    y = np.random.default_rng(17).standard_normal((2, k)).astype(np.float32)
    dst = be.zeros((2, m), np.float32)
    launch.matvec(be, "F16", w_dev, be.asarray(y), dst, k, m, 2)
    w = _gguf_dequant("F16", raw, k).astype(np.float64)
    yf = float_activations(y, "F16")
    want, scale = yf @ w.T, np.abs(yf) @ np.abs(w).T
    assert np.all(np.abs(be.asnumpy(dst) - want) <= 1e-5 * scale)


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0", "F32"])
def test_matvec_id_picks_experts(be, type_name):
    k, m, n_tokens, n_slots, ne11 = 256, 6, 3, 2, 2
    raw = random_rows(type_name, 3 * m, k, seed=12)
    w = _gguf_dequant(type_name, raw, k).reshape(3, m, k).astype(np.float64)
    y = np.random.default_rng(12).standard_normal((n_tokens, ne11, k)).astype(np.float32)
    ids = np.array([[2, 0], [1, 1], [0, 2]], np.int32)
    dst = be.full((n_tokens, n_slots, m), np.nan, np.float32)
    scratch = be.zeros(launch.q8_1_bytes(k, n_tokens * ne11), np.uint8)
    experts = be.asarray(raw.reshape(3, m, -1))
    launch.matvec_id(be, type_name, experts, be.asarray(y), be.asarray(ids), dst, k, m, scratch)
    got = be.asnumpy(dst).astype(np.float64)
    for t in range(n_tokens):
        for e in range(n_slots):
            yv = y[t, e % ne11].astype(np.float64)
            if type_name != "F32":
                yv = _mmvq_activations(y[t, e % ne11], type_name)
            want, scale = w[ids[t, e]] @ yv, np.abs(w[ids[t, e]]) @ np.abs(yv)
            assert np.all(np.abs(got[t, e] - want) <= 1e-5 * scale), (t, e)


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_dequantize_matches_gguf(be, type_name):
    k, rows = 512, 5
    raw = random_rows(type_name, rows, k, seed=20)
    oracle = _gguf_dequant(type_name, raw, k)
    out32 = be.zeros((rows, k), np.float32)
    out16 = be.zeros((rows, k), np.float16)
    launch.dequantize(be, type_name, be.asarray(raw), out32, k, rows, "f32")
    launch.dequantize(be, type_name, be.asarray(raw), out16, k, rows, "f16")
    np.testing.assert_array_equal(be.asnumpy(out32), oracle)
    np.testing.assert_array_equal(be.asnumpy(out16), oracle.astype(np.float16))


def _rounded_like_cpu(x: np.ndarray, block: int) -> np.ndarray:
    """test_cuda_gpu.py's oracle of the prefill activation rounding."""
    rows, k = x.shape
    b = x.reshape(rows, k // block, block)
    if block == 32:
        d = np.abs(b).max(axis=-1, keepdims=True) / np.float32(127)
        inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
        q = np.sign(b * inv) * np.floor(np.abs(b * inv) + np.float32(0.5))
        return (d.astype(np.float16).astype(np.float32) * q).reshape(rows, k)
    pick = np.abs(b).argmax(axis=-1)[..., None]
    mx = np.take_along_axis(b, pick, axis=-1)
    iscale = np.divide(np.float32(-127), mx, out=np.zeros_like(mx), where=mx != 0)
    q = np.minimum(np.float32(127), np.rint(iscale * b))
    d = np.divide(np.float32(1), iscale, out=np.zeros_like(iscale), where=iscale != 0)
    return (d * q).reshape(rows, k)


@pytest.mark.parametrize("block", [32, 256])
def test_prefill_activations_round_like_the_cpu(be, block):
    rng = np.random.default_rng(22)
    y = (rng.standard_normal((3, 512)) * rng.uniform(0.1, 9, (3, 512))).astype(np.float32)
    out = be.zeros((3, 512), np.float16)
    launch.round_activations(be, be.asarray(y), out, 512, 3, block)
    want = _rounded_like_cpu(y, block).astype(np.float16)
    np.testing.assert_array_equal(be.asnumpy(out), want)


def test_rms_norm_and_fused_mul(be):
    check_rms_norm(be, be, 5, 1000)


@pytest.mark.parametrize("mask_dtype", [None, np.float32, np.float16])
def test_soft_max_with_mask_and_sinks(be, mask_dtype):
    rng = np.random.default_rng(7)
    heads, rows, n = 3, 4, 300
    x, mask, sinks, want = soft_max_case(rng, heads, rows, n, mask_dtype)
    out = be.zeros((heads, rows, n), np.float32)
    dev_mask = None if mask is None else be.asarray(mask)
    launch_attention.soft_max(be, be.asarray(x), out, 0.125, dev_mask, be.asarray(sinks))
    np.testing.assert_allclose(be.asnumpy(out), want, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", [0, 2])
def test_rope_normal_and_neox(be, mode):
    check_rope(be, be, mode)


@pytest.mark.parametrize("op", sorted(GLU_ORACLES))
def test_glu(be, op):
    check_glu(be, be, op, 300)


@pytest.mark.parametrize("type_name", ALL_TYPES)
def test_get_rows(be, type_name):
    k, rows = 512, 6
    raw = random_rows(type_name, rows, k, seed=23)
    ids = np.array([3, 0, 3, rows - 1], np.int32)
    out = be.zeros((ids.size, k), np.float32)
    launch.get_rows(be, type_name, be.asarray(raw), be.asarray(ids), out, k)
    np.testing.assert_array_equal(be.asnumpy(out), _gguf_dequant(type_name, raw, k)[ids])


@pytest.mark.parametrize("ids_type", [np.int64, np.int32])
@pytest.mark.parametrize("dst_type", ["F32", "F16", "BF16", "Q8_0"])
def test_set_rows(be, dst_type, ids_type):
    from gguf.quants import dequantize, quantize

    rng = np.random.default_rng(18)
    k, rows = 128, 6
    src = rng.standard_normal((3, k)).astype(np.float32)
    src[1, :32] = 0.0  # an all-zero q8_0 block
    ids = np.array([4, 0, 2], ids_type)
    dst = be.zeros(launch.row_bytes(dst_type, k) * rows, np.uint8)
    launch.set_rows(be, be.asarray(src), be.asarray(ids), dst, dst_type)
    qtype = _gguf_type(dst_type)
    got = np.asarray(dequantize(be.asnumpy(dst).reshape(rows, -1), qtype)).reshape(rows, k)
    want = np.zeros((rows, k), np.float32)
    want[ids] = np.asarray(dequantize(quantize(src, qtype), qtype)).reshape(3, k)
    np.testing.assert_array_equal(got, want)


def test_cpy_converts_and_permutes(be):
    x = np.random.default_rng(19).standard_normal((4, 64)).astype(np.float32)
    out16 = be.zeros((64, 4), np.float16)  # same element count, another shape
    launch.cpy(be, be.asarray(x), out16)
    back = be.zeros((4, 64), np.float32)
    launch.cpy(be, out16, back)
    tr = be.zeros((64, 4), np.float32).T  # a transposed destination view
    launch.cpy(be, be.asarray(x), tr)
    np.testing.assert_array_equal(be.asnumpy(out16).reshape(-1), x.astype(np.float16).reshape(-1))
    np.testing.assert_array_equal(be.asnumpy(back), x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(be.asnumpy(tr), x)


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "DIV"])
def test_binary_broadcast(be, op):
    check_binary_broadcast(be, be, op)


UNARY_ORACLES: dict[int | str, Callable[[np.ndarray], np.ndarray]] = {
    4: np.tanh,
    7: lambda x: 1 / (1 + np.exp(-x)),
    10: lambda x: x / (1 + np.exp(-x)),
    "SQR": np.square,
    "SCALE": lambda x: x * 0.5 + 1.0,
}


@pytest.mark.parametrize("op", list(UNARY_ORACLES), ids=str)
def test_unary(be, op):
    x = np.random.default_rng(16).standard_normal((7, 300)).astype(np.float32) * 3
    out = be.zeros(x.shape, np.float32)
    launch.unary(be, op, be.asarray(x), out, 0.5, 1.0)
    want = UNARY_ORACLES[op](x.astype(np.float64))
    np.testing.assert_allclose(be.asnumpy(out), want, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize(
    ("kv_type", "n_kv", "softcap"),
    [
        ("F16", 200, 0.0),
        ("F16", 37, 30.0),
        ("Q8_0", 45, 0.0),
        ("BF16", 70, 0.0),
        ("BF16", 33, 30.0),
    ],
)
def test_flash_attn_decode(be, kv_type, n_kv, softcap):
    """n_kv not a multiple of 32 (nor of the 4 warps' stride); GQA, mask and sinks."""
    n_q = 2
    # scattered masked positions; the last ones (past the last multiple of 32) stay visible
    hidden = (np.arange(n_kv)[None, :] * 7 + np.arange(n_q)[:, None]) % 5 == 0
    hidden[:, -3:] = False
    check_flash_attn_decode(be, be, kv_type, softcap, 4, n_kv, hidden)


# Edge cases of the launch geometry and of the emulator itself --------------------------


def test_set_rows_with_more_one_element_rows_than_grid_y_holds(be):
    """FA-off prefill writes the transposed V cache as rows of one element: the launcher
    clamps grid.y to 65535 and the kernel walks the rest."""
    rng = np.random.default_rng(21)
    n = 70001
    src = rng.standard_normal((n, 1)).astype(np.float32)
    ids = rng.permutation(n).astype(np.int64)
    got = be.zeros(n, np.float16)
    fn = be.kernels.function("rows", "rpc_set_rows_f16")
    before = fn.launches
    launch.set_rows(be, be.asarray(src), be.asarray(ids), got, "F16")
    assert fn.launches == before + 1
    want = np.zeros(n, np.float16)
    want[ids] = src[:, 0].astype(np.float16)
    np.testing.assert_array_equal(be.asnumpy(got), want)


def test_emulator_refuses_grid_y_past_65535(be):
    src, ids, dst = be.zeros((1, 1), np.float32), be.zeros(1, np.int64), be.zeros(2, np.uint8)
    i32, i64 = np.int32, np.int64
    ints = (i32(1), i32(1), i32(1), i32(1))
    longs = (i64(4), i64(0), i64(0), i64(8), i64(0), i64(0), i64(2), i64(0), i64(0), i64(1))
    args = (src, ids, i32(1), dst, *ints, *longs, i64(1))  # one row of one element
    fn = be.kernels.function("rows", "rpc_set_rows_f16")
    fn((1, 65535, 1), (256,), args)  # the largest grid.y runs
    with pytest.raises(RuntimeError, match="grid"):
        fn((1, 65536, 1), (256,), args)
    with pytest.raises(RuntimeError, match="block"):
        fn((1,), (1025,), args)


def test_emulator_checks_argument_count_and_types(be):
    fn = be.kernels.function("quantize", "rpc_quantize_q8_1")
    x, out = be.zeros(32, np.float32), be.zeros(36, np.uint8)
    with pytest.raises(TypeError, match="takes 4 arguments"):
        fn((1, 1), (32, 8), (x, out, np.int32(32)))
    with pytest.raises(TypeError, match="int64"):
        fn((1, 1), (32, 8), (x, out, np.int32(32), np.int32(32)))
    with pytest.raises(TypeError, match="host NumPy array"):
        fn((1, 1), (32, 8), (np.zeros(32, np.float32), out, np.int32(32), np.int64(32)))
    fn((1, 1), (32, 8), (x, out, np.int32(32), np.int64(32)))


def test_emulator_catches_writes_past_a_buffer(be):
    """The red zones around the backend's buffers: a quantize told k = 64 on a 32-float
    input writes a second block past a one-block output."""
    fn = be.kernels.function("quantize", "rpc_quantize_q8_1")
    x, out = be.zeros(64, np.float32), be.zeros(36, np.uint8)
    with pytest.raises(RuntimeError, match="past it"):
        fn((1, 1), (32, 8), (x, out, np.int32(64), np.int64(64)))


EXTRA_KERNELS = r"""
#include "common.cuh"

// thread 0 leaves before the block's barrier: undefined in CUDA, refused by the emulator
extern "C" __global__ void skip_barrier(float* out) {
    if (threadIdx.x == 0) return;
    __shared__ float s[64];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}

// the reference: every thread reaches the barrier; warp and block reductions
extern "C" __global__ void all_reach(float* out, int n) {
    __shared__ float s[64];
    __shared__ float scratch[32];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    const float total = rpc_block_sum((float)threadIdx.x, scratch);
    if ((int)threadIdx.x < n) out[threadIdx.x] = s[(threadIdx.x + 1) % blockDim.x] + total;
}

// shuffle down past the warp's end returns the lane's own value
extern "C" __global__ void shfl_down_edge(int* out) {
    out[threadIdx.x] = __shfl_down_sync(0xffffffffu, (int)threadIdx.x * 10, 5);
}

// half the warp waits at a shuffle that names the other half, which has left
extern "C" __global__ void shfl_after_exit(int* out) {
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}
"""


@pytest.fixture(scope="module")
def extra(tmp_path_factory):
    return compile_test_module(EXTRA_KERNELS, Path(tmp_path_factory.mktemp("cuda_emu")))


def test_emulator_runs_barriers_and_reductions(extra):
    out = np.zeros(64, np.float32).view(DevArray)
    extra.function("all_reach")((2,), (64,), (out, np.int32(64)))
    total = 63 * 64 / 2
    np.testing.assert_array_equal(np.asarray(out), (np.arange(64) + 1) % 64 + total)
    got = np.zeros(64, np.int32).view(DevArray)
    extra.function("shfl_down_edge")((1,), (64,), (got,))
    lane = np.arange(64) % 32
    want = np.where(lane + 5 < 32, np.arange(64) + 5, np.arange(64)) * 10
    np.testing.assert_array_equal(np.asarray(got), want)


def test_emulator_fails_a_kernel_whose_threads_skip_a_barrier(extra):
    out = np.zeros(64, np.float32).view(DevArray)
    with pytest.raises(RuntimeError, match=r"skip_barrier: block \(0, 0, 0\).*__syncthreads"):
        extra.function("skip_barrier")((1,), (64,), (out,))
    # the fibers recover: a good kernel runs after the abandoned launch
    extra.function("all_reach")((1,), (64,), (out, np.int32(64)))


def test_emulator_fails_a_shuffle_naming_exited_lanes(extra):
    out = np.zeros(32, np.int32).view(DevArray)
    with pytest.raises(RuntimeError, match="exited"):
        extra.function("shfl_after_exit")((1,), (32,), (out,))


@pytest.mark.parametrize("type_name", ["Q8_0", "F16", "F32"])
def test_prefill_product_without_a_gemm_binding(be, type_name):
    """A product of more columns than the matvec path takes: weights dequantized to f16 (or
    used as they are), activations rounded as the CPU's dot product, then the array module's
    matmul (here NumPy, standing in for cuBLAS)."""
    k, m, n = 256, 24, 40
    raw = random_rows(type_name, m, k, seed=50)
    w = _gguf_dequant(type_name, raw, k).astype(np.float64)
    y = np.random.default_rng(50).standard_normal((n, k)).astype(np.float32)
    w_bytes, y_bytes = launch.prefill_scratch_bytes(type_name, k, m, n)
    w16, y16 = be.zeros(max(w_bytes, 1), np.uint8), be.zeros(max(y_bytes, 1), np.uint8)
    out = be.full((n, m), np.nan, np.float32)
    launch.matmul_prefill(be, type_name, be.asarray(raw), be.asarray(y), out, k, m, w16, y16)
    yq = y.astype(np.float64) if type_name == "F32" else float_activations(y, "F16")
    if type_name == "Q8_0":
        yq = np.stack([_mmvq_activations(y[c], "Q8_0") for c in range(n)])
    want, scale = yq @ w.T, np.abs(yq) @ np.abs(w).T
    assert np.all(np.abs(be.asnumpy(out) - want) <= 2e-3 * scale + 1e-6)


# Ids are a client's data: out of range they must neither write nor read outside the tensors
# (the emulator checks every buffer's red zones after each launch).


@pytest.mark.parametrize("dst_type", ["F16", "Q8_0"])
def test_set_rows_ignores_ids_outside_the_destination(be, dst_type):
    k, rows = 64, 4
    src = np.random.default_rng(30).standard_normal((4, k)).astype(np.float32)
    ids = np.array([1, -1, rows, 1 << 40], np.int64)
    rb = launch.row_bytes(dst_type, k)
    before = np.random.default_rng(31).integers(0, 256, rows * rb, dtype=np.uint8)
    dst = be.asarray(before.copy())
    launch.set_rows(be, be.asarray(src), be.asarray(ids), dst, dst_type)
    got = be.asnumpy(dst).reshape(rows, rb)
    untouched = [0, 2, 3]
    np.testing.assert_array_equal(got[untouched], before.reshape(rows, rb)[untouched])
    assert not np.array_equal(got[1], before.reshape(rows, rb)[1])  # the valid id was written


def test_get_rows_reads_zeros_for_ids_outside_the_source(be):
    k = 64
    raw = random_rows("Q8_0", 3, k, seed=32)
    ids = np.array([2, -5, 3, 1 << 30], np.int32)
    dst = be.full((4, k), np.nan, np.float32)
    launch.get_rows(be, "Q8_0", be.asarray(raw), be.asarray(ids), dst, k)
    got = be.asnumpy(dst)
    np.testing.assert_array_equal(got[[1, 2, 3]], np.zeros((3, k), np.float32))
    np.testing.assert_array_equal(got[0], _gguf_dequant("Q8_0", raw, k)[2])


def test_matvec_id_gives_zeros_for_experts_that_do_not_exist(be):
    k, m = 256, 5
    raw = random_rows("Q8_0", 2 * m, k, seed=33)
    y = np.random.default_rng(33).standard_normal((1, 1, k)).astype(np.float32)
    ids = np.array([[1, 2, -1]], np.int32)
    dst = be.full((1, 3, m), np.nan, np.float32)
    scratch = be.zeros(launch.q8_1_bytes(k, 1), np.uint8)
    experts = be.asarray(raw.reshape(2, m, -1))
    launch.matvec_id(be, "Q8_0", experts, be.asarray(y), be.asarray(ids), dst, k, m, scratch)
    got = be.asnumpy(dst)
    np.testing.assert_array_equal(got[0, 1:], np.zeros((2, m), np.float32))
    w = _gguf_dequant("Q8_0", raw, k).reshape(2, m, k).astype(np.float64)
    yq = _mmvq_activations(y[0, 0], "Q8_0")
    assert np.all(np.abs(got[0, 0] - w[1] @ yq) <= 1e-5 * (np.abs(w[1]) @ np.abs(yq)))
