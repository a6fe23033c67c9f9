"""ggml block codecs (rpcnet.compute.quant) against the `gguf` package and hand-worked blocks.

Oracles:
* ``gguf.quants.dequantize`` for every dequantizer (bit-for-bit, NaN == NaN), on data from
  ``gguf.quants.quantize`` where gguf has a quantizer, and on random raw blocks otherwise;
* ``gguf.quants.quantize`` for the quantizers gguf implements (F16, BF16, Q4_0, Q4_1, Q5_0,
  Q5_1, Q8_0, MXFP4), on data where gguf follows ggml exactly (finite values);
* for IQ4_NL (no gguf quantizer) a literal scalar transcription of ``quantize_row_iq4_nl_ref``,
  hand-worked blocks and round-trip error bounds;
* hand-computed bytes for the edge cases where gguf and ggml differ (signed zeros, NaN).
"""

from __future__ import annotations

import numpy as np
import pytest
from rpcnet.compute import quant as Q
from rpcnet.ggml_types import GgmlType as T
from rpcnet.ggml_types import type_name
from support import require

try:
    import gguf
    import gguf.quants as gq
except ImportError:  # pragma: no cover - the test extras install gguf
    gguf = None
    gq = None


@pytest.fixture
def _gguf() -> None:
    require.module("gguf")


needs_gguf = pytest.mark.usefixtures("_gguf")

LEGACY = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
K_QUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
ALL_DEQUANT = [T.F16, T.BF16, *LEGACY, *K_QUANTS, T.IQ4_NL, T.IQ4_XS, T.MXFP4]
GGUF_QUANTIZABLE = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4]

# Byte offsets of the f16 scale fields inside each block (forced finite in random blocks).
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
    T.MXFP4: [],
}

KVALUES_IQ4NL = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def name(t: int) -> str:
    return type_name(t)


def assert_same_f32(a, b):
    """Bit-for-bit float32 equality, except that any NaN equals any NaN."""
    a = np.asarray(a)
    b = np.asarray(b)
    assert a.dtype == np.float32 and b.dtype == np.float32
    assert a.shape == b.shape
    na, nb = np.isnan(a), np.isnan(b)
    assert np.array_equal(na, nb), "NaN positions differ"
    ua = a.view(np.uint32)[~na]
    ub = b.view(np.uint32)[~nb]
    bad = np.flatnonzero(ua != ub)
    assert bad.size == 0, f"{bad.size} values differ, first: {a[~na][bad[:5]]} vs {b[~nb][bad[:5]]}"


def gguf_dequant(t: int, raw: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gq.dequantize(raw, gguf.GGMLQuantizationType(t))


def gguf_quant(t: int, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        out = gq.quantize(x, gguf.GGMLQuantizationType(t))
    return np.ascontiguousarray(out).view(np.uint8).reshape(x.shape[0], -1)


def random_blocks(rng, t: int, n_rows: int, row_elems: int) -> np.ndarray:
    """Random bytes with every f16 scale field replaced by a finite value of moderate size."""
    rb = Q.row_bytes(t, row_elems)
    raw = rng.integers(0, 256, size=(n_rows, rb), dtype=np.uint8)
    ts = Q.type_size(t)
    blocks = raw.reshape(-1, ts)
    for off in F16_FIELDS[t]:
        vals = rng.standard_normal(blocks.shape[0]) * rng.choice([1e-3, 0.05, 1.0], blocks.shape[0])
        blocks[:, off : off + 2] = vals.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw


def sample_rows(rng, n_rows: int, row_elems: int) -> np.ndarray:
    """Rows with varying magnitude, some outliers and exact zeros."""
    x = rng.standard_normal((n_rows, row_elems)).astype(np.float32)
    x *= np.exp(rng.uniform(-6, 6, (n_rows, 1))).astype(np.float32)
    x[rng.random(x.shape) < 0.02] *= np.float32(50)
    x[rng.random(x.shape) < 0.05] = 0.0
    return x


# ---- API ---------------------------------------------------------------------------------------


def test_type_sets_and_row_bytes():
    assert set(ALL_DEQUANT) | {T.F32} == set(Q.dequantizable_types())
    assert {T.F32, T.F16, T.BF16, *LEGACY, T.IQ4_NL} <= Q.quantizable_types()
    assert Q.quantizable_types() <= Q.dequantizable_types()
    assert isinstance(Q.dequantizable_types(), frozenset)
    expect = {
        T.F32: 4 * 64,
        T.F16: 128,
        T.BF16: 128,
        T.Q4_0: 36,
        T.Q4_1: 40,
        T.Q5_0: 44,
        T.Q5_1: 48,
        T.Q8_0: 68,
        T.IQ4_NL: 36,
        T.MXFP4: 34,
        T.I32: 256,
        T.I64: 512,
    }
    for t, nbytes in expect.items():
        assert Q.row_bytes(t, 64) == nbytes, name(t)
    for t, nbytes in {
        T.Q2_K: 84,
        T.Q3_K: 110,
        T.Q4_K: 144,
        T.Q5_K: 176,
        T.Q6_K: 210,
        T.IQ4_XS: 136,
    }.items():
        assert Q.row_bytes(t, 512) == 2 * nbytes, name(t)
    with pytest.raises(ValueError):
        Q.row_bytes(T.Q4_0, 48)
    with pytest.raises(ValueError):
        Q.row_bytes(T.Q4_K, 128)
    with pytest.raises(ValueError):
        Q.row_bytes(4, 32)  # removed Q4_2
    with pytest.raises(ValueError):
        Q.row_bytes(43, 32)


def test_input_forms_and_errors():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    packed = Q.quantize(T.Q8_0, x)
    assert packed.dtype == np.uint8 and packed.shape == (3, 68)
    a = Q.dequantize(T.Q8_0, packed, 3, 64)
    assert a.dtype == np.float32 and a.shape == (3, 64)
    assert_same_f32(Q.dequantize(T.Q8_0, packed.tobytes(), 3, 64), a)
    assert_same_f32(Q.dequantize(T.Q8_0, packed.reshape(-1), 3, 64, xp=np), a)
    assert_same_f32(Q.dequantize(T.F32, x.view(np.uint8), 3, 64), x)
    assert np.array_equal(Q.quantize(T.F32, x), x.view(np.uint8))
    assert np.array_equal(Q.quantize(T.Q8_0, x[0]), packed[:1])  # 1-D = one row
    assert Q.dequantize(T.Q4_0, np.zeros(0, np.uint8), 0, 32).shape == (0, 32)
    assert Q.quantize(T.Q4_0, np.zeros((0, 32), np.float32)).shape == (0, 18)
    with pytest.raises(ValueError):
        Q.dequantize(T.Q8_0, packed[:, :-1], 3, 64)  # wrong byte count
    with pytest.raises(ValueError):
        Q.dequantize(T.I32, np.zeros(8, np.uint8), 1, 2)  # not a float format
    with pytest.raises(ValueError):
        Q.quantize(T.Q4_K, np.zeros((1, 256), np.float32))  # no quantizer
    with pytest.raises(ValueError):
        Q.quantize(T.Q4_0, np.zeros((1, 48), np.float32))  # not whole blocks


# ---- dequantizers vs gguf ----------------------------------------------------------------------


@needs_gguf
@pytest.mark.parametrize("t", GGUF_QUANTIZABLE, ids=name)
def test_dequant_matches_gguf_on_quantized_data(t):
    rng = np.random.default_rng(10 + t)
    for n_rows, row_elems in [(1, 32), (5, 96), (3, 160), (2, 4096)]:
        x = sample_rows(rng, n_rows, row_elems)
        raw = gguf_quant(t, x)
        assert_same_f32(Q.dequantize(t, raw, n_rows, row_elems), gguf_dequant(t, raw))


@needs_gguf
@pytest.mark.parametrize("t", [t for t in ALL_DEQUANT if t not in (T.F16, T.BF16)], ids=name)
def test_dequant_matches_gguf_on_random_blocks(t):
    rng = np.random.default_rng(100 + t)
    bs = Q.block_size(t)
    for n_rows, n_blocks in [(1, 1), (3, 5), (7, 2)]:
        raw = random_blocks(rng, t, n_rows, bs * n_blocks)
        ours = Q.dequantize(t, raw, n_rows, bs * n_blocks)
        if t != T.MXFP4:  # e8m0 covers 2^-128..2^127, so 12 * 2^127 legitimately overflows
            assert np.isfinite(ours).all()
        assert_same_f32(ours, gguf_dequant(t, raw))


@needs_gguf
@pytest.mark.parametrize("t", [T.F16, T.BF16], ids=name)
def test_dequant_all_16bit_patterns_match_gguf(t):
    bits = np.arange(65536, dtype=np.uint16).view(np.uint8).reshape(256, 512)
    assert_same_f32(Q.dequantize(t, bits, 256, 256), gguf_dequant(t, bits))


def test_f16_dequant_nan_is_quieted_with_payload():
    # ggml_compute_fp16_to_fp32 (and F16C) return quiet NaNs keeping the payload bits.
    h = np.array(
        [0x7C01, 0xFE00, 0x7E00, 0x7DFF, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x3C00], np.uint16
    )
    out = Q.dequantize(T.F16, h.view(np.uint8), 1, h.size).view(np.uint32)[0]
    expect = [
        0x7FC02000,
        0xFFC00000,
        0x7FC00000,
        0x7FFFE000,
        0x7F800000,
        0xFF800000,
        0x80000000,
        0x33800000,
        0x3F800000,
    ]
    assert [hex(v) for v in out] == [hex(v) for v in expect]


# ---- quantizers vs gguf ------------------------------------------------------------------------


@needs_gguf
@pytest.mark.parametrize("t", GGUF_QUANTIZABLE, ids=name)
def test_quant_matches_gguf(t):
    rng = np.random.default_rng(200 + t)
    for n_rows, row_elems in [(1, 32), (4, 64), (3, 96), (2, 160), (8, 4096)]:
        x = sample_rows(rng, n_rows, row_elems)
        assert np.array_equal(Q.quantize(t, x), gguf_quant(t, x)), (n_rows, row_elems)


@needs_gguf
@pytest.mark.parametrize("t", GGUF_QUANTIZABLE, ids=name)
def test_quant_matches_gguf_on_rounding_ties(t):
    # values landing exactly on .5 after scaling exercise roundf / trunc(x + 8.5) tie handling
    rng = np.random.default_rng(300 + t)
    x = (rng.integers(-32, 33, size=(16, 128)) * 0.25).astype(np.float32)
    x[:, 0] = rng.choice([-8.0, 8.0, 16.0, -16.0, 12.7, -12.7], size=16).astype(np.float32)
    assert np.array_equal(Q.quantize(t, x), gguf_quant(t, x))


@needs_gguf
@pytest.mark.parametrize("t", GGUF_QUANTIZABLE, ids=name)
def test_quant_matches_gguf_huge_values(t):
    rng = np.random.default_rng(400 + t)
    x = (rng.standard_normal((3, 96)) * 1e37).astype(np.float32)
    x[0, 5] = 3.3e38
    x[1, :32] = 65519.0  # rounds to f16 inf
    x[2, 40] = -3.4e38  # max - min overflows for q4_1/q5_1
    assert np.array_equal(Q.quantize(t, x), gguf_quant(t, x))


@needs_gguf
@pytest.mark.parametrize("t", LEGACY + [T.MXFP4], ids=name)
def test_quant_dequant_round_trip_error(t):
    rng = np.random.default_rng(500 + t)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    y = Q.dequantize(t, Q.quantize(t, x), 4, 256)
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    err = np.abs(y.reshape(-1, 32) - blocks) / amax
    # q4_0/q5_0 map the max to -8/-16, so the opposite extreme only reaches +7/+15
    bound = {
        T.Q4_0: 0.13,
        T.Q4_1: 0.07,
        T.Q5_0: 0.065,
        T.Q5_1: 0.035,
        T.Q8_0: 0.005,
        T.MXFP4: 0.26,
    }[t]
    assert err.max() <= bound


# ---- hand-worked edge cases (ggml semantics where gguf differs or is silent) --------------------


def _f16(v) -> list[int]:
    return list(np.array([v], np.float32).astype(np.float16).view(np.uint8))


def test_q4_0_zero_blocks_keep_ggml_signed_zero_scale():
    # ggml: max stays +0.0 unless |v| > 0, so d = +0.0 / -8 = -0.0 (0x8000), codes 0 + 8.5 -> 8.
    x = np.zeros((3, 32), np.float32)
    x[1, 0] = -0.0
    x[2, 7] = -0.0
    expect = [0x00, 0x80] + [0x88] * 16
    assert Q.quantize(T.Q4_0, x).tolist() == [expect] * 3
    assert Q.quantize(T.Q5_0, x)[:, :2].tolist() == [[0x00, 0x80]] * 3
    # q8_0: amax = 0 -> d = 0, q = 0
    assert Q.quantize(T.Q8_0, x).tolist() == [[0] * 34] * 3
    # dequantizing gives zeros of either sign
    assert (Q.dequantize(T.Q4_0, Q.quantize(T.Q4_0, x), 3, 32) == 0).all()


def test_q4_1_signed_zero_min_follows_first_element():
    x = np.zeros((2, 32), np.float32)
    x[1, 0] = -0.0  # first minimum wins the tie: m = -0.0
    out = Q.quantize(T.Q4_1, x)
    assert out[0].tolist() == [0] * 20
    assert out[1].tolist() == [0, 0, 0x00, 0x80] + [0] * 16
    out = Q.quantize(T.Q5_1, x)
    assert out[1, :4].tolist() == [0, 0, 0x00, 0x80]


def test_q8_0_hand_block():
    x = np.arange(-16, 16, dtype=np.float32) * np.float32(0.5)  # amax = 8 -> d = 8/127
    out = Q.quantize(T.Q8_0, x[None, :])[0]
    d = np.float32(8.0) / np.float32(127.0)
    idv = np.float32(1.0) / d
    q = [int(np.trunc(v * idv + np.copysign(0.5, v))) for v in x]  # roundf (no ties here)
    assert out[:2].tolist() == _f16(d)
    assert out[2:].view(np.int8).tolist() == q
    assert q[0] == -127


def test_q5_0_hand_block():
    x = np.zeros(32, np.float32)
    x[3] = 16.0  # max -> d = -1, id = -1
    x[20] = -15.0
    x[5] = 1.0
    out = Q.quantize(T.Q5_0, x[None, :])[0]
    codes = [16] * 32  # (int8)(0 * -1 + 16.5) = 16
    codes[3] = 0  # 16 * -1 + 16.5 = 0.5 -> 0
    codes[20] = 31  # -15 * -1 + 16.5 = 31.5 -> 31
    codes[5] = 15  # -1 + 16.5 = 15.5 -> 15
    qh = sum(((c >> 4) & 1) << j for j, c in enumerate(codes))
    qs = [(codes[j] & 0xF) | ((codes[j + 16] & 0xF) << 4) for j in range(16)]
    assert out.tolist() == [0x00, 0xBC] + list(qh.to_bytes(4, "little")) + qs
    assert Q.dequantize(T.Q5_0, out, 1, 32)[0].tolist() == [float(16 - c) for c in codes]


def test_f16_quant_edge_values():
    vals = np.array(
        [
            0.0,
            -0.0,
            1.0,
            -2.5,
            65504.0,
            65519.0,
            65520.0,
            1e30,
            -np.inf,
            np.inf,
            2.0**-24,
            2.0**-25,
            3 * 2.0**-25,
            2.0**-26,
            6.1035156e-05,
        ],
        np.float32,
    )
    expect = [
        0x0000,
        0x8000,
        0x3C00,
        0xC100,
        0x7BFF,
        0x7BFF,
        0x7C00,
        0x7C00,
        0xFC00,
        0x7C00,
        0x0001,
        0x0000,
        0x0002,
        0x0000,
        0x0400,
    ]
    out = Q.quantize(T.F16, vals[None, :]).view(np.uint16)[0]
    assert [hex(v) for v in out] == [hex(v) for v in expect]


def test_f16_quant_nan_rows():
    # ggml_compute_fp32_to_fp16: every NaN -> sign | 0x7E00 (payload dropped)
    nan_bits = np.array(
        [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7FA00000], np.uint32
    )
    x = np.tile(nan_bits.view(np.float32), (3, 1))
    out = Q.quantize(T.F16, x).view(np.uint16)
    assert out.tolist() == [[0x7E00, 0xFE00, 0x7E00, 0xFE00, 0x7E00, 0x7E00]] * 3
    back = Q.dequantize(T.F16, Q.quantize(T.F16, x), 3, 6)
    assert np.isnan(back).all()


def test_bf16_quant_edge_values_and_nan():
    bits = np.array(
        [
            0x3F800000,
            0x3F808000,
            0x3F818000,
            0x3F80FFFF,
            0x80000000,
            0x7F7FFFFF,
            0xFF800000,
            0x00000001,
            0x7F800001,
            0xFFFFFFFF,
            0x7FC00000,
            0xFF812345,
        ],
        np.uint32,
    )
    expect = [
        0x3F80,
        0x3F80,
        0x3F82,
        0x3F81,
        0x8000,
        0x7F80,
        0xFF80,
        0x0000,
        0x7FC0,
        0xFFFF,
        0x7FC0,
        0xFFC1,
    ]
    x = np.tile(bits.view(np.float32), (2, 1))
    out = Q.quantize(T.BF16, x).view(np.uint16)
    assert out.tolist() == [expect, expect]
    back = Q.dequantize(T.BF16, out.view(np.uint8), 2, bits.size).view(np.uint32)
    assert back[0].tolist() == [e << 16 for e in expect]


def test_q8_0_nan_follows_reference_max_semantics():
    # amax = MAX(amax, fabsf(v)) with MAX(a,b) = a > b ? a : b: a NaN resets the running max and
    # the next element replaces it.  NaN codes use x86's float->int conversion (0x80000000 -> 0).
    x = np.array(
        [[np.nan] * 31 + [1.0], [np.nan] + [2.0] + [1.0] * 30, [1.0] * 31 + [np.nan]], np.float32
    )
    out = Q.quantize(T.Q8_0, x)
    d1 = np.float32(1.0) / np.float32(127)
    assert out[0, :2].tolist() == _f16(d1)
    assert out[0, 2:].view(np.int8).tolist() == [0] * 31 + [127]
    assert out[1, :2].tolist() == _f16(np.float32(2.0) / np.float32(127))
    assert out[1, 3].view(np.int8) == 127
    assert out[2].tolist() == [0x00, 0x7E] + [0] * 32  # d = NaN -> 0x7E00, every code NaN -> 0


def test_legacy_multiple_rows_not_multiple_of_256():
    rng = np.random.default_rng(7)
    for t in LEGACY + [T.IQ4_NL, T.MXFP4]:
        for row_elems in (32, 96, 160, 288):
            x = sample_rows(rng, 5, row_elems)
            packed = Q.quantize(t, x)
            assert packed.shape == (5, Q.row_bytes(t, row_elems))
            # row-by-row == all rows at once (rows are independent)
            per_row = np.concatenate([Q.quantize(t, x[i : i + 1]) for i in range(5)])
            assert np.array_equal(packed, per_row)
            y = Q.dequantize(t, packed, 5, row_elems)
            per_row_y = np.concatenate([Q.dequantize(t, packed[i], 1, row_elems) for i in range(5)])
            assert_same_f32(y, per_row_y)


# ---- IQ4_NL quantizer: independent scalar transcription of quantize_row_iq4_nl_ref -------------


def _best_index_int8(v: np.float32) -> int:
    val = [np.float32(k) for k in KVALUES_IQ4NL]
    if v <= val[0]:
        return 0
    if v >= val[15]:
        return 15
    ml, mu = 0, 15
    while mu - ml > 1:
        mav = (ml + mu) // 2
        if v < val[mav]:
            mu = mav
        else:
            ml = mav
    return mu - 1 if (v - val[mu - 1]) < (val[mu] - v) else mu


def _iq4_nl_ref_row(x: np.ndarray) -> bytes:
    """Literal, loop-by-loop model of quantize_row_iq4_nl_ref (ntry = -1, no quant weights)."""
    f = np.float32
    out = bytearray()
    L = [8] * 32  # the C stack buffer: stale codes survive across skipped blocks
    for ib in range(x.size // 32):
        xb = [f(v) for v in x[32 * ib : 32 * ib + 32]]
        amax, vmax = f(0), f(0)
        for v in xb:
            if abs(v) > amax:
                amax, vmax = abs(v), v
        if amax < f(1e-15):
            d = f(0)
        else:
            d = vmax / f(-127)
            idv = f(1) / d
            sumqx, sumq2 = f(0), f(0)
            for j, v in enumerate(xb):
                L[j] = _best_index_int8(idv * v)
                q = f(KVALUES_IQ4NL[L[j]])
                w = v * v
                sumqx = sumqx + w * q * v
                sumq2 = sumq2 + w * q * q
            d = sumqx / sumq2 if sumq2 > 0 else f(0)
        out += np.array([d], np.float32).astype(np.float16).tobytes()
        out += bytes(L[j] | (L[j + 16] << 4) for j in range(16))
    return bytes(out)


def test_iq4_nl_matches_scalar_reference():
    rng = np.random.default_rng(11)
    rows = [
        rng.standard_normal(256).astype(np.float32),
        (rng.standard_normal(128) * 1e-3).astype(np.float32),
        (rng.integers(-12, 13, 160) * 0.5).astype(np.float32),  # many exact ties
        np.concatenate(
            [
                rng.standard_normal(32),
                np.zeros(64),
                rng.standard_normal(32) * 1e-17,
                rng.standard_normal(32),
            ]
        ).astype(np.float32),
        sample_rows(rng, 1, 96)[0],
    ]
    for row in rows:
        assert Q.quantize(T.IQ4_NL, row[None, :])[0].tobytes() == _iq4_nl_ref_row(row)


def test_iq4_nl_hand_worked_blocks():
    kv = np.array(KVALUES_IQ4NL, np.float32)
    # x = kvalues/2 twice: d0 = -63.5 / -127 = 0.5, codes = identity, least squares keeps d = 0.5
    x = np.concatenate([kv, kv]) * np.float32(0.5)
    out = Q.quantize(T.IQ4_NL, x[None, :])[0]
    assert out.tolist() == [0x00, 0x38] + [0x11 * j for j in range(16)]
    assert_same_f32(Q.dequantize(T.IQ4_NL, out, 1, 32)[0], x)
    # a single spike: d0 = 127 / -127 = -1, zeros -> code 8 (+1), spike -> code 0 (-127),
    # sums -260144640 / 260144640 -> d = -1.0 (0xBC00)
    x = np.zeros(32, np.float32)
    x[31] = 127.0
    out = Q.quantize(T.IQ4_NL, x[None, :])[0]
    assert out.tolist() == [0x00, 0xBC] + [0x88] * 15 + [0x08]
    y = Q.dequantize(T.IQ4_NL, out, 1, 32)[0]
    assert y[31] == 127.0 and (y[:31] == -1.0).all()


def test_iq4_nl_skipped_blocks_reuse_previous_codes():
    # Blocks with amax < 1e-15 get d = 0 and keep the previous block's codes (C reuses L[]).
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 96)).astype(np.float32)
    x[:, 32:64] = 0.0
    x[1, 32:64] = 1e-16
    out = Q.quantize(T.IQ4_NL, x).reshape(2, 3, 18)
    assert (out[:, 1, :2] == 0).all()
    assert np.array_equal(out[:, 1, 2:], out[:, 0, 2:])
    y = Q.dequantize(T.IQ4_NL, out.reshape(2, -1), 2, 96)
    assert (y[:, 32:64] == 0).all()


def test_iq4_nl_round_trip_error():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((16, 256)).astype(np.float32)
    x[::3] *= np.float32(1e-3)
    y = Q.dequantize(T.IQ4_NL, Q.quantize(T.IQ4_NL, x), 16, 256)
    blocks = x.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    err = np.abs(y.reshape(-1, 32) - blocks) / amax
    assert err.max() < 0.15
    assert np.sqrt((err**2).mean()) < 0.05
    # the largest element is reproduced with its sign, to a few percent
    i = np.abs(blocks).argmax(axis=1)
    rows = np.arange(blocks.shape[0])
    big, got = blocks[rows, i], y.reshape(-1, 32)[rows, i]
    assert (np.sign(big) == np.sign(got)).all()
    assert (np.abs(got - big) <= 0.05 * np.abs(big)).all()
