"""The native matmul on q8_0 weights (`_native.matmul_quant`): many rows and threads, padded
strides and argument checks against a NumPy reference, and MUL_MAT against the real rpc-server.

The NumPy reference takes its q8_0 blocks (weights, and activations as ggml's CPU dot product
quantizes them: quantize_row_q8_0_ref) from the independent `gguf` package, not from rpcnet.
"""

from __future__ import annotations

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.compute.kernels.kernel_table import select
from rpcnet.ggml_types import GgmlType
from support import require
from support.opgraph import OpGraph, as_f32
from support.tensors import node as _tensor

F32, Q8_0, MUL_MAT = 0, 8, 29
ROW = 34  # bytes per q8_0 block


@pytest.fixture(scope="module")
def gguf():
    """The oracle for q8_0 blocks: gguf's quantizer (bit-exact with ggml's reference code)."""
    return require.module("gguf")


def q8_0(gguf, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(packed q8_0 rows (m, k/32*34), their float32 values (m, k)), both from gguf."""
    q8_0_type = gguf.GGMLQuantizationType.Q8_0
    packed = gguf.quants.quantize(np.ascontiguousarray(x, np.float32), q8_0_type)
    return packed, gguf.quants.dequantize(packed, q8_0_type).reshape(x.shape)


def q8_weights(gguf, rng: np.random.Generator, m: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(packed bytes (m, k/32*34), dequantized float32 (m, k))."""
    return q8_0(gguf, rng.standard_normal((m, k), dtype=np.float32))


def matmul_q8_0(w, row_stride: int, x, out, threads: int) -> None:
    _native.matmul_quant(GgmlType.Q8_0, w, row_stride, x, out, threads)


def reference(gguf, deq: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Exact result of the quantized operands (float64), and the scale of each sum's terms."""
    xq = q8_0(gguf, x)[1].astype(np.float64)  # ggml quantizes activations to q8_0 for the dot
    wd = deq.astype(np.float64)
    return xq @ wd.T, np.abs(xq) @ np.abs(wd).T


@pytest.mark.parametrize(
    ("m", "k", "n", "threads"),
    [(1, 32, 1, 1), (5, 64, 2, 1), (64, 256, 8, 2), (2816, 1024, 1, 2), (300, 96, 7, 8)],
)
def test_kernel_matches_numpy_reference(gguf, m, k, n, threads):
    rng = np.random.default_rng(m * 1000 + k + n)
    packed, deq = q8_weights(gguf, rng, m, k)
    x = rng.standard_normal((n, k), dtype=np.float32)
    out = np.full((n, m), np.nan, np.float32)
    matmul_q8_0(packed, k // 32 * ROW, x, out, threads)
    want, scale = reference(gguf, deq, x)
    # float32 accumulation of exact block sums: error well below 1e-5 of the terms' magnitude
    assert np.all(np.abs(out - want) <= 1e-5 * scale + 1e-30)


def test_strided_rows_and_thread_counts_agree(gguf):
    rng = np.random.default_rng(7)
    m, k, n = 1500, 128, 3
    packed, deq = q8_weights(gguf, rng, m, k)
    stride = k // 32 * ROW + 20
    padded = np.full((m, stride), 0xAA, np.uint8)
    padded[:, : k // 32 * ROW] = packed
    flat = padded.reshape(-1)[: (m - 1) * stride + k // 32 * ROW]
    x = rng.standard_normal((n, k), dtype=np.float32)
    one = np.empty((n, m), np.float32)
    many = np.empty((n, m), np.float32)
    matmul_q8_0(packed, k // 32 * ROW, x, one, 1)
    matmul_q8_0(flat, stride, x, many, 2)
    assert np.array_equal(one, many)
    want, scale = reference(gguf, deq, x)
    assert np.all(np.abs(one - want) <= 1e-5 * scale)


def test_activation_quantization_is_ggml_q8_0(gguf):
    """One weight block of ones per output: the result sums the q8_0-rounded activations."""
    rng = np.random.default_rng(3)
    k = 64
    x = (rng.standard_normal((4, k)) * np.logspace(-3, 3, 4)[:, None]).astype(np.float32)
    x[2] = 0.0
    eye, deq = q8_0(gguf, np.eye(k, dtype=np.float32))  # d = 1/127, codes 127 / 0
    out = np.empty((4, k), np.float32)
    matmul_q8_0(eye, k // 32 * ROW, x, out, 1)
    want = q8_0(gguf, x)[1] * deq.diagonal()
    np.testing.assert_array_equal(out, want.astype(np.float32))


def test_bad_arguments_raise_value_error():
    packed = np.zeros((4, 2 * ROW), np.uint8)
    x = np.zeros((2, 64), np.float32)
    out = np.zeros((2, 4), np.float32)
    matmul_q8_0(packed, 2 * ROW, x, out, 1)
    bad = [
        (packed, 2 * ROW, x, np.zeros((2, 5), np.float32)),  # weights too short for 5 rows
        (packed, 2 * ROW - 1, x, out),  # stride shorter than a row
        (packed, 2 * ROW, np.zeros((2, 48), np.float32), out),  # K not the row's K... 48 % 32
        (packed, 2 * ROW, x, np.zeros((3, 4), np.float32)),  # N mismatch
        (packed, 2 * ROW, np.zeros(64, np.float32), out),  # x not 2-D
        (packed, 2 * ROW, np.zeros((2, 128), np.float32)[:, ::2], out),  # x not contiguous
    ]
    for args in bad:
        with pytest.raises(ValueError):
            matmul_q8_0(*args, 1)
    readonly = np.zeros((2, 4), np.float32)
    readonly.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        matmul_q8_0(packed, 2 * ROW, x, readonly, 1)
    with pytest.raises((ValueError, BufferError)):
        matmul_q8_0(packed, 2 * ROW, x.astype(np.float64), out, 1)


def test_generic_native_kernel_selected_for_all_shapes():
    """The q8_0-only decode path is superseded by `mul_mat_native` (any N, batched too)."""
    w = _tensor(Q8_0, (1024, 256))
    for n in (1, 8, 9, 300):
        node = _tensor(F32, (256, n), op=MUL_MAT, src=(w, _tensor(F32, (1024, n))))
        assert select(node).name == "mul_mat_native"
    batched = _tensor(Q8_0, (1024, 256, 2))
    node = _tensor(F32, (256, 1, 2), op=MUL_MAT, src=(batched, _tensor(F32, (1024, 1, 2))))
    assert select(node).name == "mul_mat_native"


def _mm_graph(gguf, rng, m, k, shapes, stride_pad=0):
    """One graph: q8_0 weights (m, k) times f32 activations of each shape (k, ...)."""
    packed, _ = q8_weights(gguf, rng, m, k)
    row = k // 32 * ROW
    raw = np.zeros((m, row + stride_pad), np.uint8)
    raw[:, :row] = packed
    g = OpGraph()
    nb1 = row + stride_pad
    raw = raw.reshape(-1)[: (m - 1) * nb1 + row]  # exactly the tensor's bytes
    w = g.input(Q8_0, (k, m), raw, nb=(ROW, nb1, nb1 * m, nb1 * m))
    outs = []
    for shape in shapes:
        x = g.input(F32, (k, *shape), rng.standard_normal(k * int(np.prod(shape)), np.float32))
        outs.append((g.op(MUL_MAT, F32, (m, *shape), (w, x)), (m, *shape)))
    return g, outs


# Padded rows stay whole blocks: ggml's CPU backend (llamafile sgemm's lda = nb01 / 34) garbles
# rows whose stride is not a multiple of the block size, which rpcnet computes as laid out.
@pytest.mark.parametrize(
    ("m", "k", "pad"), [(64, 32, 0), (257, 256, 0), (1000, 1024, 0), (96, 512, 34)]
)
def test_differential_against_reference(gguf, reference_v8, rpcnet_v8, m, k, pad):
    rng = np.random.default_rng(m + k + pad)
    shapes = [(n,) for n in range(1, 9)] + [(2, 3), (1, 2, 4)]
    g, outs = _mm_graph(gguf, rng, m, k, shapes, pad)
    ids = [o for o, _ in outs]
    ref, ours = g.run(reference_v8, ids), g.run(rpcnet_v8, ids)
    for (_, ne), r, o in zip(outs, ref, ours, strict=True):
        want, got = as_f32(r, ne), as_f32(o, ne)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("padded_out", [True, False])
def test_mul_mat_step_broadcasts_strided_batches(gguf, threads, padded_out):
    """`mul_mat_step` on a K-cache-like view (2 weight matrices interleaved row by row, each
    serving 3 activation batches) into a padded output (activation rows read in place), or
    from padded activation rows into a dense output (results written in place): every batch
    equals `matmul_quant` on that batch's rows, bit for bit, and the exact product of the
    quantized operands."""
    rng = np.random.default_rng(threads)
    m, k, n, heads_w, heads_x = 40, 64, 2, 2, 6
    out_pad, x_pad = (3, 0) if padded_out else (0, 5)
    packed, deq = q8_weights(gguf, rng, m * heads_w, k)
    row = k // 32 * ROW
    # rows of matrix h at byte h * row + i * (heads_w * row): the cache layout of K per head
    cache = packed.reshape(m, heads_w, row).copy()
    w_deq = deq.reshape(m, heads_w, k)
    xp = np.full((heads_x, n, k + x_pad), np.nan, np.float32)  # padding never read
    xp[:, :, :k] = rng.standard_normal((heads_x, n, k), dtype=np.float32)
    x = xp[:, :, :k]
    out = np.full((heads_x, n, m + out_pad), np.nan, np.float32)  # padding never written
    w_arg = (
        cache.reshape(-1),
        0,
        (k // 32, m, heads_w, 1),
        (ROW, heads_w * row, row, cache.nbytes),
    )
    xr = 4 * (k + x_pad)
    x_arg = (xp.view(np.uint8).reshape(-1), 0, (k, n, heads_x, 1), (4, xr, xr * n, xp.nbytes))
    o_arg = (
        out.view(np.uint8).reshape(-1),
        0,
        (m, n, heads_x, 1),
        (4, 4 * (m + out_pad), 4 * (m + out_pad) * n, out.nbytes),
    )
    _native.mul_mat_step(Q8_0, w_arg, x_arg, o_arg, threads, True)()
    per_head = heads_x // heads_w
    for h in range(heads_x):
        hw = h // per_head
        one = np.empty((n, m), np.float32)
        matmul_q8_0(np.ascontiguousarray(cache[:, hw]), row, np.ascontiguousarray(x[h]), one, 1)
        np.testing.assert_array_equal(out[h, :, :m], one)
        want, scale = reference(gguf, w_deq[:, hw], x[h])
        assert np.all(np.abs(out[h, :, :m] - want) <= 1e-5 * scale + 1e-6)
    assert np.isnan(out[:, :, m:]).all()  # the padding is never written
    with pytest.raises(ValueError):  # output shape not [M, N, batches]
        bad = (o_arg[0], 0, (m, n, heads_x - 1, 1), o_arg[3])
        _native.mul_mat_step(Q8_0, w_arg, x_arg, bad, threads, True)
    with pytest.raises(ValueError):  # batches that do not broadcast the weights
        bad_w = (w_arg[0], 0, (k // 32, m, 4, 1), (ROW, heads_w * row, row // 2, cache.nbytes))
        _native.mul_mat_step(Q8_0, bad_w, x_arg, o_arg, threads, True)


@pytest.mark.parametrize(("type_id", "threads"), [(Q8_0, 1), (Q8_0, 2), (1, 1), (1, 2)])
def test_mul_mat_step_single_row_batches_share_weights(gguf, type_id, threads):
    """Decode-shaped GQA (one activation row per batch, three batches per weight matrix): the
    step computes each matrix once for its batches, and every batch still equals
    `matmul_quant` of that single row bit for bit (ggml's per-batch vec_dot order; f16 weights
    must not switch to tinyBLAS's order because the call has several rows)."""
    rng = np.random.default_rng(type_id * 10 + threads)
    m, k, heads_w, heads_x = 72, 128, 2, 6
    if type_id == Q8_0:
        packed, deq = q8_weights(gguf, rng, m * heads_w, k)
        row = k // 32 * ROW
        block, block_bytes = k // 32, ROW
    else:
        deq = rng.standard_normal((m * heads_w, k), dtype=np.float32).astype(np.float16)
        packed = deq.view(np.uint8).reshape(m * heads_w, 2 * k)
        row, block, block_bytes = 2 * k, k, 2
    cache = np.ascontiguousarray(packed.reshape(heads_w, m, row))  # one matrix per KV head
    x = rng.standard_normal((heads_x, 1, k), dtype=np.float32)
    out = np.full((heads_x, 1, m), np.nan, np.float32)
    w_nb = (block_bytes, row, m * row, cache.nbytes)
    w_arg = (cache.reshape(-1), 0, (block, m, heads_w, 1), w_nb)
    x_arg = (x.view(np.uint8).reshape(-1), 0, (k, 1, heads_x, 1), (4, 4 * k, 4 * k, x.nbytes))
    o_arg = (out.view(np.uint8).reshape(-1), 0, (m, 1, heads_x, 1), (4, 4 * m, 4 * m, out.nbytes))
    _native.mul_mat_step(type_id, w_arg, x_arg, o_arg, threads, True)()
    per_head = heads_x // heads_w
    for h in range(heads_x):
        one = np.empty((1, m), np.float32)
        _native.matmul_quant(type_id, cache[h // per_head], row, x[h], one, 1, True)
        np.testing.assert_array_equal(out[h], one)
    # and the f16 case differs from the tinyBLAS order somewhere (the check above can fail)
    if type_id != Q8_0:
        several = np.empty((per_head, m), np.float32)
        _native.matmul_quant(type_id, cache[0], row, x[:per_head, 0], several, 1, True)
        assert not np.array_equal(several, out[:per_head, 0])


@pytest.mark.parametrize(
    ("type_name", "k"), [("Q8_0", 320), ("Q4_0", 320), ("Q5_0", 96), ("F16", 300), ("F16", 256)]
)
def test_prompt_tiles_agree_on_every_build(gguf, type_name, k):
    """The 512-bit prompt tiles (where the CPU has AVX-512 VNNI: q8_0-family from 4 activation
    rows, f16 from 16), the AVX2 tiles and the portable row dots give the same bits, for row
    counts on both sides of each tile's threshold and ragged tiles."""
    rng = np.random.default_rng(k)
    qtype = gguf.GGMLQuantizationType[type_name]
    m = 37
    x_w = (
        rng.standard_normal((m, k), dtype=np.float32)
        * np.logspace(-1, 1, m, dtype=np.float32)[:, None]
    )
    w = np.ascontiguousarray(gguf.quants.quantize(x_w, qtype)).view(np.uint8).reshape(m, -1)
    builds = ((False, True), (False, False), (True, False))  # (portable, AVX-512 allowed)
    try:
        for n in (2, 3, 4, 5, 8, 15, 16, 17, 33):
            x = rng.standard_normal((n, k), dtype=np.float32)
            outs = []
            for portable, wide in builds:
                _native.set_portable_kernels(portable)
                _native.set_avx512_kernels(wide)
                out = np.zeros((n, m), np.float32)
                _native.matmul_quant(int(qtype), w, w.shape[1], x, out, 2, True)
                outs.append(out.view(np.uint32))
            for build, out in zip(builds[1:], outs[1:], strict=True):
                assert np.array_equal(outs[0], out), (type_name, k, n, build)
    finally:
        _native.set_portable_kernels(False)
        _native.set_avx512_kernels(True)
