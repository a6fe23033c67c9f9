"""Which of ggml-cpu's SIMD code paths this host runs (they round differently from the _ref codecs).

The reference CPU backend picks its arch/x86 kernels when the CPU has AVX; rpcnet's CPU device
reproduces the same rounding so that both servers give the same numbers on the same machine.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

_X86 = {"x86_64", "amd64", "i386", "i686"}


@functools.cache
def host_has_avx() -> bool:
    """True on an x86 CPU with AVX (Linux: /proc/cpuinfo flags; elsewhere assumed on x86-64)."""
    if platform.machine().lower() not in _X86:
        return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # every x86-64 CPU of the last decade has AVX
    for line in text.splitlines():
        if line.startswith("flags"):
            return "avx" in line.split(":", 1)[1].split()
    return True
