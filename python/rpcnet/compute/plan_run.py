"""What every run of compiled plans does around its kernels, one plan alone or several side by
side (compute/shared_decode.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rpcnet import _native


@contextmanager
def plan_run(plans: Sequence[Any]) -> Iterator[None]:
    """Around one run of `plans` (graph.Plan): the derived caches of the buffers they write go
    stale, the kernel pool rests after, and each plan records how long the run took (only a run
    that finished: `Plan.short` judges decode steps by it)."""
    for plan in plans:
        for buf in plan.written:
            buf.touched()  # derived caches of these buffers are stale from here on
    started = time.perf_counter()
    try:
        yield
    finally:
        _native.pool_rest()  # no kernel follows soon: the cores go to the response and client
    elapsed = time.perf_counter() - started
    for plan in plans:
        plan.last_seconds = elapsed
