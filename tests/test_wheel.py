"""The wheel from tools/build_wheels.sh installs into a fresh venv without Rust and serves a real
llama.cpp client. Slow (a release build of the extension when not cached): marked `slow`.

No network: the runtime dependencies are copied from this environment into the new venv (their
dist-info included, so `pip check` verifies the wheel's requirements), then the wheel is installed
with `--no-index --no-deps`. The server runs from the venv's `rpcnet` script, outside the repo.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from support import refenv
from support.clients import generate
from support.serve import wait_listening
from support.tinymodel import write_tiny_llama

REPO = Path(__file__).resolve().parent.parent
RUNTIME_DEPS = ("numpy", "threadpoolctl", "uvloop", "prometheus_client")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def no_rust_env() -> dict[str, str]:
    """PATH without cargo/rustc, so nothing could compile Rust even if it tried."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join(
        p for p in env["PATH"].split(os.pathsep) if not (Path(p) / "cargo").exists()
    )
    for var in ("PYTHONPATH", "CARGO_HOME", "RUSTUP_HOME", "VIRTUAL_ENV"):
        env.pop(var, None)
    return env


def copy_distribution(name: str, site: Path) -> None:
    dist = md.distribution(name)
    for f in dist.files or ():
        src = Path(dist.locate_file(f))
        if not src.is_file() or ".." in Path(f).parts:
            continue  # console scripts outside site-packages are not needed
        dst = site / f
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)


def test_wheel_installs_and_serves_a_real_client(tmp_path):
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    dist = tmp_path / "dist"
    build = subprocess.run(
        ["bash", str(REPO / "tools" / "build_wheels.sh"), str(dist)],
        env=dict(os.environ, VERSIONS=version, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    (wheel,) = dist.glob(f"rpcnet-*-{tag}-{tag}-manylinux_2_28_x86_64.whl")

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
        ).strip()
    )
    assert site != Path(sysconfig.get_paths()["purelib"])
    for name in RUNTIME_DEPS:
        copy_distribution(name, site)
    env = no_rust_env()
    pip = [str(py), "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "install", "--no-index", "--no-deps", str(wheel)],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    check = subprocess.run([*pip, "check"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    where = subprocess.check_output(
        [str(py), "-c", "import rpcnet._native as n; print(n.__file__)"], env=env, cwd=tmp_path
    )
    assert Path(where.decode().strip()).is_relative_to(site)

    port = refenv.free_port()
    proc = subprocess.Popen(
        [str(venv / "bin" / "rpcnet"), "serve", "--port", str(port), "--mem", "2G"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_listening(port, proc)
        model = write_tiny_llama(tmp_path / "tiny.gguf")
        tokens = "1,5,9,300,42,7"
        ours = generate(model, port, tokens, tmp_path / "rpc", timeout=240)
        local = generate(model, "local", tokens, tmp_path / "local", timeout=240)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    got, ref = np.load(ours["logits_path"]), np.load(local["logits_path"])
    assert got.shape == ref.shape and np.isfinite(got).all()
    # The f32 tolerance of the end-to-end suite: max |diff| relative to max |logit|.
    assert np.abs(got - ref).max() <= 2e-3 * np.abs(ref).max()
    assert "closed after" in out
