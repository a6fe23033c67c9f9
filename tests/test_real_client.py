"""The REAL llama.cpp RPC clients (v8 and v7 wheels) against rpcnet: enumerate and read memory."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from support import refenv
from support.inproc import ServerThread

pytestmark = pytest.mark.usefixtures("refenv_required")

MEM = 3 << 30


@pytest.mark.parametrize("version,proto", [("v8", 8), ("v7", 7)])
def test_real_client_enumerates_rpcnet(version, proto):
    srv = ServerThread(proto=proto, mem=MEM).start()
    try:
        info = refenv.run_probe(version, "devices", srv.endpoint, timeout=60)
        assert info["client_protocol"] == f"{proto}.0.0"
        (dev,) = info["devices"]
        assert dev["description"] == srv.endpoint
        assert dev["rpc_total"] == MEM and dev["total"] == MEM
        assert 0 < dev["rpc_free"] <= MEM
        assert dev["alignment"] == 32
    finally:
        srv.stop()


@pytest.mark.parametrize("version,proto", [("v8", 7), ("v7", 8)])
def test_real_client_with_other_dialect_fails_cleanly(version, proto):
    """A client of the other major version aborts at HELLO; rpcnet keeps serving."""
    srv = ServerThread(proto=proto, mem=MEM).start()
    try:
        with pytest.raises(refenv.ProbeError) as err:
            refenv.run_probe(version, "devices", srv.endpoint, timeout=60)
        assert "version mismatch" in err.value.stderr.lower()
        ok_version = "v8" if proto == 8 else "v7"
        assert refenv.run_probe(ok_version, "devices", srv.endpoint, timeout=60)["devices"]
    finally:
        srv.stop()


def test_two_endpoint_strings_to_one_server():
    """127.0.0.1:P and localhost:P are two connections held at once: rpc-server hangs here."""
    srv = ServerThread(proto=8, mem=MEM).start()
    try:
        info = refenv.run_probe("v8", "devices", srv.endpoint, f"localhost:{srv.port}", timeout=60)
        assert len(info["devices"]) == 2
    finally:
        srv.stop()


def test_cli_serve_and_caps_subprocess():
    """`rpcnet serve` as a real process, probed by `rpcnet caps` and the real client."""
    port = refenv.free_port()
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rpcnet.cli",
            "serve",
            "--port",
            str(port),
            "--mem",
            "2G",
            "--proto",
            "7",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        out = None
        while time.monotonic() < deadline:
            res = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "rpcnet.cli",
                    "caps",
                    f"127.0.0.1:{port}",
                    "--proto",
                    "7",
                    "--json",
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if res.returncode == 0:
                out = res.stdout
                break
            time.sleep(0.2)
        assert out is not None, "rpcnet serve did not come up"
        info = json.loads(out)
        assert info["version"] == "7.0.0"
        assert info["transport"] == "TCP"
        assert info["server_caps_decoded"] == "none"
        assert info["devices"][0]["total"] == 2 << 30
        probe = refenv.run_probe("v7", "devices", f"127.0.0.1:{port}", timeout=60)
        assert probe["devices"][0]["total"] == 2 << 30
    finally:
        serve.terminate()
        serve.wait(10)
