"""The cuda entries of the kernel registry, without a GPU.

- coverage: every (op, types) the CPU device serves has a cuda entry or is listed, with the
  reason, in `NOT_YET_ON_CUDA` (printed, so the gap is visible in every test run);
- registering them imports no CuPy; the device's backend picks the entries (`compile_plan`
  gets the session's device);
- the builders, run on real graph nodes against a recording stand-in of the CUDA backend, launch
  the kernels the plan needs with exactly the parameters the NVRTC-compiled PTX declares.
"""

from __future__ import annotations

import contextlib
import struct
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from rpcnet import _native
from rpcnet.compute import kernels  # noqa: F401 - registers every kernel
from rpcnet.compute.backend import CpuBackend
from rpcnet.compute.buffer import DeviceBuffer
from rpcnet.compute.cuda.kernels import NOT_YET_ON_CUDA
from rpcnet.compute.device import Device
from rpcnet.compute.errors import UnsupportedOp
from rpcnet.compute.graph import compile_plan
from rpcnet.compute.kernels import kernel_table as registry
from rpcnet.compute.memory import MemoryPool
from rpcnet.compute.ops import Glu, Op, Unary, op_name
from rpcnet.compute.tensor import FLAG_COMPUTE, Tensor
from rpcnet.ggml_types import GgmlType
from test_cuda_launch_args import DevArray, Recorder, _kind, _ptx_kind, ptx_params

T = GgmlType


def test_every_cpu_op_has_a_cuda_kernel_or_a_documented_gap():
    cuda_ops = {op_name(k.op) for k in registry.table("cuda")}
    cpu_rows = registry.table("cpu")
    print("\n(op, types) on cpu -> cuda coverage")
    unlisted = []
    for k in cpu_rows:
        name = op_name(k.op)
        gap = NOT_YET_ON_CUDA.get(name)
        state = "cuda" if name in cuda_ops else "NOT YET"
        print(f"  {name:<20} {k.types:<48} {state}{f' (gap: {gap})' if gap else ''}")
        if name not in cuda_ops and gap is None:
            unlisted.append(name)
    assert not unlisted, f"CPU ops with neither a cuda kernel nor a documented gap: {unlisted}"
    cpu_ops = {op_name(k.op) for k in cpu_rows}
    assert set(NOT_YET_ON_CUDA) <= cpu_ops, set(NOT_YET_ON_CUDA) - cpu_ops  # no stale entries
    assert cuda_ops <= cpu_ops
    assert {"MUL_MAT", "MUL_MAT_ID", "RMS_NORM", "ROPE", "SOFT_MAX", "GET_ROWS"} <= cuda_ops


def test_registering_the_cuda_kernels_imports_no_cupy():
    code = (
        "import sys; import rpcnet.compute.kernels; "
        "from rpcnet.compute.kernels.kernel_table import table; "
        "assert table('cuda'); assert 'cupy' not in sys.modules, 'cupy imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_rpcnet_ops_lists_both_devices():
    out = subprocess.run(
        [sys.executable, "-m", "rpcnet.cli", "ops"], capture_output=True, text=True, timeout=120
    ).stdout
    table, _, gaps = out.partition("not yet on cuda")
    rows = [line.split() for line in table.splitlines() if line.strip()]
    devices = {r[-1] for r in rows}
    assert devices == {"cpu", "cuda"}, devices
    assert any(r[0] == "MUL_MAT" and r[-1] == "cuda" for r in rows)
    assert "FLASH_ATTN_EXT" in gaps


# ------------------------------------------------------------------ graph nodes on a fake GPU

BASE = 1 << 24


class RecordingCuda:
    """compute.backend.Backend with CudaBackend's registry key; records launches, runs none."""

    name = "cuda"
    host_resident = False

    def __init__(self) -> None:
        self.kernels = Recorder()
        self.device = contextlib.nullcontext()
        self.stream = contextlib.nullcontext()
        self.cp = SimpleNamespace(float32=np.dtype(np.float32), float16=np.dtype(np.float16))
        self._next = BASE * 4

    def allocate(self, nbytes: int) -> DevArray:
        arr = DevArray((nbytes,), np.uint8, ptr=self._next)
        self._next += (nbytes + 255) // 256 * 256
        return arr

    def scratch(self, kind: str, nbytes: int, zeroed: bool = False) -> DevArray:
        return self.allocate(nbytes)

    def view(self, mem, offset, shape, strides, dtype):
        arr = DevArray(tuple(shape), dtype, ptr=mem.data.ptr + offset)
        arr.strides = tuple(strides)
        return arr


class Graph:
    def __init__(self) -> None:
        self.backend = RecordingCuda()
        self.device = Device(0, "CUDA0", "fake", MemoryPool(1 << 30), backend=self.backend)
        mem = DevArray((1 << 24,), np.uint8, ptr=BASE)
        self.buffer = DeviceBuffer(1, self.device, 0x1000, 1 << 24, mem)
        self.used = 0
        self.ids = 0

    def tensor(self, type_, ne, op=0, params=(), src=(), nb=None) -> Tensor:
        _, block, size, _ = _native.type_info(type_)
        if nb is None:
            nb0 = size
            nb1 = nb0 * ne[0] // block
            nb = (nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2])
        raw = b"".join(
            struct.pack("<f" if isinstance(p, float) else "<i", p) for p in params
        ).ljust(64, b"\0")
        self.ids += 1
        t = Tensor(
            self.ids,
            int(type_),
            tuple(ne),
            tuple(nb),
            int(op),
            raw,
            FLAG_COMPUTE if op else 0,
            f"t{self.ids}",
            self.buffer,
            self.used,
            tuple(src),
        )
        self.used += (t.nbytes + 255) // 256 * 256
        return t


def _check_launches(rec: Recorder) -> list[str]:
    assert rec.calls
    for module, kernel, grid, block, args in rec.calls:
        params = ptx_params(module, kernel)
        assert len(args) == len(params), f"{kernel}: {len(args)} args, PTX has {len(params)}"
        for i, (arg, t) in enumerate(zip(args, params, strict=True)):
            assert _kind(arg) == _ptx_kind(t), f"{kernel} param {i}: {arg!r} vs .{t}"
        assert all(g >= 1 for g in grid) and 1 <= int(np.prod(block)) <= 1024
    return [kernel for _, kernel, *_ in rec.calls]


def _nodes(name: str, g: Graph) -> list[Tensor]:
    x = g.tensor(T.F32, (256, 4, 1, 1))
    if name == "rms_norm":
        return [g.tensor(T.F32, x.ne, Op.RMS_NORM, (1e-6,), (x,))]
    if name in ("mul_mat_q4_k", "mul_mat_f16", "mul_mat_q8_0"):
        wt = {"mul_mat_q4_k": T.Q4_K, "mul_mat_f16": T.F16, "mul_mat_q8_0": T.Q8_0}[name]
        w = g.tensor(wt, (256, 64, 1, 1))
        return [g.tensor(T.F32, (64, 4, 1, 1), Op.MUL_MAT, (), (w, x))]
    if name == "mul_mat_id":
        w = g.tensor(T.Q8_0, (256, 64, 4, 1))
        y = g.tensor(T.F32, (256, 1, 2, 1))
        # the top-2 of 4 experts: a view of the argsort rows (8 bytes of each 16-byte row)
        ids = g.tensor(T.I32, (2, 2, 1, 1), nb=(4, 16, 32, 32))
        return [g.tensor(T.F32, (64, 2, 2, 1), Op.MUL_MAT_ID, (), (w, y, ids))]
    if name == "add":
        b = g.tensor(T.F32, (256, 1, 1, 1))
        return [g.tensor(T.F32, x.ne, Op.ADD, (), (x, b))]
    if name == "scale":
        return [g.tensor(T.F32, x.ne, Op.SCALE, (0.5, 0.0), (x,))]
    if name == "silu":
        return [g.tensor(T.F32, x.ne, Op.UNARY, (int(Unary.SILU),), (x,))]
    if name == "soft_max":
        kq = g.tensor(T.F32, (32, 4, 8, 1))
        mask = g.tensor(T.F16, (32, 4, 1, 1))
        return [g.tensor(T.F32, kq.ne, Op.SOFT_MAX, (0.125, 0.0), (kq, mask))]
    if name == "rope":
        q = g.tensor(T.F32, (64, 8, 4, 1))
        pos = g.tensor(T.I32, (4, 1, 1, 1))
        params = (0, 64, 2, 4096, 4096, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)
        return [g.tensor(T.F32, q.ne, Op.ROPE, params, (q, pos))]
    if name == "swiglu":
        up = g.tensor(T.F32, x.ne)
        return [g.tensor(T.F32, x.ne, Op.GLU, (int(Glu.SWIGLU), 0), (x, up))]
    if name == "get_rows":
        tok = g.tensor(T.Q6_K, (256, 100, 1, 1))
        ids = g.tensor(T.I32, (3, 1, 1, 1))
        return [g.tensor(T.F32, (256, 3, 1, 1), Op.GET_ROWS, (), (tok, ids))]
    if name == "set_rows":
        cache = g.tensor(T.F16, (256, 32, 1, 1))
        ids = g.tensor(T.I64, (4, 1, 1, 1))
        return [g.tensor(T.F16, cache.ne, Op.SET_ROWS, (), (x, ids), nb=cache.nb)]
    if name == "cpy_f32_f16":
        return [g.tensor(T.F16, x.ne, Op.CPY, (), (x,))]
    raise AssertionError(name)


EXPECTED = {
    "rms_norm": ["rpc_rms_norm_f32"],
    "mul_mat_q4_k": ["rpc_quantize_q8_1_as_q8_k", "rpc_mmvq_q4_K"],  # the CPU takes q8_K
    "mul_mat_q8_0": ["rpc_quantize_q8_1", "rpc_mmvq_q8_0"],
    "mul_mat_f16": ["rpc_mmv_f16"],
    "mul_mat_id": ["rpc_quantize_q8_1", "rpc_mmvq_id_q8_0"],
    "add": ["rpc_binary_f32"],
    "scale": ["rpc_unary_f32"],
    "silu": ["rpc_unary_f32"],
    "soft_max": ["rpc_soft_max_f32"],
    "rope": ["rpc_rope_f32"],
    "swiglu": ["rpc_glu_f32"],
    "get_rows": ["rpc_get_rows_q6_K"],
    "set_rows": ["rpc_set_rows_f16"],
    "cpy_f32_f16": ["rpc_cpy_f32_f16"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cuda_plan_launches_the_right_kernels_with_ptx_exact_arguments(name):
    g = Graph()
    nodes = _nodes(name, g)
    plan = compile_plan(nodes, g.device.kind)
    assert all(registry.select(n, "cuda").device == "cuda" for n in nodes)
    plan.run()
    assert _check_launches(g.backend.kernels) == EXPECTED[name]
    if name == "mul_mat_id":
        args = g.backend.kernels.calls[-1][4]
        assert int(args[12]) == 4  # ids_tok: the argsort row stride, in int32 elements


def test_prefill_matmul_is_marked_uncapturable():
    g = Graph()
    w = g.tensor(T.Q4_0, (256, 64, 1, 1))
    y = g.tensor(T.F32, (256, 64, 1, 1))  # 64 tokens: past the chunked matvec, cuBLAS
    node = g.tensor(T.F32, (64, 64, 1, 1), Op.MUL_MAT, (), (w, y))
    plan = compile_plan([node], "cuda")
    assert getattr(plan.steps[0], "capturable", True) is False
    decode = compile_plan(_nodes("mul_mat_q8_0", Graph()), "cuda")
    assert getattr(decode.steps[0], "capturable", True) is True


def test_attention_products_take_the_strided_matvec_or_the_batched_matmul():
    g = Graph()
    k_cache = g.tensor(T.F16, (64, 32, 2, 1))  # 2 KV heads
    q = g.tensor(T.F32, (64, 4, 8, 1))  # 8 heads: GQA broadcast r2 = 4, 4 tokens (decode)
    kq = g.tensor(T.F32, (32, 4, 8, 1), Op.MUL_MAT, (), (k_cache, q))
    assert registry.select(kq, "cuda").name == "cuda_mul_mat_strided"
    assert registry.select(kq, "cuda").captures(kq)  # a decode step replays as a CUDA graph
    q12 = g.tensor(T.F32, (64, 12, 8, 1))  # 12 tokens (prefill)
    kq12 = g.tensor(T.F32, (32, 12, 8, 1), Op.MUL_MAT, (), (k_cache, q12))
    assert registry.select(kq12, "cuda").name == "cuda_mul_mat_batched"
    assert not registry.select(kq12, "cuda").captures(kq12)  # cuBLAS: never captured
    (w_node,) = _nodes("mul_mat_q8_0", Graph())
    assert registry.select(w_node, "cuda").name == "cuda_mul_mat"
    f16_w = _nodes("mul_mat_f16", Graph())[0]
    assert registry.select(f16_w, "cuda").name == "cuda_mul_mat"  # MMV first, by priority


def test_nodes_outside_the_launchers_are_refused_on_cuda_not_run_on_the_host():
    g = Graph()
    kq = g.tensor(T.F32, (32, 4, 8, 1))
    mask = g.tensor(T.F16, (32, 4, 1, 1))
    alibi = g.tensor(T.F32, kq.ne, Op.SOFT_MAX, (0.125, 8.0), (kq, mask))
    assert registry.select(alibi, "cpu").device == "cpu"
    with pytest.raises(UnsupportedOp, match="on cuda"):
        compile_plan([alibi], "cuda")
    x = g.tensor(T.F32, (8, 8, 1, 1))
    with pytest.raises(UnsupportedOp, match="on cuda"):
        compile_plan([g.tensor(T.F32, (8, 1, 1, 1), Op.SUM_ROWS, (), (x,))], "cuda")


# ------------------------------------------------------------ the xp kernels, on the stand-in


def _host_graph(backend) -> tuple[Device, DeviceBuffer]:
    device = Device(0, backend.name, "host", MemoryPool(1 << 26), backend=backend)
    mem = backend.allocate(1 << 20)
    return device, DeviceBuffer(1, device, 0x1000, 1 << 20, mem)


def _xp_case(name: str, rng) -> tuple[list, list]:
    """(inputs as (type, ne, values), node spec (op, type, ne, params, source indices))."""
    x = rng.standard_normal((3, 8, 16)).astype(np.float32)
    if name == "norm":
        return [(T.F32, (16, 8, 3, 1), x)], [Op.NORM, T.F32, (16, 8, 3, 1), (1e-5,), (0,)]
    if name == "sum_rows":
        return [(T.F32, (16, 8, 3, 1), x)], [Op.SUM_ROWS, T.F32, (1, 8, 3, 1), (), (0,)]
    if name == "clamp":
        return [(T.F32, (16, 8, 3, 1), x)], [Op.CLAMP, T.F32, (16, 8, 3, 1), (-0.5, 0.7), (0,)]
    if name.startswith("argsort"):
        order = int(name.endswith("desc"))
        return [(T.F32, (16, 8, 3, 1), x)], [Op.ARGSORT, T.I32, (16, 8, 3, 1), (order,), (0,)]
    if name == "get_rows_moe":
        probs = rng.random((4, 1, 4), dtype=np.float32)  # (tokens, 1 -> ne02, experts)
        ids = np.stack([rng.permutation(4)[:2] for _ in range(4)]).astype(np.int32)
        return [
            (T.F32, (1, 4, 4, 1), probs.reshape(4, 4, 1)),  # ggml [1, experts, tokens]
            (T.I32, (2, 4, 1, 1), ids),
        ], [Op.GET_ROWS, T.F32, (1, 2, 4, 1), (), (0, 1)]
    if name == "pad":
        pads = (1, 0, 0, 0, 2, 3, 0, 0)  # left and right, in ne0 and ne2
        return [(T.F32, (16, 8, 3, 1), x)], [Op.PAD, T.F32, (17, 8, 8, 1), pads, (0,)]
    if name.startswith("flash_attn"):
        # 40 query rows: more than the CUDA C kernel takes, so the xp kernel runs
        q = rng.standard_normal((4, 40, 64)).astype(np.float32)  # (heads, rows, d)
        k = rng.standard_normal((2, 32, 64)).astype(np.float16)  # 2 kv heads: GQA
        v = rng.standard_normal((2, 32, 64)).astype(np.float16)
        mask = np.zeros((40, 32), np.float16)
        mask[:, 20:] = -np.inf  # the kv positions not yet filled
        mask[1, :5] = -np.inf
        sinks = rng.standard_normal(4).astype(np.float32)
        softcap = 30.0 if name.endswith("softcap") else 0.0
        inputs = [
            (T.F32, (64, 40, 4, 1), q),
            (T.F16, (64, 32, 2, 1), k),
            (T.F16, (64, 32, 2, 1), v),
            (T.F16, (32, 40, 1, 1), mask),
            (T.F32, (4, 1, 1, 1), sinks),
        ]
        params = (0.125, 0.0, softcap)
        return inputs, [Op.FLASH_ATTN_EXT, T.F32, (64, 4, 40, 1), params, (0, 1, 2, 3, 4)]
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name",
    [
        "norm",
        "sum_rows",
        "clamp",
        "argsort_asc",
        "argsort_desc",
        "get_rows_moe",
        "pad",
        "flash_attn",
        "flash_attn_softcap",
    ],
)
def test_xp_kernels_match_the_cpu_kernels(name):
    """The cuda xp kernels (CuPy array code on a GPU) on the strict CuPy stand-in, run by the
    plan runner three times (eager, then captured if the kernel says it can be, then replayed),
    against the CPU kernels; no stream-order or capture violation."""
    from support.strict_cupy import strict_cuda_device

    rng = np.random.default_rng(3)
    inputs, (op, out_type, out_ne, params, srcs) = _xp_case(name, rng)
    results = []
    strict = strict_cuda_device(1 << 26)
    for device in (Device(0, "cpu", "host", MemoryPool(1 << 26), backend=CpuBackend()), strict):
        buf = DeviceBuffer(1, device, 0x1000, 1 << 20, device.backend.allocate(1 << 20))
        g = Graph.__new__(Graph)
        g.buffer, g.used, g.ids = buf, 0, 0
        tensors = []
        for type_, ne, values in inputs:
            t = g.tensor(type_, ne)
            buf.write(t.offset, np.ascontiguousarray(values).tobytes())
            tensors.append(t)
        node = g.tensor(out_type, out_ne, op, params, tuple(tensors[i] for i in srcs))
        assert registry.select(node, device.kind).device == device.kind
        plan = compile_plan([node], device.kind)
        if device is strict:
            modes = [strict.runner.run(plan, "session") for _ in range(3)]
            capturable = all(getattr(step, "capturable", True) for step in plan.steps)
            assert modes == (["eager", "captured", "replayed"] if capturable else ["eager"] * 3)
            strict.backend.cp.assert_clean()
        else:
            plan.run()
        results.append(np.frombuffer(bytes(buf.read(node.offset, node.nbytes)), np.uint8))
    strict.shutdown()
    want, got = results
    if out_type == T.I32:
        assert np.array_equal(got.view(np.int32), want.view(np.int32))
    else:
        # FA: the CPU kernel rounds q to f16 for f16 K like ggml; the xp kernel keeps f32
        tol = 2e-3 if name.startswith("flash_attn") else 2e-6
        want_f, got_f = want.view(np.float32), got.view(np.float32)
        assert np.isfinite(got_f).all()
        assert np.abs(got_f - want_f).max() <= tol * max(np.abs(want_f).max(), 1.0)


def test_products_of_one_input_quantize_it_once_while_nothing_rewrites_it():
    """Q, K and V (gate and up) read one activation: its q8_1 blocks are made once, and made
    again after a step writes those bytes."""
    g = Graph()
    y = g.tensor(T.F32, (256, 1, 1, 1))
    other = g.tensor(T.F32, (256, 1, 1, 1))

    def mm(wt):
        return g.tensor(T.F32, (64, 1, 1, 1), Op.MUL_MAT, (), (g.tensor(wt, (256, 64, 1, 1)), y))

    q, between, k = (
        mm(T.Q8_0),
        g.tensor(T.F32, (256, 1, 1, 1), Op.SCALE, (2.0, 0.0), (other,)),
        mm(T.Q4_0),
    )
    rewrite = g.tensor(T.F32, (256, 1, 1, 1), Op.SCALE, (2.0, 0.0), (other,))
    rewrite.offset = y.offset  # a step that writes the input's bytes
    v = mm(T.Q8_0)
    kq = mm(T.Q4_K)  # another activation format (q8_K): quantized on its own
    compile_plan([q, between, k, rewrite, v, kq], "cuda").run()
    assert _check_launches(g.backend.kernels) == [
        "rpc_quantize_q8_1",
        "rpc_mmvq_q8_0",
        "rpc_unary_f32",
        "rpc_mmvq_q4_0",  # the blocks Q's product left
        "rpc_unary_f32",
        "rpc_quantize_q8_1",  # y was rewritten
        "rpc_mmvq_q8_0",
        "rpc_quantize_q8_1_as_q8_k",
        "rpc_mmvq_q4_K",
    ]


@pytest.mark.parametrize("shared", [False, True])
def test_rms_norm_then_weight_runs_as_one_kernel_unless_the_norm_is_read_elsewhere(shared):
    g = Graph()
    x = g.tensor(T.F32, (256, 4, 1, 1))
    w = g.tensor(T.F32, (256, 1, 1, 1))
    norm = g.tensor(T.F32, x.ne, Op.RMS_NORM, (1e-6,), (x,))
    mul = g.tensor(T.F32, x.ne, Op.MUL, (), (norm, w))
    nodes = [norm, mul]
    if shared:
        nodes.append(g.tensor(T.F32, x.ne, Op.ADD, (), (norm, x)))  # a second reader
    compile_plan(nodes, "cuda").run()
    launched = _check_launches(g.backend.kernels)
    if shared:
        assert launched == ["rpc_rms_norm_f32", "rpc_binary_f32", "rpc_binary_f32"]
    else:
        assert launched == ["rpc_rms_norm_mul_f32"]


def test_a_decode_product_and_the_residual_add_after_it_run_as_one_kernel():
    g = Graph()
    y = g.tensor(T.F32, (256, 1, 1, 1))
    residual = g.tensor(T.F32, (64, 1, 1, 1))
    mm = g.tensor(T.F32, (64, 1, 1, 1), Op.MUL_MAT, (), (g.tensor(T.Q8_0, (256, 64, 1, 1)), y))
    add = g.tensor(T.F32, (64, 1, 1, 1), Op.ADD, (), (mm, residual))
    compile_plan([mm, add], "cuda").run()
    assert _check_launches(g.backend.kernels) == ["rpc_quantize_q8_1", "rpc_mmvq_q8_0"]
    *_, args = g.backend.kernels.calls[-1]
    assert int(args[2].data.ptr) == BASE + add.offset  # written to the ADD's tensor
    assert int(args[3].data.ptr) == BASE + residual.offset  # the residual added in


def test_attention_output_is_written_in_the_order_its_cont_wants():
    """V·KQ [D, T, H] permuted to [D, H, T] and made contiguous: the product writes that order."""
    g = Graph()
    v = g.tensor(T.F16, (32, 64, 2, 1))  # [n_kv, D, H_kv]
    kq = g.tensor(T.F32, (32, 1, 4, 1))  # [n_kv, T, H]
    kqv = g.tensor(T.F32, (64, 1, 4, 1), Op.MUL_MAT, (), (v, kq))
    perm = g.tensor(T.F32, (64, 4, 1, 1), Op.PERMUTE, (0, 2, 1, 3), (kqv,), nb=(4, 256, 256, 1024))
    perm.offset = kqv.offset
    perm.flags = 0  # a view: not computed
    cont = g.tensor(T.F32, (256, 1, 1, 1), Op.CONT, (), (perm,))
    compile_plan([kqv, perm, cont], "cuda").run()
    assert _check_launches(g.backend.kernels) == ["rpc_mmv_f16"]
    *_, args = g.backend.kernels.calls[-1]
    assert int(args[2].data.ptr) == BASE + cont.offset
    assert [int(a) for a in args[-3:-1]] == [64 * 4, 64]  # token stride, head stride


@pytest.mark.parametrize(
    ("mode", "n_dims", "ext_factor", "freqs"),
    [(0, 64, 0.0, False), (2, 64, 0.0, True), (2, 32, 1.0, False), (0, 64, 1.0, True)],
)
def test_rope_on_the_emulated_gpu_matches_the_cpu(mode, n_dims, ext_factor, freqs):
    """ROPE with Llama 3.1's frequency factors, YaRN and partial rotation: the cuda builder
    and kernel (executed by the CPU emulator) against the CPU kernel."""
    from support.strict_cupy import strict_cuda_backend

    rng = np.random.default_rng(5)
    tokens, heads, d = 5, 3, 64
    x = rng.standard_normal((tokens, heads, d)).astype(np.float32)
    pos = np.array([0, 1, 7, 300, 4000], np.int32)
    ff = rng.uniform(1, 8, d // 2).astype(np.float32)
    # n_past, n_dims, mode, n_ctx, n_ctx_orig, base, freq_scale, ext_factor, attn_factor,
    # beta_fast, beta_slow
    params = (0, n_dims, mode, 0, 4096, 500000.0, 0.25, ext_factor, 1.0, 32.0, 1.0)
    results = []
    for backend in (CpuBackend(), strict_cuda_backend()):
        device, buf = _host_graph(backend)
        g = Graph.__new__(Graph)
        g.buffer, g.used, g.ids = buf, 0, 0
        srcs = []
        for type_, ne, values in [
            (T.F32, (d, heads, tokens, 1), x),
            (T.I32, (tokens, 1, 1, 1), pos),
            (T.F32, (d // 2, 1, 1, 1), ff),
        ][: 3 if freqs else 2]:
            t = g.tensor(type_, ne)
            buf.write(t.offset, np.ascontiguousarray(values).tobytes())
            srcs.append(t)
        node = g.tensor(T.F32, (d, heads, tokens, 1), Op.ROPE, params, tuple(srcs))
        assert registry.select(node, device.kind).device == device.kind
        compile_plan([node], device.kind).run()
        backend.synchronize()
        results.append(np.frombuffer(buf.read(node.offset, node.nbytes), np.float32).copy())
    want, got = results
    # angles in float32 both ways (the CPU steps theta by products, the GPU by powf)
    assert np.abs(got - want).max() <= 2e-4 * np.abs(want).max(), np.abs(got - want).max()
