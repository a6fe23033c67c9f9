"""Native q8_0 matrix-vector steps over weights quantized by rpcnet: plans whose results are
bit-exact functions of their inputs, for the tests of how a device worker schedules plans."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from rpcnet import _native
from rpcnet.compute.device import Device, cpu_device
from rpcnet.compute.quant import quantize
from rpcnet.ggml_types import GgmlType


def q8_0_row_bytes(k: int) -> int:
    return k // 32 * 34


def q8_0_matrix(values: np.ndarray) -> np.ndarray:
    """f32 rows quantized to q8_0: the raw bytes, flat."""
    return np.ascontiguousarray(quantize(GgmlType.Q8_0, values), dtype=np.uint8).reshape(-1)


def f32_vector(values: np.ndarray) -> tuple:
    """A native step's operand: a contiguous f32 vector."""
    n = values.size
    return (values.view(np.uint8), 0, (n, 1, 1, 1), (4, 4 * n, 4 * n, 4 * n))


def q8_0_matvec_step(w: np.ndarray, k: int, m: int, x: np.ndarray, out: np.ndarray):
    """out[m] = W x[k] with W the q8_0 bytes `w` of m rows of k."""
    row = q8_0_row_bytes(k)
    weights = (w, 0, (k // 32, m, 1, 1), (34, row, row * m, row * m))
    return _native.mul_mat_step(GgmlType.Q8_0, weights, f32_vector(x), f32_vector(out), threads=2)


def cpu_worker() -> Iterator[Device]:
    """A CPU device with its worker, shut down after use (a fixture's body)."""
    dev = cpu_device(capacity=1 << 26, threads=2)
    yield dev
    dev.shutdown()
