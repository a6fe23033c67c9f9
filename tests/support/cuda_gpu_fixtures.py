"""Fixtures of the tests on a real GPU (tests/test_cuda_gpu*.py, which name this module in
`pytest_plugins`): the CUDA backend with its kernels loaded, its CuPy, and real weights."""

from __future__ import annotations

import numpy as np
import pytest

from support.cuda_quant import real_quantized_rows


@pytest.fixture(scope="module")
def be():
    from rpcnet.compute.cuda.device import CudaBackend

    backend = CudaBackend(0)
    backend.kernels.warm()
    # Inputs the tests make with CuPy go on the kernels' stream: a non-blocking stream is not
    # ordered against the legacy stream.
    backend.device.use()
    backend.stream.use()
    return backend


@pytest.fixture(scope="module")
def cp(be):
    return be.cp


@pytest.fixture(scope="module")
def real_tensors(tmp_path_factory) -> dict[str, tuple[np.ndarray, int]]:
    return real_quantized_rows(tmp_path_factory)
