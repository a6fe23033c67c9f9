"""Every CUDA kernel source compiles with NVRTC for sm_80 and sm_90, with no driver or GPU.

Uses `cuda-bindings` and the `nvidia-cuda-nvrtc-cu12` wheel (both in the `test` extra): NVRTC is a
pure compiler library, so this runs on CPU-only CI machines and catches kernel build breaks
before a GPU session does. The PTX must contain every extern "C" kernel the host code launches.
"""

from __future__ import annotations

import re

import pytest
from rpcnet.compute.cuda import sources

ARCHS = [(8, 0), (9, 0)]


def _check(result) -> None:
    from cuda.bindings import nvrtc

    err = result[0] if isinstance(result, tuple) else result
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"NVRTC: {err}"


def compile_ptx(name: str, arch: tuple[int, int]) -> tuple[str, str]:
    """(ptx, log) of compiling module `name` for `arch`; fails the test on any compile error."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(
        sources.module_source(name).encode(), f"{name}.cu".encode(), 0, [], []
    )
    _check(err)
    try:
        opts = [o.encode() for o in (*sources.COMPILE_OPTIONS, sources.arch_option(*arch))]
        (compile_err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, log_size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(err)
        # NVRTC writes into the buffer: a bytearray, never a bytes object (b" " * 1 is
        # CPython's shared one-byte b" ", which a one-byte log would overwrite for the process)
        log = bytearray(log_size)
        _check(nvrtc.nvrtcGetProgramLog(prog, log))
        log_text = log.decode(errors="replace").rstrip("\x00 \n")
        assert compile_err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"{name}.cu for {arch}:\n{log_text}"
        err, ptx_size = nvrtc.nvrtcGetPTXSize(prog)
        _check(err)
        ptx = bytearray(ptx_size)
        _check(nvrtc.nvrtcGetPTX(prog, ptx))
        return ptx.decode(errors="replace"), log_text
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def test_there_are_modules():
    assert set(sources.expected_kernels()) <= set(sources.module_names())


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: f"sm_{a[0]}{a[1]}")
@pytest.mark.parametrize("name", sources.module_names())
def test_module_compiles(name, arch):
    ptx, log = compile_ptx(name, arch)
    assert "warning" not in log.lower(), log
    entries = set(re.findall(r"\.visible \.entry (\w+)\(", ptx))
    assert entries, f"{name}.cu defines no kernel"
    missing = sources.expected_kernels().get(name, set()) - entries
    assert not missing, f"{name}.cu lacks kernels the host launches: {sorted(missing)}"
