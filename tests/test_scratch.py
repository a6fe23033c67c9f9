"""Scratch bounds and the per-device scratch budget (compute/scratch.py)."""

from __future__ import annotations

import gc

import pytest
from rpcnet.compute.device import MemoryPool
from rpcnet.compute.ops import Op
from rpcnet.compute.scratch import (
    ScratchBudget,
    ScratchExceeded,
    default_max_scratch,
    overlaps_itself,
    scratch_bytes,
)
from rpcnet.compute.tensor import Tensor

F32, Q8_0 = 0, 8


def tensor(ne, nb, type_id=F32, op=0, src=()) -> Tensor:
    return Tensor(0, type_id, ne, nb, op, bytes(64), 16, "t", None, 0, src=src)


def test_overlap_detection():
    assert not overlaps_itself(tensor((4, 3, 1, 1), (4, 16, 48, 48)))  # contiguous
    assert not overlaps_itself(tensor((4, 3, 1, 1), (12, 4, 48, 48)))  # transposed
    assert not overlaps_itself(tensor((4, 3, 1, 1), (4, 32, 96, 96)))  # padded rows
    assert overlaps_itself(tensor((4, 3, 1, 1), (4, 0, 0, 0)))  # zero stride
    assert overlaps_itself(tensor((4, 3, 1, 1), (4, 8, 24, 24)))  # rows laid over each other
    assert not overlaps_itself(tensor((4, 1, 1, 1), (4, 0, 0, 0)))  # size-1 dims do not count
    assert not overlaps_itself(tensor((64, 2, 1, 1), (34, 68, 136, 136), Q8_0))  # 2 blocks/row


def test_mul_mat_bound_follows_data_not_the_broadcast_of_weights():
    a = tensor((1024, 1024, 1, 1), (4, 4096, 4 << 20, 4 << 20))
    b = tensor((1024, 1, 2048, 1), (4, 4096, 0, 0))
    out = tensor((1024, 1, 2048, 1), (4, 4096, 4096, 8 << 20), op=Op.MUL_MAT, src=(a, b))
    # weights once (4 MiB), activations twice (8 MiB each), output once (8 MiB): never 2048 x a
    assert scratch_bytes(out) == (4 << 20) + 2 * (8 << 20) + (8 << 20)
    overlapping = tensor((1024, 1, 2048, 1), (4, 4096, 0, 0), op=Op.MUL_MAT, src=(a, b))
    assert scratch_bytes(overlapping) == scratch_bytes(out) + (8 << 20)


def test_budget_reserves_the_largest_live_need_and_releases_on_drop():
    class Plan:
        pass

    pool = MemoryPool(1000)
    budget = ScratchBudget(pool, limit=500)
    with pytest.raises(ScratchExceeded, match="--max-scratch"):
        budget.admit(501, 0, "x")
    p1, p2 = Plan(), Plan()
    budget.admit(300, 10, "a").bind(p1)
    assert pool.held == 310
    budget.admit(200, 10, "b").bind(p2)
    assert pool.held == 320  # scratch is shared: plans run one at a time
    del p1
    gc.collect()
    assert pool.held == 210  # the largest remaining need (200) and one footprint
    del p2
    gc.collect()
    assert pool.held == 0 and budget.reserved == 0


def test_budget_refuses_when_the_device_is_full():
    pool = MemoryPool(1000)
    assert pool.reserve(900)
    budget = ScratchBudget(pool, limit=500)
    with pytest.raises(ScratchExceeded, match="--mem"):
        budget.admit(200, 0, "x")
    assert pool.held == 900


def test_default_budget():
    assert default_max_scratch(4 << 30) == (4 << 30) // 10
    assert default_max_scratch(64 << 30) == 1 << 30
