"""Registers, spills and shared memory of every CUDA kernel, as ptxas assembles it for sm_90.

The PTX comes from NVRTC (the `cuda-bindings` NVRTC of the test extra), the machine code from
the CUDA 13 `ptxas` of the `nvidia-cuda-nvcc` wheel: no GPU or driver is needed.

    python tools/ptxas_report.py            # prints the markdown table
    python tools/ptxas_report.py --write    # replaces the table in docs/gpu.md
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

DOC = REPO / "docs" / "gpu.md"
BEGIN, END = "<!-- ptxas table: begin -->", "<!-- ptxas table: end -->"
ARCH = (9, 0)


@dataclass
class KernelUse:
    module: str
    kernel: str
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    smem: int


def ptxas_path() -> Path:
    """The CUDA 13 ptxas of the nvidia-cuda-nvcc wheel."""
    import nvidia  # the namespace package the NVIDIA wheels install into

    for root in nvidia.__path__:
        for candidate in sorted(Path(root).glob("cu*/bin/ptxas"), reverse=True):
            return candidate
    raise FileNotFoundError("ptxas not found: pip install 'nvidia-cuda-nvcc>=13'")


def ptxas_version() -> str:
    out = subprocess.run([ptxas_path(), "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


_FUNC = re.compile(r"Compiling entry function '(\w+)' for 'sm_\d+'")
_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?")


def parse(module: str, text: str) -> list[KernelUse]:
    """ptxas -v output -> one KernelUse per entry function."""
    rows: list[KernelUse] = []
    current: KernelUse | None = None
    for line in text.splitlines():
        if m := _FUNC.search(line):
            current = KernelUse(module, m.group(1), 0, 0, 0, 0, 0)
            rows.append(current)
        elif current is not None and (m := _STACK.search(line)):
            current.stack, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif current is not None and (m := _USED.search(line)):
            current.registers = int(m.group(1))
            current.smem = int(m.group(2) or 0)
    return rows


def report() -> list[KernelUse]:
    from rpcnet.compute.cuda import sources
    from test_cuda_nvrtc import compile_ptx

    rows: list[KernelUse] = []
    with tempfile.TemporaryDirectory() as tmp:
        for module in sources.module_names():
            ptx, _ = compile_ptx(module, ARCH)
            path = Path(tmp) / f"{module}.ptx"
            path.write_text(ptx.rstrip("\x00"))
            out = subprocess.run(
                [ptxas_path(), f"-arch=sm_{ARCH[0]}{ARCH[1]}", "-v", "-o", "/dev/null", path],
                capture_output=True,
                text=True,
                check=True,
            )
            rows += parse(module, out.stderr + out.stdout)
    return sorted(rows, key=lambda r: (r.module, r.kernel))


def markdown(rows: list[KernelUse]) -> str:
    lines = [
        f"`python tools/ptxas_report.py --write` ({ptxas_version()}, sm_90, PTX from NVRTC):",
        "",
        "| module | kernel | registers | spill stores / loads (B) | stack (B) | static smem (B) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.module} | `{r.kernel}` | {r.registers} | {r.spill_stores} / {r.spill_loads} "
            f"| {r.stack} | {r.smem} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"replace the table in {DOC.name}")
    args = ap.parse_args(argv)
    table = markdown(report())
    if not args.write:
        print(table)
        return 0
    text = DOC.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOC.write_text(text[:start] + "\n" + table + "\n" + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
