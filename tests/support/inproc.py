"""Run an rpcnet Server on a background thread (real sockets on 127.0.0.1) for white-box tests."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, TypeVar

from rpcnet.server.app import Server, ServerConfig, run_loop

T = TypeVar("T", bound="LoopThread")


class LoopThread:
    """A service (anything with async `start()` and `close()`) on its own event loop thread."""

    thread_name = "rpcnet-test-loop"

    def __init__(self) -> None:
        self.service: Any = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name=self.thread_name, daemon=True)
        self._error: BaseException | None = None

    def make(self) -> Any:
        raise NotImplementedError

    def _main(self) -> None:
        try:
            run_loop(self._serve())
        except BaseException as exc:  # surfaced to the test by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.service = self.make()
        await self.service.start()
        self._ready.set()
        await self._stop.wait()
        await self.service.close()

    def start(self: T) -> T:
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


class ServerThread(LoopThread):
    thread_name = "rpcnet-test-server"

    def __init__(self, devices: list | None = None, **config: Any) -> None:
        config.setdefault("port", 0)
        self.devices = devices  # None: the devices `config.device` names
        self.config = ServerConfig(**config)
        super().__init__()

    def make(self) -> Server:
        return Server(self.config, self.devices)

    @property
    def server(self) -> Server | None:
        return self.service

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def call(self, fn: Any) -> Any:
        """Run `fn()` on the server's loop thread and return its result (for state inspection)."""
        assert self.loop is not None

        async def wrapper() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(10)

    def memory_held(self, device: int = 0) -> int:
        assert self.server is not None
        return self.call(lambda: self.server.devices[device].memory.held)

    def connection_count(self) -> int:
        assert self.server is not None
        return self.call(lambda: len(self.server.connections))
