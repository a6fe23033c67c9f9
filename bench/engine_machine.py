"""What the machine can do (memory bandwidth, FMA peak) and what a model asks of it per token.

Bandwidth: a NumPy copy of a 256 MiB array (bytes read + bytes written per second, best of a
few), on one thread and on two threads copying halves at once (NumPy drops the GIL in copies).
FMA peak: measured, one thread per core running independent AVX2 FMAs at once
(`fma_probe.rs`, built here with rustc: a virtual machine's /proc/cpuinfo clock is often not the
one it runs at); cores x that clock x 32 flops/cycle where the probe is unavailable. Plus a
measured NumPy (BLAS) f32 matmul for what a library actually reaches.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

COPY_BYTES = 256 << 20
FLOPS_PER_CYCLE_AVX2 = 2 * 8 * 2


def best_seconds(run, repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``run``, in seconds (noise only adds)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return best


def copy_bandwidth(threads: int, nbytes: int = COPY_BYTES, repeats: int = 5) -> float:
    """GB/s (read + write) of np.copyto over ``nbytes``, split across ``threads`` threads."""
    src = np.ones(nbytes // 8)
    dst = np.zeros_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]

    def run() -> None:
        workers = [threading.Thread(target=np.copyto, args=(dst[a:b], src[a:b])) for a, b in bounds]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    run()  # first touch
    return 2 * src.nbytes / best_seconds(run, repeats) / 1e9


def cpu_times() -> tuple[int, int, int]:
    """(busy, steal, total) jiffies of all CPUs since boot, from /proc/stat."""
    # the "cpu" line: user nice system idle iowait irq softirq steal (guest time is in user)
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return user + nice + system + irq + softirq, steal, sum(fields)


def busy_cores(seconds: float = 3.0) -> float:
    """Cores kept busy by other processes (or taken by the hypervisor) while this one sleeps:
    unlike the 1-minute load average, it does not still count a job that ended a minute ago."""
    b0, s0, t0 = cpu_times()
    time.sleep(seconds)
    b1, s1, t1 = cpu_times()
    cores = os.cpu_count() or 1
    return cores * ((b1 - b0) + (s1 - s0)) / max(t1 - t0, 1)


def cpu_mhz() -> float | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    found = re.findall(r"^cpu MHz\s*:\s*([\d.]+)", text, re.M)
    return max(float(x) for x in found) if found else None


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    found = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(found.group(1).split()) if found else set()


PROBE_SOURCE = Path(__file__).with_name("fma_probe.rs")


def _probe_binary() -> Path | None:
    """`fma_probe.rs` built with rustc -O (once per source version, in the temp dir)."""
    rustc = shutil.which("rustc")
    if rustc is None:
        return None
    digest = hashlib.sha256(PROBE_SOURCE.read_bytes()).hexdigest()[:16]
    binary = Path(tempfile.gettempdir()) / f"rpcnet-fma-probe-{digest}"
    if not binary.exists():
        partial = binary.with_suffix(f".{os.getpid()}")
        built = subprocess.run(
            [rustc, "-O", "--edition", "2021", "-o", str(partial), str(PROBE_SOURCE)],
            capture_output=True,
            check=False,
        )
        if built.returncode != 0:
            return None
        partial.replace(binary)
    return binary


def fma_gflops_per_core(threads: int) -> float | None:
    """Measured FMA throughput per core with `threads` threads running at once."""
    binary = _probe_binary()
    if binary is None:
        return None
    ran = subprocess.run(
        [str(binary), "200000000", str(max(threads, 1))],
        capture_output=True,
        text=True,
        check=False,
    )
    found = ran.stdout.split()
    if ran.returncode != 0 or not found or "none" in found:
        return None
    # the best thread: one descheduled for a moment (a busy VM) only measures less
    return max(float(f) for f in found) / 1e9


def sgemm_gflops(n: int = 2048, repeats: int = 3) -> float:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.T.copy()
    a @ b
    return 2 * n**3 / best_seconds(lambda: a @ b, repeats) / 1e9


@dataclass
class Machine:
    cores: int
    mhz: float | None
    fma: bool
    avx512: bool
    copy_gbs_1t: float
    copy_gbs_nt: float
    sgemm_gflops: float
    fma_gflops_core: float | None = None  # measured, per core

    @property
    def bandwidth_gbs(self) -> float:
        return max(self.copy_gbs_1t, self.copy_gbs_nt)

    def fma_peak_gflops(self, threads: int) -> float | None:
        cores = min(threads, self.cores)
        if self.fma_gflops_core is not None:
            return cores * self.fma_gflops_core
        if self.mhz is None:
            return None
        return cores * self.mhz * 1e6 * FLOPS_PER_CYCLE_AVX2 / 1e9

    def effective_mhz(self) -> float | None:
        """The clock the measured FMA rate implies (32 flops/cycle), else /proc's."""
        if self.fma_gflops_core is not None:
            return self.fma_gflops_core * 1e3 / FLOPS_PER_CYCLE_AVX2
        return self.mhz


def measure(threads: int) -> Machine:
    flags = cpu_flags()
    return Machine(
        cores=os.cpu_count() or 1,
        mhz=cpu_mhz(),
        fma="fma" in flags and "avx2" in flags,
        avx512="avx512f" in flags,
        copy_gbs_1t=copy_bandwidth(1),
        copy_gbs_nt=copy_bandwidth(max(threads, 1)),
        sgemm_gflops=sgemm_gflops(),
        fma_gflops_core=fma_gflops_per_core(threads),
    )


@dataclass(frozen=True)
class ModelCost:
    """Per-token work of a llama GGUF: bytes of weights read, flops of its matmuls."""

    weight_bytes: int  # every tensor but token_embd (read once per decoded token), + one row
    layer_params: int  # elements of the per-layer matrices (2 flops each per token)
    output_params: int  # elements of the output head (prefill computes it for the last token)
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int

    def kv_bytes(self, n_ctx: int, bytes_per_value: int = 2) -> int:
        """K and V read by one decoded token at context length ``n_ctx`` (f16 cache)."""
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * n_ctx * bytes_per_value

    def decode_bytes(self, n_ctx: int) -> int:
        return self.weight_bytes + self.kv_bytes(n_ctx)

    def prefill_flops(self, n: int, n_past: int = 0) -> float:
        """Useful flops of a batch of ``n`` tokens after ``n_past``: matmuls + causal attention."""
        attn_pairs = n * n_past + n * (n + 1) / 2
        attention = 4 * self.n_layer * self.n_head * self.head_dim * attn_pairs
        return 2 * self.layer_params * n + 2 * self.output_params + attention


def model_cost(path: Path) -> ModelCost:
    import gguf

    reader = gguf.GGUFReader(str(path))

    def field(key: str) -> int:
        f = reader.fields[key]
        return int(f.parts[f.data[0]][0])

    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    n_embd, n_head = field(f"{arch}.embedding_length"), field(f"{arch}.attention.head_count")
    weight_bytes = layer_params = output_params = 0
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            weight_bytes += int(t.n_bytes) // int(t.shape[-1])  # one row per token
            continue
        weight_bytes += int(t.n_bytes)
        if len(t.shape) >= 2:
            if t.name.startswith("output"):
                output_params += int(t.n_elements)
            else:
                layer_params += int(t.n_elements)
    return ModelCost(
        weight_bytes=weight_bytes,
        layer_params=layer_params,
        output_params=output_params,
        n_layer=field(f"{arch}.block_count"),
        n_head=n_head,
        n_head_kv=field(f"{arch}.attention.head_count_kv"),
        head_dim=n_embd // n_head,
    )
