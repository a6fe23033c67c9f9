"""Every launcher in compute/cuda/launch.py passes its kernel exactly the parameters the compiled
kernel declares: same count, same sizes, floats where the PTX has .f32 — checked against the
PTX NVRTC produces for sm_90, without a GPU. (A wrong argument list would otherwise only show on
a GPU, as garbage or an illegal address.) Also checks grid/block shapes are sane."""

from __future__ import annotations

import contextlib
import re
from types import SimpleNamespace

import numpy as np
import pytest
from rpcnet.compute.cuda import launch, launch_attention, sources
from rpcnet.compute.cuda.kernels.common import FA_KV_PAIRS
from test_cuda_nvrtc import compile_ptx

_PTX: dict[str, dict[str, list[str]]] = {}


def ptx_params(module: str, kernel: str) -> list[str]:
    """The PTX parameter types (.u64, .u32, .f32, ...) of `kernel` in `module`."""
    if module not in _PTX:
        ptx, _ = compile_ptx(module, (9, 0))
        entries = {}
        for m in re.finditer(r"\.visible \.entry (\w+)\(([^)]*)\)", ptx):
            entries[m.group(1)] = re.findall(r"\.param \.(\w+) ", m.group(2))
        _PTX[module] = entries
    return _PTX[module][kernel]


class DevArray:
    """Stands in for a CuPy array: the launchers only read shape, dtype, size and data.ptr."""

    def __init__(self, shape, dtype, ptr: int = 1 << 20) -> None:
        self.shape = tuple(shape) if isinstance(shape, tuple) else (shape,)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.data = SimpleNamespace(ptr=ptr)
        self.strides = tuple(
            int(np.prod(self.shape[i + 1 :])) * self.dtype.itemsize for i in range(len(self.shape))
        )


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, tuple, tuple, tuple]] = []

    def function(self, module: str, kernel: str):
        def call(grid, block, args):
            self.calls.append((module, kernel, grid, block, args))

        return call


def fake_backend() -> SimpleNamespace:
    return SimpleNamespace(
        kernels=Recorder(),
        device=contextlib.nullcontext(),
        stream=contextlib.nullcontext(),
        cp=SimpleNamespace(float32=np.dtype(np.float32), float16=np.dtype(np.float16)),
    )


def _kind(arg) -> tuple[int, bool]:
    """(bytes, is_float) of one packed argument."""
    if isinstance(arg, DevArray):
        return 8, False
    assert isinstance(arg, np.generic), f"unpacked Python argument {arg!r}"
    return arg.dtype.itemsize, arg.dtype.kind == "f"


def _ptx_kind(t: str) -> tuple[int, bool]:
    return int(t[1:]) // 8, t.startswith("f")


def launches():
    """(label, callable(be)) for every launcher, with small shapes."""
    f32, f16, u8, i32 = np.float32, np.float16, np.uint8, np.int32
    out = []
    for t in sources.WEIGHT_TYPES:  # wide rows: the row-splitting kernels
        out.append(
            (
                f"matvec split {t}",
                lambda be, t=t: launch.matvec(
                    be,
                    t,
                    DevArray(launch.row_bytes(t, 4096) * 8, u8),
                    DevArray((2, 4096), f32),
                    DevArray((2, 8), f32),
                    4096,
                    8,
                    2,
                    DevArray(launch.q8_1_bytes(4096, 2), u8),
                ),
            )
        )
    for t in sources.WEIGHT_TYPES:
        k, m, n = 512, 64, 3
        out.append(
            (
                f"matvec {t}",
                lambda be, t=t, k=k, m=m, n=n: launch.matvec(
                    be,
                    t,
                    DevArray(launch.row_bytes(t, k) * m, u8),
                    DevArray((n, k), f32),
                    DevArray((n, m), f32),
                    k,
                    m,
                    n,
                    DevArray(launch.q8_1_bytes(k, n), u8),
                ),
            )
        )
        out.append(
            (
                f"matvec_id {t}",
                lambda be, t=t, k=k, m=m: launch.matvec_id(
                    be,
                    t,
                    DevArray(launch.row_bytes(t, k) * m * 4, u8),
                    DevArray((3, 1, k), f32),
                    DevArray((3, 2), i32),
                    DevArray((3, 2, m), f32),
                    k,
                    m,
                    DevArray(launch.q8_1_bytes(k, 3), u8),
                ),
            )
        )
        for o in ("f16", "f32"):
            out.append(
                (
                    f"dequantize {t} {o}",
                    lambda be, t=t, o=o: launch.dequantize(
                        be,
                        t,
                        DevArray(launch.row_bytes(t, 512) * 4, u8),
                        DevArray((4, 512), f32),
                        512,
                        4,
                        o,
                    ),
                )
            )
        out.append(
            (
                f"get_rows {t}",
                lambda be, t=t: launch.get_rows(
                    be,
                    t,
                    DevArray(launch.row_bytes(t, 256) * 8, u8),
                    DevArray(5, i32),
                    DevArray((5, 256), f32),
                    256,
                ),
            )
        )
    out.append(
        (
            "rms_norm",
            lambda be: launch.rms_norm(be, DevArray((4, 256), f32), DevArray((4, 256), f32), 1e-6),
        )
    )
    out.append(
        (
            "rms_norm_mul",
            lambda be: launch.rms_norm(
                be, DevArray((4, 256), f32), DevArray((4, 256), f32), 1e-6, DevArray(256, f32)
            ),
        )
    )
    for mask in (None, f32, f16):
        out.append(
            (
                f"soft_max {mask}",
                lambda be, mask=mask: launch_attention.soft_max(
                    be,
                    DevArray((2, 3, 64), f32),
                    DevArray((2, 3, 64), f32),
                    0.5,
                    None if mask is None else DevArray((3, 64), mask),
                    DevArray(2, f32),
                ),
            )
        )
    out.append(
        (
            "rope",
            lambda be: launch.rope_neox_or_normal(
                be,
                DevArray((3, 2, 64), f32),
                DevArray(3, i32),
                DevArray((3, 2, 64), f32),
                64,
                2,
                1e4,
            ),
        )
    )
    out.append(
        (
            "glu",
            lambda be: launch.glu(
                be, DevArray((3, 64), f32), DevArray((3, 64), f32), DevArray((3, 64), f32), 2
            ),
        )
    )
    for kv in ("F16", "Q8_0", "BF16"):
        out.append(
            (
                f"flash_attn {kv}",
                lambda be, kv=kv: launch_attention.flash_attn_decode(
                    be,
                    DevArray((4, 1, 128), f32),
                    DevArray((2, 10, launch.row_bytes(kv, 128)), u8),
                    DevArray((2, 10, launch.row_bytes(kv, 128)), u8),
                    DevArray((1, 10), f16),
                    DevArray((1, 4, 128), f32),
                    kv,
                    0.1,
                    0.0,
                    DevArray(4, f32),
                ),
            )
        )
    for kv in sorted(FA_KV_PAIRS):
        out.append(
            (
                f"flash_attn_views {kv}",
                lambda be, kv=kv: launch_attention.flash_attn_views(
                    be,
                    kv,
                    (
                        DevArray((1, 4, 1, 128), f32),
                        DevArray(4096, u8),
                        DevArray(4096, u8),
                        DevArray(512, u8),
                        None,
                        DevArray((1, 1, 4, 128), f32),
                    ),
                    (128, 128, 1, 10, 4, 2, 1),
                    (128, 128, 512, 512, 256, 5120, 512, 256, 5120, 256, 0, 0),
                    (1, 1),
                    0.1,
                    0.0,
                    0.0,
                ),
            )
        )
    for t in ("F32", "F16", "BF16"):
        out.append(
            (
                f"matvec_strided {t}",
                lambda be, t=t: launch.matvec_strided(
                    be,
                    t,
                    DevArray(1 << 16, u8),
                    DevArray((4, 1, 64), f32),
                    DevArray((4, 1, 256), f32),
                    64,
                    256,
                    1,
                    4,
                    (1024, 128, 256, 64, 256, 256),
                    2,
                ),
            )
        )
    for t in ("F32", "F16", "BF16", "Q8_0"):
        for ids_type in (np.int64, i32):
            out.append(
                (
                    f"set_rows {t} {ids_type.__name__}",
                    lambda be, t=t, it=ids_type: launch.set_rows(
                        be,
                        DevArray((3, 64), f32),
                        DevArray(3, it),
                        DevArray(launch.row_bytes(t, 64) * 8, u8),
                        t,
                    ),
                )
            )
    as_dtype = {"f32": f32, "f16": f16}
    for a in ("f32", "f16", "bf16"):
        for b in ("f32", "f16", "bf16"):
            sa = (
                (DevArray((4, 64), np.uint16), "bf16")
                if a == "bf16"
                else DevArray((4, 64), as_dtype[a])
            )
            db = (
                (DevArray((64, 4), np.uint16), "bf16")
                if b == "bf16"
                else DevArray((64, 4), as_dtype[b])
            )
            out.append((f"cpy {a} {b}", lambda be, sa=sa, db=db: launch.cpy(be, sa, db)))
    return out


@pytest.mark.parametrize("label,run", launches(), ids=[label for label, _ in launches()])
def test_launch_arguments_match_the_kernel(label, run):
    be = fake_backend()
    run(be)
    assert be.kernels.calls, label
    for module, kernel, grid, block, args in be.kernels.calls:
        params = ptx_params(module, kernel)
        assert len(args) == len(params), f"{kernel}: {len(args)} args, PTX has {len(params)}"
        for i, (arg, t) in enumerate(zip(args, params, strict=True)):
            assert _kind(arg) == _ptx_kind(t), f"{kernel} param {i}: {arg!r} vs .{t}"
        assert all(isinstance(g, int) and g >= 1 for g in grid), (kernel, grid)
        assert all(isinstance(b, int) and b >= 1 for b in block), (kernel, block)
        assert int(np.prod(block)) <= 1024, (kernel, block)


def test_matvec_rejects_misaligned_weights():
    be = fake_backend()
    with pytest.raises(ValueError, match="aligned"):
        launch.matvec(
            be,
            "Q4_K",
            DevArray(144 * 8, np.uint8, ptr=(1 << 20) + 2),
            DevArray((1, 256), np.float32),
            DevArray((1, 8), np.float32),
            256,
            8,
            1,
            DevArray(36 * 8, np.uint8),
        )


def test_row_launchers_stay_inside_grid_y_with_more_rows_than_it_holds():
    """pp512 with FA off writes the transposed V cache as 512 * n_embd_v one-element rows; the
    launchers clamp grid.y and pass the row count for the kernels' row loop."""
    f32, u8 = np.float32, np.uint8
    n = 70001
    runs = {
        "set_rows": lambda be: launch.set_rows(
            be, DevArray((n, 1), f32), DevArray(n, np.int64), DevArray(2 * n, u8), "F16"
        ),
        "set_rows_q8_0": lambda be: launch.set_rows(
            be, DevArray((n, 32), f32), DevArray(n, np.int64), DevArray(34 * n, u8), "Q8_0"
        ),
        "dequantize": lambda be: launch.dequantize(
            be, "Q8_0", DevArray(34 * n, u8), DevArray(32 * n, f32), 32, n, "f32"
        ),
        "get_rows": lambda be: launch.get_rows(
            be, "F32", DevArray(128 * n, u8), DevArray(n, np.int32), DevArray((n, 32), f32), 32
        ),
        "glu": lambda be: launch.glu(
            be, DevArray((n, 32), f32), DevArray((n, 32), f32), DevArray((n, 32), f32), 2
        ),
        "rope": lambda be: launch.rope_neox_or_normal(
            be,
            DevArray((n, 1, 32), f32),
            DevArray(n, np.int32),
            DevArray((n, 1, 32), f32),
            32,
            0,
            1e4,
        ),
    }
    for label, run in runs.items():
        be = fake_backend()
        run(be)
        ((_, kernel, grid, _, args),) = be.kernels.calls
        assert grid[1] == launch.MAX_GRID_YZ, (label, grid)
        assert int(args[-1]) == n, (label, kernel, "the row count is the last argument")


@pytest.mark.parametrize(
    ("grid", "block"),
    [
        ((1, 65536), (256,)),
        ((1, 1, 65536), (32,)),
        ((0,), (32,)),
        ((1,), (1025,)),
        ((1,), (1, 1, 65)),
    ],
)
def test_launches_outside_cuda_limits_are_refused(grid, block):
    with pytest.raises(launch.LaunchLimitError):
        launch.check_launch(grid, block)
    launch.check_launch(((1 << 31) - 1, 65535, 65535), (32, 32))  # the largest allowed
