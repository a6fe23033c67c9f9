"""A short soak in CI (bench/soak.py runs the 10-minute version): 4 real clients, random kills."""

from __future__ import annotations

import os

import pytest
from support.models import ZOO, ensure_model
from support.soak import soak

pytestmark = pytest.mark.usefixtures("refenv_required")


def test_short_soak(tmp_path):
    model = ensure_model(ZOO["llama-gqa-f32"], os.environ.get("RPCNET_E2E_CACHE", tmp_path / "zoo"))
    result = soak(
        model, duration=float(os.environ.get("RPCNET_SOAK_SECONDS", "40")), workdir=tmp_path
    )
    assert result.server_alive, "the server process died"
    assert not result.failed, result.failed[:3]
    assert result.completed >= 4 and result.killed >= 1, result
    free, total = result.free_total
    assert free == total, f"{total - free} bytes still held after all clients left"
    # Allocator arenas may keep a little; a leak of buffers would be far larger than this.
    assert result.final_rss <= result.baseline_rss + (64 << 20), result
