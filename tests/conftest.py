from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# pyverbs (installed by tools/refenv.sh from Debian) for the RDMA transport tests.
_PYVERBS = Path(__file__).resolve().parent.parent / ".refenv" / "pyverbs-path"
if _PYVERBS.is_dir():
    sys.path.append(str(_PYVERBS))

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


@pytest.fixture(scope="session")
def reference_v8():
    """The REAL reference rpc-server (v8) for differential tests; port number."""
    from support import refenv

    if not refenv.available("v8"):
        pytest.skip("reference env missing: run tools/refenv.sh")
    port = refenv.free_port()
    proc = refenv.start_reference_server("v8", port=port)
    yield port
    refenv.stop_process(proc)


@pytest.fixture(scope="session")
def rpcnet_v8():
    srv = ServerThread(mem=4 << 30).start()
    yield srv.port
    srv.stop()
