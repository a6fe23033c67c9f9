"""Every CUDA kernel assembles for sm_90 with the CUDA 13 ptxas (no GPU, no driver), none on a
hot path spills registers to local memory, and docs/gpu.md's ptxas table names every kernel."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: kernels off every hot path that may spill a few bytes, with why
COLD = {"rpc_flash_attn_f16_q8_0": "a K cache of f16 with a V cache of q8_0 (mixed types)"}


def _report_module():
    spec = importlib.util.spec_from_file_location("ptxas_report", REPO / "tools/ptxas_report.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_no_kernel_spills_and_the_docs_table_lists_every_kernel():
    from rpcnet.compute.cuda import sources

    ptxas = _report_module()
    rows = ptxas.report()
    assert {r.kernel for r in rows} == set().union(*sources.expected_kernels().values())
    spilling = [r for r in rows if (r.spill_stores or r.spill_loads) and r.kernel not in COLD]
    assert not spilling, spilling
    doc = ptxas.DOC.read_text()
    table = doc[doc.index(ptxas.BEGIN) : doc.index(ptxas.END)]
    missing = [r.kernel for r in rows if f"`{r.kernel}`" not in table]
    assert not missing, f"docs/gpu.md: run tools/ptxas_report.py --write ({missing[:5]}...)"
