"""The device check's dry run (`bash bench/gpu_check.sh --dry-run DIR`): every stage of the GPU
check on this CPU machine, the CUDA kernels executed by the emulator, leaves exactly the two
files a device run leaves, with `"ok": true` only if every stage passed."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_dry_run_passes_every_stage_and_writes_the_summary(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--dry-run", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.tar.gz", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["dry_run"]
    assert summary["rc"] == {"tests": 0, "e2e": 0, "bench": 0, "speed": 0}
    assert summary["tests"]["tests"] >= 100 and summary["tests"]["skipped"] == 0
    emulated = [c for c in summary["e2e_cases"] if c.get("case", "").startswith("cuda-emulated")]
    assert len(emulated) >= 5
    assert set(summary["speed"]) == {"q8_0", "Q4_K_M", "f16"}
    assert all("tg" in r and "error" not in r for r in summary["speed"].values())
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"check.log", "gpu_tests.xml", "gpu_e2e.xml", "gpu_speed.json"} <= names
