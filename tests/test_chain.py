"""server/chain.py: one connection's launched work runs in order across threads, and no thread
waits for another's job (real thread pools)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from rpcnet.server.chain import Chain


@pytest.fixture
def runners():
    a = ThreadPoolExecutor(1, thread_name_prefix="test-a")
    b = ThreadPoolExecutor(1, thread_name_prefix="test-b")
    yield a, b
    a.shutdown(wait=True)
    b.shutdown(wait=True)


def test_jobs_run_in_launch_order_across_runners(runners):
    a, b = runners
    chain = Chain()
    order: list[str] = []

    def job(name: str, delay: float = 0.0):
        def run() -> None:
            time.sleep(delay)
            order.append(name)

        return run

    futures = [
        chain.launch(a, job("a1", 0.05)),
        chain.launch(b, job("b1")),  # must not overtake a1's sleep
        chain.launch(a, job("a2", 0.02)),
        chain.launch(a, job("a3")),
        chain.launch(b, job("b2")),
    ]
    for f in futures:
        f.result(5)
    assert order == ["a1", "b1", "a2", "a3", "b2"]


def test_a_runner_is_free_while_the_chain_waits_elsewhere(runners):
    a, b = runners
    chain = Chain()
    peer = threading.Event()
    done: list[str] = []
    chain.launch(b, lambda: (peer.wait(5), done.append("exchange")))
    after = chain.launch(a, lambda: done.append("next graph"))
    # Another client's work on runner a is not stuck behind this chain's wait on b.
    assert a.submit(lambda: "other client").result(2) == "other client"
    assert not after.done() and done == []
    peer.set()
    after.result(5)
    assert done == ["exchange", "next graph"]


def test_a_failed_job_reports_and_later_jobs_still_run(runners):
    a, b = runners
    chain = Chain()

    def fail() -> None:
        raise ValueError("peer gone")

    failed = chain.launch(b, fail)
    later = chain.launch(a, lambda: None)
    with pytest.raises(ValueError, match="peer gone"):
        failed.result(5)
    assert later.result(5) is None


def test_a_shut_down_runner_fails_the_job_instead_of_hanging(runners):
    a, b = runners
    chain = Chain()
    gate = threading.Event()
    first = chain.launch(a, lambda: gate.wait(5))
    b.shutdown(wait=True)
    queued = chain.launch(b, lambda: None)  # handed to b once `first` is done
    gate.set()
    first.result(5)
    with pytest.raises(RuntimeError):
        queued.result(5)
