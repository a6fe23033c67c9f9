from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# pyverbs (installed by tools/refenv.sh from Debian) for the RDMA transport tests.
_PYVERBS = Path(__file__).resolve().parent.parent / ".refenv" / "pyverbs-path"
if _PYVERBS.is_dir():
    sys.path.append(str(_PYVERBS))

from support import hyp, require  # noqa: E402
from support.inproc import ServerThread  # noqa: E402

HYPOTHESIS_PROFILE = hyp.load()  # before the test modules build their settings


def pytest_report_header() -> str:
    return f"hypothesis profile: {HYPOTHESIS_PROFILE} (tests/support/hyp.py)"


# The ring(s) of every test module (markers registered in pyproject.toml): `pytest -m unit` runs
# one ring. A test module missing here is a collection error, so no test escapes its ring.
RINGS: dict[str, tuple[str, ...]] = {
    "test_bad_input": ("unit",),
    "test_cache": ("unit",),
    "test_chain": ("unit",),
    "test_docs": ("unit",),
    "test_cli": ("unit",),
    "test_commands": ("unit",),
    "test_command_table": ("unit",),
    "test_concurrency": ("unit",),
    "test_derived_cache": ("unit",),
    "test_shared_weights": ("unit",),
    "test_device_inline": ("unit",),
    "test_device_shared_decode": ("unit",),
    "test_fair_turns": ("unit",),
    "test_fair_turns_e2e": ("e2e",),
    "test_quotas": ("unit",),
    "test_faults": ("unit",),
    "test_fuzz_corpus": ("unit",),
    "test_fuzz_session": ("unit",),
    "test_limits": ("unit",),
    "test_native": ("unit",),
    "test_quant": ("unit",),
    "test_conformance": ("reference",),
    "test_matmul_native": ("reference",),
    "test_matmul_quant": ("reference",),
    "test_matmul_tiled": ("reference",),
    "test_moe_native": ("reference",),
    "test_ops_native": ("reference",),
    "test_ops_attention": ("reference",),
    "test_ops_elementwise": ("reference",),
    "test_ops_reduce": ("reference",),
    "test_ops_rows": ("reference",),
    "test_ops_smoke": ("reference",),
    "test_quant_real": ("reference",),
    "test_real_client": ("reference",),
    "test_refenv": ("reference",),
    "test_e2e_models": ("e2e", "slow"),
    "test_multihost": ("e2e",),
    "test_rss_return": ("e2e",),
    "test_shared_weights_e2e": ("e2e",),
    "test_soak": ("e2e", "slow"),
    "test_rdma_fake_verbs": ("rdma",),
    "test_rdma_resolver": ("rdma",),
    "test_transport_negotiation": ("rdma",),
    "test_attacks": ("unit",),
    "test_peer_tls": ("unit",),
    "test_cachecli": ("unit",),
    "test_cuda_blockmath": ("unit",),
    "test_cuda_host": ("unit",),
    "test_cuda_nvrtc": ("unit",),
    "test_cuda_strict": ("unit",),
    "test_cuda_params": ("unit",),
    "test_cuda_emulated": ("unit",),
    "test_cuda_fused": ("unit",),
    "test_cuda_ptxas": ("unit",),
    "test_gpu_check_dry_run": ("slow",),
    "test_cuda_registry": ("unit",),
    "test_cuda_serving": ("unit",),
    "test_cuda_shared_weights": ("unit",),
    "test_ggml_types": ("unit",),
    "test_kernel_table": ("unit",),
    "test_layering": ("unit",),
    "test_module_graph": ("unit",),
    "test_rust_module_graph": ("unit",),
    "test_scratch": ("unit", "reference"),
    "test_metrics": ("e2e",),
    "test_modeldir": ("e2e",),
    "test_attack_load": ("e2e", "slow"),
    "test_wheel": ("e2e", "slow"),
    "test_cuda_gpu": ("gpu",),
    "test_cuda_gpu_device": ("gpu",),
    "test_cuda_capture": ("unit",),
    "test_cuda_launch_args": ("unit",),
    "test_memory_accounting": ("unit",),
    "test_q8_0_x86": ("unit", "reference"),
    "test_numerics": ("e2e",),
    "test_tls": ("unit",),
    "test_tokens": ("unit",),
    "test_tunnel": ("e2e",),
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unassigned = set()
    for item in items:
        module = item.path.stem
        if module not in RINGS:
            unassigned.add(module)
            continue
        for ring in RINGS[module]:
            item.add_marker(ring)
    if unassigned:
        raise pytest.UsageError(
            f"test modules without a ring: {sorted(unassigned)}; add them to RINGS in {__file__}"
        )


@pytest.fixture(scope="session")
def refenv_required() -> None:
    """Skips (fails in CI: RPCNET_REQUIRE_REFENV=1) without the reference environment."""
    require.reference_env()


@pytest.fixture
def server_factory():
    started: list[ServerThread] = []

    def start(**config) -> ServerThread:
        srv = ServerThread(**config).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def server(server_factory) -> ServerThread:
    return server_factory(mem=1 << 30)


@pytest.fixture
def server_v7(server_factory) -> ServerThread:
    return server_factory(mem=1 << 30, proto=7)


@pytest.fixture(scope="session")
def reference_v8():
    """The REAL reference rpc-server (v8) for differential tests; port number."""
    from support import refenv

    require.reference_env("v8")
    port = refenv.free_port()
    proc = refenv.start_reference_server("v8", port=port)
    yield port
    refenv.stop_process(proc)


@pytest.fixture(scope="session")
def rpcnet_v8():
    srv = ServerThread(mem=4 << 30).start()
    yield srv.port
    srv.stop()


@pytest.fixture(scope="module", params=["simd", "portable"])
def path(request):
    """The native kernels' build under test: the AVX2 one, then the portable one (same bits)."""
    from rpcnet import _native

    simd = _native.set_portable_kernels(request.param == "portable")
    assert simd == (request.param == "simd"), "this host has no AVX2+FMA+F16C SIMD path"
    yield request.param
    _native.set_portable_kernels(False)


@pytest.fixture(autouse=True)
def _kernel_timing_ends_with_its_test():
    """An in-process `serve --metrics` turns on kernel timing for the whole process (as a
    server process wants); a later test must see plans compiled as without it."""
    from rpcnet.compute import profile

    collecting = profile._collect
    yield
    profile._collect = collecting


_ALL_BYTES = bytes(range(256))
#: CPython's cached one-byte bytes objects (what b" " * 1 or data[i : i + 1] return)
_ONE_BYTE_OBJECTS = [_ALL_BYTES[i : i + 1] for i in range(256)]


@pytest.fixture(autouse=True)
def _one_byte_bytes_intact():
    """A native call that writes into a `bytes` it was handed (an output buffer made as
    b" " * n) changes that object for the whole process when it is a cached one-byte object;
    later tests then see wrong data. Fail the test that did it."""
    yield
    bad = [i for i, b in enumerate(_ONE_BYTE_OBJECTS) if b[0] != i]
    if bad:
        pytest.fail(f"the interpreter's one-byte bytes objects {bad} were overwritten")
