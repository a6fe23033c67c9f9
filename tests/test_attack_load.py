"""A short load-under-attack run in CI (bench/bench_attack_load.py runs the 2-minute version):
real llama.cpp clients decode while attackers send amplification frames in a loop."""

from __future__ import annotations

import os

from support.attack_load import attack_load
from support.models import ZOO, ensure_model


def test_short_attack_load(tmp_path):
    model = ensure_model(ZOO["llama-gqa-f32"], os.environ.get("RPCNET_E2E_CACHE", tmp_path / "zoo"))
    seconds = float(os.environ.get("RPCNET_ATTACK_LOAD_SECONDS", "25"))
    r = attack_load(model, duration=seconds, clients=4, attackers=2, workdir=tmp_path)
    assert r.server_alive, "the server process died"
    assert not r.failures, r.failures[:3]
    assert r.honest_ok >= 4, r
    assert r.attacks >= 10 and r.attacks_closed == r.attacks, r
    assert r.refusals_logged >= r.attacks_closed, r
    # An attacker frame would need 4 TiB with repeated weights; the server stays near its
    # baseline (honest clients' buffers are small) and returns to it.
    assert r.peak_rss <= r.baseline_rss + (512 << 20), r
    free, total = r.free_total
    assert free == total, f"{total - free} bytes still held after everyone left"
    assert r.final_rss <= r.baseline_rss + (64 << 20), r
