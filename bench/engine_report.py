"""Markdown for the engine benchmark's results (the JSON document bench_engine.py writes)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

BUSY_CORES = 0.5  # cores busy before a run above this: someone else is computing
LOAD_IDLE = 1.0  # the same for results that recorded only the 1-minute load average


def median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def _ratio_cell(ours: float | None, ref: float | None, unit: str = "") -> str:
    if ours is None or ref is None or ref == 0:
        return "—"
    return f"**{ours / ref:.2f}×** ({ours:.1f} / {ref:.1f}{unit})"


def speed_metrics(depth: int, pp: list[int], tg: int) -> list[tuple[str, str, str]]:
    """(key, row label, target) of each speed metric, in table order."""
    rows = [(f"tg{tg}", f"decode tg{tg}", "≥ 1.0×")]
    rows += [(f"pp{n}", f"prefill pp{n}", "≥ 1.2×") for n in pp]
    for fa, name in ((0, "off"), (1, "on")):
        if depth:
            rows.append((f"pp{depth}_fa{fa}", f"prefill pp{depth}, FA {name}", "—"))
            rows.append(
                (f"tg{tg}@{depth}_fa{fa}", f"decode tg{tg} after {depth}, FA {name}", "≥ 1.0×")
            )
    return rows


def _speed(entry: dict, side: str, key: str) -> float | None:
    return median(entry.get("speed", {}).get(side, {}).get(key))


def model_table(model: dict, config: dict, machine: dict) -> list[str]:
    types = list(model["types"])
    tg = config["tg"]
    lines = [
        "| rpcnet / reference | " + " | ".join(types) + " | target |",
        "|---|" + "---|" * len(types) + "---|",
    ]

    def row(label: str, cells: list[str], target: str) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {target} |")

    for key, label, target in speed_metrics(config["depth"], config["pp"], tg):
        cells = [
            _ratio_cell(_speed(e, "ours", key), _speed(e, "ref", key))
            for e in model["types"].values()
        ]
        if any(c != "—" for c in cells):
            row(label + " (tok/s)", cells, target)
    entries = list(model["types"].values())
    bw = machine["bandwidth_gbs"]
    peak = machine.get("fma_peak_gflops") or 0.0
    pmax = max(config["pp"]) if config["pp"] else None

    def has(key: str) -> bool:
        return any(key in e for e in entries)

    # (shown, label, cell of one type's entry, target)
    rows: list[tuple[bool, str, Callable[[dict], str], str]] = [
        (
            has("memory"),
            "server peak RSS, one client loads + decodes (MiB; lower is better)",
            lambda e: _ratio_cell(_mem(e, "ours", "peak_mib"), _mem(e, "ref", "peak_mib")),
            "≤ 1.2×",
        ),
        (
            has("memory"),
            "RSS after the client left − baseline, rpcnet (reference), MiB",
            _left_cell,
            "≤ 64 MiB",
        ),
        (has("multi"), "N clients at once: slowest client × N / solo", _multi_cell, "≥ 1.0×"),
        (
            True,
            f"decode GB/s, rpcnet (reference), share of {bw:.1f} GB/s measured",
            lambda e: _gbs_cell(e, tg, bw),
            "",
        ),
        (
            pmax is not None and peak > 0,
            f"prefill pp{pmax} GFLOP/s, rpcnet (reference), share of {peak:.0f} peak",
            lambda e: _gflops_cell(e, pmax or 0, peak),
            "",
        ),
        (
            has("profile"),
            "decode step ms: outside kernels / whole step, rpcnet (reference step)",
            _host_cell,
            "",
        ),
    ]
    for shown, label, cell, target in rows:
        if shown:
            row(label, [cell(e) for e in entries], target)
    return lines


def _mem(entry: dict, side: str, key: str) -> float | None:
    return entry.get("memory", {}).get(side, {}).get(key)


def _ours_ref_cell(values: list[float | None], spec: str, peak: float | None = None) -> str:
    """ "ours (ref)" of the two sides' ``values`` formatted with ``spec``, with ours' share of
    ``peak`` when given; a dash for a missing value."""
    ours, ref = values
    if ours is None:
        return "—"
    cell = f"{ours:{spec}} ({'—' if ref is None else format(ref, spec)})"
    return cell if peak is None else f"{cell}; {ours / peak:.0%}"


def _left_cell(entry: dict) -> str:
    values = []
    for side in ("ours", "ref"):
        after, base = _mem(entry, side, "after_mib"), _mem(entry, side, "baseline_mib")
        values.append(None if after is None or base is None else after - base)
    return _ours_ref_cell(values, "+.0f")


def _multi_cell(entry: dict) -> str:
    multi = entry.get("multi")
    if not multi:
        return "—"
    return (
        f"**{multi['ratio']:.2f}×** (N={multi['n']}"
        + (f", tg{multi['tg']} each" if "tg" in multi else "")
        + ": "
        + ", ".join(f"{v:.1f}" for v in multi["each"])
        + f" vs solo {multi['solo']:.1f} tok/s"
        + (
            f" (the median of {len(multi['ratios'])} shared runs: "
            + ", ".join(f"{v:.2f}×" for v in multi["ratios"])
            + "; solo runs between them: "
            + " / ".join(f"{v:.1f}" for v in multi["solo_runs"])
            + ")"
            if "ratios" in multi
            else ""
        )
        + (f"; peak RSS {multi['peak_mib']:.0f} MiB" if "peak_mib" in multi else "")
        + ")"
    )


def _scaled_speeds(entry: dict, metric: str, per_token: float | None) -> list[float | None]:
    """Each side's tokens/s of ``metric`` times ``per_token`` (ours, then the reference)."""
    speeds = (_speed(entry, side, metric) for side in ("ours", "ref"))
    return [None if tps is None or per_token is None else tps * per_token for tps in speeds]


def _gbs_cell(entry: dict, tg: int, bw: float) -> str:
    gb_per_token = entry["cost"]["decode_bytes"] / 1e9
    return _ours_ref_cell(_scaled_speeds(entry, f"tg{tg}", gb_per_token), ".1f", bw)


def _gflops_cell(entry: dict, n: int, peak: float) -> str:
    flops = entry["cost"]["prefill_flops"].get(str(n))
    gflop_per_token = None if flops is None else flops / n / 1e9
    return _ours_ref_cell(_scaled_speeds(entry, f"pp{n}", gflop_per_token), ".0f", peak)


def _host_cell(entry: dict) -> str:
    prof = entry.get("profile")
    if not prof or not prof["rows"]:
        return "—"
    ref_tps = _speed(entry, "ref", prof["metric"])
    ref = "—" if ref_tps is None else f"{1000 / ref_tps:.2f}"
    return f"{prof['outside_ms']:.2f} / {prof['step_ms']:.2f} ({ref})"


def profile_block(name: str, kind: str, prof: dict, top: int = 14) -> list[str]:
    lines = [
        f"Decode profile, {name} {kind} (`RPCNET_PROFILE`, {prof['steps']} single-token steps, "
        f"{prof['kernel_ms']:.2f} ms of kernels per step of {prof['step_ms']:.2f} ms):",
        "",
        "```",
        f"{'kernel':<44} {'calls':>7} {'ms/step':>8} {'share':>6}",
    ]
    if not prof["rows"]:
        return lines[:2] + ["(the profile file was empty: no kernel timings)", ""]
    total = sum(r["seconds"] for r in prof["rows"]) or 1.0
    for r in prof["rows"][:top]:
        per_step = 1000 * r["seconds"] / prof["steps"]
        lines.append(
            f"{r['label'][:44]:<44} {r['calls']:>7} {per_step:>8.3f} {r['seconds'] / total:>6.1%}"
        )
    lines += ["```", ""]
    return lines


def machine_lines(machine: dict, config: dict) -> list[str]:
    peak = machine.get("fma_peak_gflops")
    mhz = machine.get("effective_mhz") or machine.get("mhz")
    measured = machine.get("fma_gflops_core") is not None
    how = "measured with independent AVX2 FMAs, i.e." if measured else ""
    peak_text = (
        "unknown clock"
        if peak is None or mhz is None
        else (
            f"{peak:.0f} GFLOP/s ({how} {config['threads']} cores × {mhz:.0f} MHz × 32 "
            "flops/cycle, AVX2 2 FMA × 8 × 2)"
        ).replace("( ", "(")
    )
    cpu = "".join(f"{machine[k]}; " for k in ("cpu", "flags") if machine.get(k))
    return [
        f"Machine: {cpu}{machine['cores']} cores; memory bandwidth (NumPy copy of 256 MiB, read + "
        f"write) {machine['copy_gbs_1t']:.1f} GB/s on one thread, {machine['copy_gbs_nt']:.1f} "
        f"GB/s on {config['threads']}; FMA peak {peak_text}; NumPy/BLAS f32 matmul reaches "
        f"{machine['sgemm_gflops']:.0f} GFLOP/s. AVX-512: {'yes' if machine['avx512'] else 'no'}.",
    ]


def detail_table(results: dict) -> list[str]:
    lines = [
        "| model | weights | metric | reference tok/s | rpcnet tok/s | rpcnet / reference |",
        "|---|---|---|---|---|---|",
    ]
    for mname, model in results["models"].items():
        for kind, entry in model["types"].items():
            speed = entry.get("speed", {})
            for key in speed.get("ref", {}):
                r, o = median(speed["ref"][key]), median(speed.get("ours", {}).get(key))
                if r is None or o is None:
                    continue
                lines.append(f"| {mname} | {kind} | {key} | {r:.2f} | {o:.2f} | {o / r:.3f}× |")
    return lines


def _run_state(i: int, run: dict) -> str:
    steal = 100 * run.get("steal_share", 0.0)
    return f"run {i + 1}: {run['busy_cores_start']:.2f} cores busy, steal {steal:.1f}%"


def _host_notes(results: dict) -> list[str]:
    runs = results.get("runs")
    if runs is None:  # older results: the 1-minute load average at the start
        load = results.get("loadavg_start")
        if load is None or load < LOAD_IDLE:
            return []
        return [
            "",
            f"**Warning: the machine was busy (1-minute load average {load:.1f} at the start); "
            "these ratios are noise. Rerun on an idle machine.**",
        ]
    lines = [
        "",
        "Host during the runs (other processes' busy cores sampled for 3 s before each; the "
        "share of CPU time the hypervisor took during it, i.e. steal): "
        + "; ".join(_run_state(i, r) for i, r in enumerate(runs))
        + ".",
    ]
    busiest = max(r["busy_cores_start"] for r in runs)
    if busiest >= BUSY_CORES:
        lines += [
            "",
            f"**Warning: the machine was busy before a run ({busiest:.2f} cores); these ratios "
            "are noise. Rerun on an idle machine.**",
        ]
    return lines


def _rounds(results: dict) -> int:
    """Rounds behind the medians (the most any speed metric has; merged runs may differ)."""
    counts = [
        len(values)
        for model in results["models"].values()
        for entry in model["types"].values()
        for side in entry.get("speed", {}).values()
        for values in side.values()
    ]
    return max(counts, default=0)


def render(results: dict) -> str:
    config, machine = results["config"], results["machine"]
    lines = [
        "## Engine vs the reference — `bench/bench_engine.py`",
        "",
        "Command"
        + ("s" if len(config["commands"]) > 1 else "")
        + ": "
        + "; ".join(f"`{c}`" for c in config["commands"])
        + f" ({results['duration_min']:.0f} min).",
        "",
        "REAL v8 llama.cpp client (llama-bench method through the Python bindings: one batch per "
        "prefill, single-token decode steps) with every layer and the output head on the server; "
        f"{config['threads']} threads each side; speeds from "
        f"{_rounds(results) or 'no'} rounds on fresh servers, medians; in each round the two "
        "probes run at once and take turns, every timed repetition of one side between two of "
        "the other's, seconds apart (a drift of the shared host's speed hits both alike), the "
        "reference first in odd rounds, rpcnet in even ones"
        + (
            f" (each round the median of {config['reps']} repetitions of every pp/tg measurement,"
            " each on a cleared KV cache, the decodes after a deep prompt on the cache cut back"
            " to it; the deep prompt itself once per round)"
            if config.get("reps", 1) > 1
            else ""
        )
        + ". Random-weight llamas quantized by the "
        "REAL quantizer. Cells: **rpcnet / reference** (rpcnet / reference value). Memory: "
        "VmHWM / VmRSS from /proc of a fresh server, one client loading the model and running "
        f"pp{min(config['pp']) if config['pp'] else 0} + tg{config['tg']}. GB/s: weight bytes "
        "read per decoded token (every tensor but the embedding rows, plus the KV cache) × tok/s. "
        "GFLOP/s: 2 flops per weight per token + causal attention, the output head once per batch.",
        "",
        "Rerun on an idle machine: `python bench/bench_engine.py` (every section, 336 M and 1 B, "
        "q8_0 / Q4_K_M / f16; JSON in bench/results/engine.json, docs/benchmarks.md regenerated); "
        "the same with `--models 336m "
        "--types q8_0` etc. and `--merge` to run it in parts; `--quick` for a smoke test.",
        "",
        *machine_lines(machine, config),
        *_host_notes(results),
        "",
    ]
    for mname, model in results["models"].items():
        shape = model["shape"]
        lines += [
            f"### {mname}: {shape['params'] / 1e6:.0f} M parameters (n_embd {shape['n_embd']}, "
            f"{shape['n_layer']} layers, {shape['n_head']} heads / {shape['n_head_kv']} KV heads, "
            f"n_ff {shape['n_ff']}, vocab {shape['n_vocab']})",
            "",
            *model_table(model, config, machine),
            "",
        ]
        for kind, entry in model["types"].items():
            for section, error in entry.get("errors", {}).items():
                lines += [f"- {kind}, {section}: FAILED: `{error.splitlines()[0]}`"]
        lines += [""] if any(e.get("errors") for e in model["types"].values()) else []
        for kind, entry in model["types"].items():
            if entry.get("profile"):
                lines += profile_block(mname, kind, entry["profile"])
    lines += ["Every run (medians):", "", *detail_table(results), ""]
    return "\n".join(lines)
