from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from support.inproc import ServerThread  # noqa: E402


@pytest.fixture
def server_factory():
    started: list[ServerThread] = []

    def start(**config) -> ServerThread:
        srv = ServerThread(**config).start()
        started.append(srv)
        return srv

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def server(server_factory) -> ServerThread:
    return server_factory(mem=1 << 30)


@pytest.fixture
def server_v7(server_factory) -> ServerThread:
    return server_factory(mem=1 << 30, proto=7)
