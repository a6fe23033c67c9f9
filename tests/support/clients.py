"""REAL v8 llama.cpp clients (the ``generate`` probe) against a server on 127.0.0.1, alone or
several at once held at a barrier: shared by the serving tests and benchmarks."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from support import refenv


def generate(
    model: Path,
    server: int | str,
    tokens: str,
    out: Path,
    *args: str | Path | int,
    timeout: float = 300.0,
) -> dict:
    """The probe's JSON: teacher-forced logits of ``tokens`` with every layer on ``server`` (a
    port on 127.0.0.1, or "local": llama.cpp's own CPU backend), written under ``out``;
    ``args`` are further probe options (``--prefill 4``...)."""
    endpoint = server if isinstance(server, str) else f"127.0.0.1:{server}"
    options = ["--model", model, "--endpoint", endpoint, "--tokens", tokens, *args, "--out", out]
    return refenv.run_probe("v8", "generate", *options, timeout=timeout)


def logits(result: dict) -> np.ndarray:
    return np.load(result["logits_path"])


class HeldClients:
    """Clients on threads, each held at the barrier ``work/barrier`` (model loaded, nothing
    evaluated yet) until ``hold`` ready files are there: the last one is :meth:`release`'s.
    ``args`` are the probe options of every client."""

    def __init__(
        self,
        model: Path,
        port: int,
        work: Path,
        n: int,
        hold: int,
        tokens: str,
        *args: str,
        timeout: float = 300.0,
    ) -> None:
        self.barrier = work / "barrier"
        self.barrier.mkdir(parents=True, exist_ok=True)
        self.work, self.model, self.port, self.hold = work, model, port, hold
        self.tokens, self.args, self.timeout = tokens, args, timeout
        self.results: dict[int, dict] = {}
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        for _ in range(n):
            self.add()

    def add(self) -> None:
        i = len(self.threads)
        t = threading.Thread(target=self._run, args=(i,))
        self.threads.append(t)
        t.start()

    def _run(self, i: int) -> None:
        try:
            self.results[i] = generate(
                self.model,
                self.port,
                self.tokens,
                self.work / f"c{i}",
                *self.args,
                "--barrier",
                self.barrier,
                "--barrier-n",
                self.hold,
                timeout=self.timeout,
            )
        except BaseException as exc:  # noqa: BLE001 - raised by loaded() and wait()
            self.errors.append(exc)

    def loaded(self, n: int | None = None, timeout: float | None = None) -> None:
        """Wait until ``n`` (all) clients have loaded the model; raise a client's error."""
        n = len(self.threads) if n is None else n
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(list(self.barrier.glob("ready-*"))) < n:
            if self.errors:
                raise self.errors[0]
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("the clients did not load in time")
            time.sleep(0.02)

    def release(self) -> None:
        (self.barrier / "ready-release").touch()

    def wait(self) -> list[dict]:
        """Every client's probe JSON, in the order they were added."""
        for t in self.threads:
            t.join()
        if self.errors:
            raise self.errors[0]
        return [self.results[i] for i in range(len(self.threads))]
