"""End to end: REAL llama.cpp clients run the model zoo with every layer on rpcnet.

For each case the ``generate`` probe runs twice with the same options: once on the client's own
CPU backend (the baseline, shared between cases through a session cache) and once with the layers
on in-process rpcnet servers. Teacher-forced logits (or pooled embeddings) must match:

* ``rel = max|rpcnet - local| / max|local|`` over the whole ``[n_tokens, n_vocab]`` matrix is at
  most 1e-3 for f32 models, quantized weights and a quantized KV cache (the bound of
  docs/numerics.md), 2e-2 for f16/bf16, and 5e-2 for models with Q4_0/Q4_K weights, which the
  client's local CPU backend repacks (the reference server itself is ~1.5e-2 from local there;
  tests/test_numerics.py compares those against the reference server at 1e-3);
* the argmax of every position is equal (a mismatch that is a *near tie* — rpcnet's pick within
  ``2 * max|diff|`` of the row maximum — is named as such in the failure, but still fails).

Needs the reference env (``tools/refenv.sh``) and ``gguf``; skipped otherwise (fails with
``RPCNET_REQUIRE_REFENV=1``). Models are written once per session (``RPCNET_E2E_CACHE=DIR``
keeps them across sessions). With ``RPCNET_E2E_REPORT=FILE`` the observed errors are written to
FILE as JSON; the summary is also printed at the end of the module (``pytest -s``). See
docs/e2e.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from rpcnet.compute import device as device_module
from rpcnet.compute import turns
from rpcnet.compute.device import cpu_device
from support import refenv, require
from support.e2e_harness import (
    E2E,
    GPU_PREFILL,
    GPU_TOKENS,
    GPU_TOLERANCE,
    PREFILL,
    SERVER_MEM,
    Case,
    LogCapture,
    Summary,
)
from support.fakebackend import FakeStagedBackend
from support.inproc import ServerThread
from support.models import ZOO
from support.strict_cupy import strict_cuda_backend, strict_cuda_device

ZOO_NAMES = list(ZOO)
V7_NAMES = ["llama-gqa-f32", "qwen3-f16", "qwen3moe-f32", "bert-f32", "llama256-Q4_K_M"]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def _require_refenv() -> None:
    require.reference_env("v8")  # every case; v7 cases also require v7 (E2E.check)
    require.module("gguf")  # the model zoo's writer


@pytest.fixture(scope="module")
def zoo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = os.environ.get("RPCNET_E2E_CACHE")
    return Path(cache) if cache else tmp_path_factory.mktemp("zoo")


@pytest.fixture(scope="module")
def server_logs() -> Iterator[LogCapture]:
    handler = LogCapture()
    logger = logging.getLogger("rpcnet")
    old_level = logger.level
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old_level)


@pytest.fixture(scope="module")
def servers(server_logs: LogCapture, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """Lazily started servers by key (``"v8"``, ``"v8-second"``, ``"v7"``): ``get(key)`` ->
    endpoint. In-process rpcnet servers, or with ``RPCNET_E2E_SERVER=reference`` the REAL
    rpc-server of that version (to check the harness itself: every case must pass there)."""
    reference = os.environ.get("RPCNET_E2E_SERVER", "rpcnet") == "reference"
    started: dict[str, ServerThread] = {}
    procs: dict[str, tuple[object, str]] = {}
    logs = tmp_path_factory.mktemp("server-logs")
    lock = threading.Lock()

    def get(key: str) -> str:
        version = "v7" if key.startswith("v7") else "v8"
        with lock:
            if reference:
                if key not in procs:
                    port = refenv.free_port()
                    proc = refenv.start_reference_server(
                        version, port=port, log_path=logs / f"{key}.log"
                    )
                    procs[key] = (proc, f"127.0.0.1:{port}")
                return procs[key][1]
            if key not in started:
                proto = 7 if version == "v7" else 8
                devices = None
                if key.endswith("-staged"):  # transfers the CUDA backend's way, on NumPy
                    devices = [cpu_device(0, capacity=SERVER_MEM)]
                    devices[0].backend = FakeStagedBackend()
                elif key.endswith("-emucuda"):  # the CUDA device on the strict stand-in
                    devices = [strict_cuda_device(SERVER_MEM)]
                elif key.endswith("-cuda"):  # the GPU (gpu-marked cases only)
                    from rpcnet.compute.cuda.serve import make_cuda_devices

                    devices = make_cuda_devices("cuda:0", SERVER_MEM, None, ready=True)
                started[key] = ServerThread(devices, proto=proto, mem=SERVER_MEM).start()
            return started[key].endpoint

    yield {"get": get, "started": started}
    for srv in started.values():
        srv.stop()
    for proc, _ in procs.values():
        refenv.stop_process(proc)


@pytest.fixture(scope="module")
def summary() -> Iterator[Summary]:
    result = Summary()
    yield result
    if not result.rows and not result.failures:
        return
    print(result.render())
    report = os.environ.get("RPCNET_E2E_REPORT")
    if report:
        data = {"cases": result.rows, "failures": result.failures}
        Path(report).write_text(json.dumps(data, indent=1))


@pytest.fixture(scope="module")
def e2e(zoo_dir, servers, server_logs, summary, tmp_path_factory) -> E2E:
    return E2E(zoo_dir, tmp_path_factory.mktemp("e2e"), servers, server_logs, summary)


# ----------------------------------------------------------------------------- cases


@pytest.mark.parametrize("model", ZOO_NAMES)
def test_zoo_v8(e2e: E2E, model: str) -> None:
    """Every model, every position in one batch: v8 client, rpcnet --proto 8."""
    e2e.check(f"zoo-v8/{model}", Case(model))


@pytest.mark.parametrize("model", V7_NAMES)
def test_zoo_v7(e2e: E2E, model: str) -> None:
    """A subset with the v7 client (b11413) against rpcnet --proto 7."""
    e2e.check(f"zoo-v7/{model}", Case(model, version="v7", servers=("v7",)))


@pytest.mark.parametrize(
    ("model", "version"),
    [
        ("llama-gqa-f32", "v8"),
        ("qwen3-f32", "v8"),
        ("llama-mha-f16", "v8"),
        ("qwen3moe-f32", "v8"),
        ("qwen3-f32", "v7"),
    ],
)
def test_flash_attention(e2e: E2E, model: str, version: str) -> None:
    """FLASH_ATTN_EXT (f16 KV cache) instead of MUL_MAT + SOFT_MAX."""
    case = Case(model, version=version, servers=(version,), opts=("--flash-attn", "1"))
    e2e.check(f"flash-attn-{version}/{model}", case)


@pytest.mark.parametrize(
    ("model", "opts"),
    [
        ("llama-gqa-f32", ("--flash-attn", "1", "--type-k", "q8_0", "--type-v", "q8_0")),
        ("qwen3-f32", ("--flash-attn", "1", "--type-k", "q8_0", "--type-v", "q8_0")),
        ("llama-gqa-f32", ("--flash-attn", "0", "--type-k", "q8_0")),  # V must stay f16
        (
            "llama-mha-f16",
            ("--flash-attn", "1", "--type-k", "q8_0", "--type-v", "q8_0", "--prefill", PREFILL),
        ),
    ],
    ids=["llama-fa", "qwen3-fa", "llama-k-only", "mha-fa-decode"],
)
def test_kv_cache_q8_0(e2e: E2E, model: str, opts: tuple[str, ...], request) -> None:
    """Quantized KV cache: SET_ROWS into q8_0, attention reading q8_0 K (and V with FA); the
    last one appends single tokens to a q8_0 cache (GRAPH_RECOMPUTE)."""
    case_id = request.node.callspec.id
    e2e.check(f"kv-q8_0/{case_id}/{model}", Case(model, opts=opts, kv_quant=True))


@pytest.mark.parametrize("model", ["llama-gqa-f32", "qwen3moe-f32"])
def test_small_ubatch(e2e: E2E, model: str) -> None:
    """n_ubatch 4: the 8 tokens are two graphs, the second attending to cached K/V."""
    e2e.check(f"ubatch4/{model}", Case(model, opts=("--n-ubatch", "4")))


@pytest.mark.parametrize(
    ("model", "version", "fa"),
    [
        ("llama-gqa-f32", "v8", "0"),
        ("llama-gqa-f32", "v8", "1"),
        ("qwen3-f32", "v8", "0"),
        ("qwen3moe-f32", "v8", "0"),
        ("llama256-Q4_K_M", "v8", "0"),
        ("llama-gqa-f32", "v7", "0"),
    ],
)
def test_prefill_then_decode(e2e: E2E, model: str, version: str, fa: str) -> None:
    """4 tokens in one batch, then one token per llama_decode (graph reuse: GRAPH_RECOMPUTE)."""
    case = Case(
        model,
        version=version,
        servers=(version,),
        opts=("--prefill", PREFILL, "--flash-attn", fa),
    )
    e2e.check(f"decode-{version}-fa{fa}/{model}", case)


# Emulated kernels run orders of magnitude slower than a GPU's: a decode step there is still a
# short plan (run whole, captured and replayed), not a prefill to run in slices.
EMULATED_SHORT_SECONDS = 60.0


@pytest.mark.parametrize(
    "backend", ["cpu", "fake-staged", "emulated-cuda", pytest.param("cuda", marks=pytest.mark.gpu)]
)
@pytest.mark.parametrize(("model", "fa"), [("llama-gqa-f32", "1"), ("llama256-Q4_K_M", "0")])
def test_backends(
    e2e: E2E, backend: str, model: str, fa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend seam end to end: the same prefill + decode through host memory and through
    a backend that moves every byte the CUDA backend's way (staged, deferred copies)."""
    if backend == "emulated-cuda":
        monkeypatch.setattr(turns, "SHORT_SECONDS", EMULATED_SHORT_SECONDS)
        monkeypatch.setattr(device_module, "INLINE_MAX_SECONDS", EMULATED_SHORT_SECONDS)
    key = {
        "cpu": "v8",
        "fake-staged": "v8-staged",
        "emulated-cuda": "v8-emucuda",
        "cuda": "v8-cuda",
    }[backend]
    gpu = backend in ("cuda", "emulated-cuda")
    case = Case(model, servers=(key,), opts=("--prefill", PREFILL, "--flash-attn", fa), gpu=gpu)
    earlier = e2e.servers["started"].get(key)  # a server of an earlier case: its trace so far
    start = 0
    if earlier is not None and backend == "emulated-cuda":
        start = len(earlier.devices[0].backend.cp.timeline.trace)
    e2e.check(f"backend-{backend}-fa{fa}/{model}", case)
    if backend == "emulated-cuda":  # decode steps were captured once, then replayed
        device = e2e.servers["started"][key].devices[0]
        stats = device.runner.replay.stats
        assert stats.captures > 0 and stats.replays > 0 and stats.failed_captures == 0, stats
        device.backend.cp.assert_clean()  # stream order, capture rules, launches
        _check_decode_step_transfers(device.backend.cp.timeline.trace[start:])
    if backend == "fake-staged":
        staged = e2e.servers["started"][key].devices[0].backend
        assert staged.copier.copies > 0, "no byte went through the staging slots"
        assert staged.pool.in_use == 0, "a transfer kept its staging slots"


def _check_decode_step_transfers(trace: list[tuple]) -> None:
    """From one replayed decode step's graph launch to the next, the host starts at most 3
    copies and no kernel of its own: the logits come back, the step's small inputs go out
    in one copy, and everything else runs inside the graph."""
    graphs = [i for i, event in enumerate(trace) if event[0] == "graph"]
    assert len(graphs) >= 3, f"{len(graphs)} graph launches: decode was not replayed"
    for a, b in itertools.pairwise(graphs):
        between = trace[a + 1 : b]
        copies = [e for e in between if e[0] == "copy"]
        kernels = [e for e in between if e[0] == "kernel"]
        assert len(copies) <= 3 and not kernels, between


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("model", "fa"),
    [*((m, fa) for m in ZOO_NAMES if m != "bert-f32" for fa in ("0", "1")), ("bert-f32", "0")],
)
def test_cuda_every_type(e2e: E2E, model: str, fa: str) -> None:
    """Every weight type of the zoo with every layer on a GPU, FA off and on: a prefill batch
    wider than the decode matvec, then single-token decodes, against the client's local run."""
    opts = ("--tokens", GPU_TOKENS, "--prefill", GPU_PREFILL, "--flash-attn", fa)
    if ZOO[model].embedding:
        opts = ("--tokens", GPU_TOKENS, "--flash-attn", fa)  # one batch: pooled embeddings
    e2e.check(f"cuda-fa{fa}/{model}", Case(model, servers=("v8-cuda",), opts=opts, gpu=True))


@pytest.mark.parametrize(
    ("model", "fa"),
    [
        *(
            (m, fa)
            for m in ("llama-gqa-f32", "llama256-Q4_K_M", "qwen3-f32", "qwen3moe-f32")
            for fa in ("0", "1")
        ),
        ("bert-f32", "0"),  # bert with FA on is refused by graph.build_nodes on the CPU too
    ],
)
def test_cuda_kernels_cover_real_client_graphs(e2e: E2E, model: str, fa: str, monkeypatch) -> None:
    """Every node of the real client's prefill and decode graphs (FA on and off) has a cuda kernel:
    served by a cuda device, the graph would be planned, not refused. Checked without a GPU by
    selecting the cuda entry of each node the CPU server compiles."""
    import rpcnet.server.session as session_mod
    from rpcnet.compute.errors import UnsupportedOp
    from rpcnet.compute.graph import needs_compute
    from rpcnet.compute.kernels import kernel_table as registry

    compile_plan = session_mod.compile_plan
    refused: dict[str, str] = {}
    checked = []

    def also_on_cuda(nodes, *args, **kwargs):
        for node in filter(needs_compute, nodes):
            try:
                checked.append(registry.select(node, "cuda").name)
            except UnsupportedOp as exc:
                refused.setdefault(f"{node.op}/{registry.types_of(node)}", str(exc))
        return compile_plan(nodes, *args, **kwargs)

    monkeypatch.setattr(session_mod, "compile_plan", also_on_cuda)
    case = Case(model, servers=("v8",), opts=("--prefill", PREFILL, "--flash-attn", fa))
    e2e.check(f"cuda-coverage-fa{fa}/{model}", case)
    assert checked and not refused, "\n".join(refused.values())


def _rebound(nodes: list, device, contents: dict[int, bytes] | None = None) -> list:
    """Copies of a real graph's nodes in new buffers of `device` (filled with `contents`, by
    id() of the original buffer, when given)."""
    from rpcnet.compute.buffer import DeviceBuffer

    buffers: dict[int, DeviceBuffer] = {}
    made: dict[int, object] = {}

    def on_gpu(buf):
        if buf is None:
            return None
        if id(buf) not in buffers:
            mem = device.backend.allocate(buf.size)
            if contents is not None:
                device.backend.to_device(mem, 0, contents[id(buf)])
            buffers[id(buf)] = DeviceBuffer(buf.handle, device, buf.base, buf.size, mem)
        return buffers[id(buf)]

    def copy(t):
        if t is None:
            return None
        if id(t) not in made:
            made[id(t)] = c = dataclasses.replace(t, buffer=on_gpu(t.buffer), src=())
            c.src = tuple(copy(s) for s in t.src)
        return made[id(t)]

    return [copy(n) for n in nodes]


def _on_recording_cuda(nodes: list) -> tuple[list, object]:
    """Copies of a real graph's nodes in buffers of a recording stand-in of the CUDA backend
    (launches recorded with their PTX-checked arguments, nothing run)."""
    from rpcnet.compute.device import Device
    from rpcnet.compute.memory import MemoryPool
    from test_cuda_registry import RecordingCuda

    backend = RecordingCuda()
    device = Device(0, "CUDA0", "recording", MemoryPool(1 << 40), backend=backend)
    return _rebound(nodes, device), backend


#: steps of these zoo models, FA off and on, run on the emulated GPU: a decode step, and a
#: 12-token prefill (products as matvec launches of up to 8 columns)
EMULATED = [
    ("llama256-q8_0", "0", 1),
    ("llama256-q8_0", "1", 1),
    ("llama256-Q4_K_M", "0", 1),
    ("llama-gqa-f32", "1", 1),
    ("qwen3moe-f32", "0", 1),
    ("llama256-q8_0", "0", 12),
    ("llama256-q8_0", "1", 12),
    ("llama256-Q6_K", "0", 12),
    ("qwen3moe-f32", "0", 12),
]


@pytest.mark.parametrize(("model", "fa", "tokens"), EMULATED)
def test_cuda_step_on_the_emulated_gpu(
    e2e: E2E, model: str, fa: str, tokens: int, monkeypatch
) -> None:
    """A real client's graph of `tokens` tokens, its buffers as the server held them before it
    ran, run by the cuda plan (fusions, shared quantization, strided attention, every kernel
    executed by the CPU emulator) and by the CPU plan: the outputs agree as the CPU's own
    rounding allows (f32: 1e-5 of the largest logit; quantized: 1e-4)."""
    import rpcnet.server.session as session_mod
    from rpcnet.compute.device import Device
    from rpcnet.compute.graph import needs_compute
    from rpcnet.compute.memory import MemoryPool
    from rpcnet.compute.ops import Op

    compile_plan = session_mod.compile_plan
    steps: list[tuple[list, dict[int, bytes]]] = []

    def keep_decode_step(nodes, *args, **kwargs):
        columns = [  # activation columns of each product (MUL_MAT_ID: tokens on ne[2])
            n.src[1].ne[2 if n.op == Op.MUL_MAT_ID else 1]
            for n in nodes
            if needs_compute(n) and n.op in (Op.MUL_MAT, Op.MUL_MAT_ID)
        ]
        if not steps and columns and max(columns) == tokens:
            held = {}
            for t in (t for n in nodes for t in (n, *n.src) if t is not None):
                if t.buffer is not None and id(t.buffer) not in held:
                    held[id(t.buffer)] = bytes(t.buffer.read(0, t.buffer.size))
            steps.append((list(nodes), held))
        return compile_plan(nodes, *args, **kwargs)

    monkeypatch.setattr(session_mod, "compile_plan", keep_decode_step)
    opts = ("--tokens", GPU_TOKENS, "--prefill", GPU_PREFILL, "--flash-attn", fa)
    case = Case(model, servers=("v8",), opts=opts)
    e2e.check(f"cuda-emulated-fa{fa}-n{tokens}/{model}", case)
    assert steps, f"no graph of {tokens} tokens reached the server"
    nodes, held = steps[0]
    outputs = []
    for device in (
        cpu_device(0, capacity=SERVER_MEM),
        Device(0, "CUDA0", "emulated", MemoryPool(SERVER_MEM), backend=strict_cuda_backend()),
    ):
        copies = _rebound(nodes, device, held)
        compile_plan(copies, device.kind).run()
        device.backend.synchronize()
        last = copies[-1]
        out = last.buffer.read(last.offset, last.nbytes)
        outputs.append(np.frombuffer(out, np.float32).copy())
        if device.kind == "cuda":
            device.backend.cp.assert_clean()
    want, got = (o.astype(np.float64) for o in outputs)
    rel = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    # Only summation order differs from the CPU: with the activations rounded and quantized as
    # the CPU does, no quantization boundary is crossed (one crossing would cost ~1e-3). With
    # FA on, the f16 sums of V can round the other way after a last-bit difference of a dot
    # product (the CPU's order depends on its SIMD width): the GPU bounds then.
    klass = Case(model).tolerance_class
    bound = (1e-5 if klass == "f32" else 1e-4) if fa == "0" else GPU_TOLERANCE[klass]
    assert rel <= bound, rel
    n_vocab = ZOO[model].n_vocab
    assert np.array_equal(
        got.reshape(-1, n_vocab).argmax(axis=1), want.reshape(-1, n_vocab).argmax(axis=1)
    )


@pytest.mark.parametrize("model", ["llama256-q8_0", "llama256-Q4_K_M"])
@pytest.mark.parametrize("fa", ["0", "1"])
def test_cuda_decode_step_kernel_count(e2e: E2E, fa: str, model: str, monkeypatch) -> None:
    """Kernels one decode step of the real client's llama graph launches on cuda, counted on
    the recording backend: at most 8 a layer and 4 for the output head."""
    import rpcnet.server.session as session_mod
    from rpcnet.compute.graph import needs_compute
    from rpcnet.compute.ops import Op

    compile_plan = session_mod.compile_plan
    decode_graphs: list[list] = []

    def keep_decode_graphs(nodes, *args, **kwargs):
        products = [n for n in nodes if needs_compute(n) and n.op == Op.MUL_MAT]
        if products and all(n.src[1].ne[1] == 1 for n in products):
            decode_graphs.append(list(nodes))
        return compile_plan(nodes, *args, **kwargs)

    monkeypatch.setattr(session_mod, "compile_plan", keep_decode_graphs)
    case = Case(model, servers=("v8",), opts=("--prefill", PREFILL, "--flash-attn", fa))
    e2e.check(f"cuda-count-fa{fa}/{model}", case)
    assert decode_graphs, "no single-token graph reached the server"
    nodes, backend = _on_recording_cuda(decode_graphs[-1])
    compile_plan(nodes, "cuda").run()
    launched = [call[1] for call in backend.kernels.calls]
    per_kernel: dict[str, int] = {}
    for name in launched:
        per_kernel[name] = per_kernel.get(name, 0) + 1
    n_layer = ZOO[model].base.n_layer
    print(f"decode step, FA {fa}: {len(launched)} kernels for {n_layer} layers: {per_kernel}")
    # per layer: two norms (with their weight, quantizing for the products after them); Q, K
    # and V with RoPE, stored into the KV cache; attention (FLASH_ATTN_EXT, or KQ, SOFT_MAX and
    # KQV with the CONT after them), quantizing its output when the projection takes q8_1;
    # the projection with the residual added; gate and up with the GLU, quantizing for down;
    # down with the residual added. The head: the norm and the output product (the last
    # layer's GET_ROWS of its one row fold into its products).
    assert len(launched) <= 8 * n_layer + 4, per_kernel


@pytest.mark.parametrize("n_gpu_layers", [1, 2])
def test_partial_offload(e2e: E2E, n_gpu_layers: int) -> None:
    """Only the output head (1) or the last block + head (2) on rpcnet, the rest on the client."""
    case = Case(
        "llama-gqa-f32",
        opts=("--prefill", PREFILL),
        rpc_opts=("--n-gpu-layers", str(n_gpu_layers)),
    )
    e2e.check(f"partial-ngl{n_gpu_layers}/llama-gqa-f32", case)


@pytest.mark.parametrize("model", ["llama-gqa-f32", "qwen3moe-f32"])
def test_layer_split_two_servers(e2e: E2E, model: str) -> None:
    """Two rpcnet servers: block 0 on the first, block 1 + output head on the second (tensor
    split 1,3 over the 3 offloadable layers); activations cross between servers via the client."""
    case = Case(
        model,
        servers=("v8", "v8-second"),
        opts=("--prefill", PREFILL),
        rpc_opts=("--tensor-split", "1,3"),
    )
    e2e.check(f"split2/{model}", case)


def test_two_clients_decode_at_once(e2e: E2E) -> None:
    """Two client processes decode on one server at the same time; each matches its baseline."""
    cases = [
        Case("llama-gqa-f32", opts=("--prefill", "2")),
        Case("qwen3-f16", opts=("--prefill", "2")),
    ]
    refs = [e2e.baseline(c) for c in cases]
    for c in cases:
        e2e.model_path(c.model)
    with ThreadPoolExecutor(len(cases)) as pool:
        outputs = list(pool.map(e2e.remote, cases, [f"concurrent/{c.model}" for c in cases]))
    for case, ref, (got, _) in zip(cases, refs, outputs, strict=True):
        e2e.compare(f"concurrent/{case.model}", case, ref, got)


@pytest.mark.parametrize("model", ["llama256-q8_0", "llama256-Q4_K_M", "llama-mha-f16"])
def test_clients_of_one_model_decode_as_one(
    e2e: E2E, servers: dict, model: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Three client processes that loaded the same model decode at once: the server runs their
    decode steps as one pass over the weights (compute/shared_decode.py), and each client gets
    bit for bit the logits it gets with the server to itself (and within the bound of its local
    run)."""
    # the worker waits for a client whose step is due, so that steps join on a slow host too
    monkeypatch.setattr(device_module, "JOIN_WAIT_SECONDS", 0.5)
    monkeypatch.setattr(device_module, "JOIN_WAIT_SHARE", 1e6)
    n = 3
    tokens = ",".join(str(7 + 13 * i) for i in range(24))  # ids < 320, 20 decode steps
    case = Case(model, servers=("v8-joint",), opts=("--tokens", tokens, "--prefill", "4"))
    ref = e2e.baseline(case)
    alone, _ = e2e.remote(case, f"joint-alone/{model}")
    device = servers["started"]["v8-joint"].server.devices[0]
    before = device.joint_plans
    barrier = (
        "--barrier",
        str(tmp_path / "barrier"),
        "--barrier-n",
        str(n),
    )
    together = dataclasses.replace(case, rpc_opts=barrier)
    with ThreadPoolExecutor(n) as pool:
        outputs = list(pool.map(e2e.remote, [together] * n, [f"joint/{model}"] * n))
    joined = device.joint_plans - before
    # most of the 3 × 20 decode steps ran joined (the first of each client's may not)
    assert joined >= 2 * 15, f"only {joined} of {n * 20} decode steps ran joined"
    for got, _ in outputs:
        assert np.array_equal(got, alone), np.abs(got - alone).max()
        e2e.compare(f"joint/{model}", case, ref, got)


@pytest.mark.gpu
def test_cuda_argmax_agreement(summary: Summary) -> None:
    """Over every step of the GPU cases above (run first: pytest keeps file order), the argmax
    agrees with the client's local run on at least 99 % of the steps."""
    rows = [r for r in summary.rows if r.get("gpu") and r["steps"]]
    assert rows, "no GPU case ran before this one"
    steps = sum(r["steps"] for r in rows)
    differ = sum(r["argmax_differs"] for r in rows)
    print(f"GPU argmax: {steps - differ}/{steps} steps agree")
    assert differ <= 0.01 * steps, f"argmax differs on {differ} of {steps} steps"
