"""The REAL v8 llama.cpp client, unchanged, through `rpcnet tunnel` to TLS + token servers.

- one server: the logits through the tunnel equal those over plain TCP to the same kind of server
  (and are within 1e-3 of llama.cpp's own CPU run, argmax equal);
- a layer split across two TLS servers on different loopback addresses (127.0.0.2, 127.0.0.3),
  one tunnel listening for both, each connection TLS 1.3 with its tenant's token;
- a tensor split (COMM_INIT, COMM_ALLREDUCE) across two TLS servers on 127.0.0.2 and 127.0.0.3,
  each behind its own route of the tunnel: the tunnel rewrites the rank-0 address, the servers'
  link is TLS with the tenant's token, logits equal to the same split over plain TCP; the same
  with each server behind a tunnel process of its own (the tunnels ask each other); and the
  link refused (a peer certificate that is not trusted): COMM_INIT answers ok = 0 and the client
  falls back to its own reduction, logits unchanged;
- `rpcnet tunnel` as a real process (the command line, the token file, a pinned fingerprint).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
from rpcnet.transport import tls
from support import refenv, require
from support.inproc import ServerThread
from support.secure import Pki, TunnelThread, write_tokens
from support.serve import wait_listening
from support.waiting import wait_until

pytestmark = pytest.mark.usefixtures("refenv_required")

TOKEN = "tenant-token-0123456789"
TOKENS = "1,40,41,300,77,250,12,101"
DECODE = ("--tokens", TOKENS, "--prefill", "4", "--flash-attn", "1", "--threads", "1")
MEM = 1 << 30
TOL = 1e-3


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    require.module("gguf")
    require.module("cryptography")
    from support.models import ZOO, ensure_model

    cache = os.environ.get("RPCNET_E2E_CACHE")
    zoo = Path(cache) if cache else tmp_path_factory.mktemp("zoo")
    work = tmp_path_factory.mktemp("tunnel")
    pki = Pki(work / "pki")
    cert = pki.leaf("server", ("127.0.0.1", "127.0.0.2", "127.0.0.3"))
    tokens = write_tokens(work / "tokens", {"tenant": (TOKEN, None)})
    return {
        "model": ensure_model(ZOO["llama-gqa-f32"], zoo),
        "work": work,
        "pki": pki,
        "cert": cert,
        "tokens": tokens,
        "n": [0],
    }


def generate(env: dict, endpoint: str, *args: str) -> np.ndarray:
    env["n"][0] += 1
    result = refenv.run_probe(
        "v8",
        "generate",
        "--model",
        env["model"],
        "--endpoint",
        endpoint,
        "--out",
        env["work"] / f"{env['n'][0]:02d}",
        *DECODE,
        *args,
        timeout=180,
    )
    if endpoint != "local":
        assert result["device"].startswith("RPC"), result
    return np.load(result["logits_path"])


def close_to(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.shape == ref.shape and np.isfinite(got).all()
    rel = float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())
    assert rel <= TOL, rel
    assert (got.argmax(axis=1) == ref.argmax(axis=1)).all()


def tls_server(env: dict, stack: ExitStack, host: str = "127.0.0.1") -> ServerThread:
    cert, key = env["cert"]
    srv = ServerThread(mem=MEM, host=host, tls_cert=cert, tls_key=key, tokens=env["tokens"])
    srv.start()
    stack.callback(srv.stop)
    return srv


def test_logits_through_the_tunnel_equal_plain_tcp(env, caplog):
    caplog.set_level(logging.INFO)
    with ExitStack() as stack:
        plain = ServerThread(mem=MEM).start()
        stack.callback(plain.stop)
        srv = tls_server(env, stack)
        tunnel = TunnelThread([("127.0.0.1", srv.port)], TOKEN, ca=env["pki"].ca_path).start()
        stack.callback(tunnel.stop)
        over_tcp = generate(env, plain.endpoint)
        through = generate(env, tunnel.endpoints[0])
        assert np.array_equal(through, over_tcp)
        close_to(through, generate(env, "local"))
        assert tunnel.tunnel is not None and tunnel.tunnel.opened_count >= 1
        assert "TLSv1.3" in caplog.text and "tenant tenant" in caplog.text
        assert TOKEN not in caplog.text


def test_layer_split_across_two_tls_servers(env):
    with ExitStack() as stack:
        servers = [tls_server(env, stack, host) for host in ("127.0.0.2", "127.0.0.3")]
        targets = [(s.config.host, s.port) for s in servers]
        tunnel = TunnelThread(targets, TOKEN, ca=env["pki"].ca_path).start()
        stack.callback(tunnel.stop)
        got = generate(
            env, ",".join(tunnel.endpoints), "--split-mode", "layer", "--tensor-split", "1,1"
        )
        close_to(got, generate(env, "local"))
        for srv in servers:  # both served graphs; both free once the client is gone
            assert srv.server is not None and srv.server.stats.graphs > 0
        wait_all_released(servers)


TENSOR_SPLIT = ("--split-mode", "tensor", "--tensor-split", "1,1")


def comm_port_pair(host: str) -> int:
    """A port P with P and P + 1000 (rank 0's comm port) free on `host`."""
    for _ in range(200):
        port = refenv.free_port()
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind((host, port))
                b.bind((host, port + 1000))
        except OSError:
            continue
        return port
    raise AssertionError(f"no free port pair on {host}")


def split_pair(env: dict, stack: ExitStack, **tls_opts) -> list[ServerThread]:
    """Two servers on 127.0.0.2 (rank 0) and 127.0.0.3, TLS + tokens unless tls_opts says
    plain=True."""
    plain = tls_opts.pop("plain", False)
    cert, key = env["cert"]
    servers = []
    for host in ("127.0.0.2", "127.0.0.3"):
        secure = {} if plain else {"tls_cert": cert, "tls_key": key, "tokens": env["tokens"]}
        srv = ServerThread(mem=MEM, host=host, port=comm_port_pair(host), **secure, **tls_opts)
        srv.start()
        stack.callback(srv.stop)
        servers.append(srv)
    return servers


def comm_links(srv: ServerThread) -> tuple[int, int, int]:
    """(links made, allreduces, links alive)."""
    return srv.call(
        lambda: (
            srv.server.comm.stats.links,
            srv.server.comm.stats.allreduces,
            len(srv.server.comm.links),
        )
    )


def released(srv: ServerThread) -> bool:
    return srv.connection_count() == 0 and srv.memory_held() == 0 and comm_links(srv)[2] == 0


def wait_all_released(servers: list[ServerThread]) -> None:
    wait_until(lambda: all(released(s) for s in servers), 10, "the servers to release everything")


def test_tensor_split_through_tunnels_equals_plain_tcp(env, caplog):
    caplog.set_level(logging.INFO)
    with ExitStack() as stack:
        plain = split_pair(env, stack, plain=True)
        over_tcp = generate(
            env, ",".join(f"{s.config.host}:{s.port}" for s in plain), *TENSOR_SPLIT
        )
        assert all(comm_links(s)[:2] == (1, 20) for s in plain)  # the plain pair linked too
        servers = split_pair(env, stack)
        targets = [(s.config.host, s.port) for s in servers]
        tunnel = TunnelThread(targets, TOKEN, ca=env["pki"].ca_path).start()
        stack.callback(tunnel.stop)
        caplog.clear()
        through = generate(env, ",".join(tunnel.endpoints), *TENSOR_SPLIT)
        assert np.array_equal(through, over_tcp)
        close_to(through, generate(env, "local"))
        # 5 llama_decode calls x 2 layers x 2 partial sums, over one TLS link per server
        for srv in servers:
            assert comm_links(srv)[:2] == (1, 20), comm_links(srv)
        rank0, rank1 = servers
        text = caplog.text
        assert (
            f"rank 0 at 127.0.0.1:{tunnel.ports[0] + 1000} -> 127.0.0.2:{rank0.port + 1000}" in text
        )
        assert "joined pairwise comm as rank 1 (peer 127.0.0.2:" in text
        assert text.count("TLS 1.3, tenant tenant)") == 2, text
        assert TOKEN not in text
        wait_all_released(servers)


def test_tensor_split_through_two_tunnel_processes(env, caplog):
    """Each server behind a tunnel of its own (two Tunnel instances, loops and threads): the
    rank-1 tunnel does not know rank 0's listen address, so it asks the tunnel there (its
    STATUS answer names the server) and rewrites COMM_INIT to it."""
    caplog.set_level(logging.INFO)
    with ExitStack() as stack:
        servers = split_pair(env, stack)
        tunnels = []
        for srv in servers:
            tunnel = TunnelThread([(srv.config.host, srv.port)], TOKEN, ca=env["pki"].ca_path)
            tunnels.append(tunnel.start())
            stack.callback(tunnel.stop)
        endpoints = ",".join(t.endpoints[0] for t in tunnels)
        got = generate(env, endpoints, *TENSOR_SPLIT)
        close_to(got, generate(env, "local"))
        for srv in servers:
            assert comm_links(srv)[:2] == (1, 20), comm_links(srv)
        rank0 = servers[0]
        a = tunnels[0].ports[0] + 1000
        assert f"rank 0 at 127.0.0.1:{a} -> 127.0.0.2:{rank0.port + 1000}" in caplog.text
        assert caplog.text.count("TLS 1.3, tenant tenant)") == 2
        wait_all_released(servers)


def test_tensor_split_untrusted_peer_falls_back(env, caplog, tmp_path):
    """Rank 1 pins a certificate rank 0 does not have: the link is refused before the token
    leaves, both COMM_INITs answer ok = 0 and the client reduces on its own."""
    caplog.set_level(logging.INFO)
    other = env["pki"].leaf("other", ("127.0.0.9",))[0]
    with ExitStack() as stack:
        servers = split_pair(
            env, stack, comm_timeout=3.0, peer_fingerprints=(tls.cert_fingerprint(other),)
        )
        targets = [(s.config.host, s.port) for s in servers]
        tunnel = TunnelThread(targets, TOKEN, ca=env["pki"].ca_path).start()
        stack.callback(tunnel.stop)
        got = generate(env, ",".join(tunnel.endpoints), *TENSOR_SPLIT)
        close_to(got, generate(env, "local"))
        assert "is not a trusted peer" in caplog.text, caplog.text
        assert all(comm_links(s) == (0, 0, 0) for s in servers)
        wait_all_released(servers)


def test_tunnel_command_line(env, tmp_path):
    """`rpcnet tunnel` as its own process: token file, pinned fingerprint, the real client."""
    with ExitStack() as stack:
        srv = tls_server(env, stack)
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        port = refenv.free_port()
        fp = tls.colon_hex(tls.cert_fingerprint(env["cert"][0]))
        proc = subprocess.Popen(
            [sys.executable, "-m", "rpcnet.cli", "tunnel", "--listen", f"127.0.0.1:{port}"]
            + ["--to", f"127.0.0.1:{srv.port}", "--token-file", str(token_file)]
            + ["--fingerprint", fp],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        stack.callback(refenv.stop_process, proc)
        wait_listening(port, proc)
        close_to(generate(env, f"127.0.0.1:{port}"), generate(env, "local"))
        refenv.stop_process(proc)
        out = proc.stdout.read() if proc.stdout else ""
        assert "TLSv1.3" in out and fp in out and "tenant tenant" in out, out
        assert TOKEN not in out
