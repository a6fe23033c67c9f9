"""The `rpcnet` command line: --version, caps (human and JSON), ops, size parsing."""

from __future__ import annotations

import argparse
import json

import pytest
from rpcnet import __version__
from rpcnet.cli import main, parse_size
from rpcnet.transport.caps import decode_caps, describe_caps, negotiated_transport


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert __version__ in out and "8.0.0" in out and "7.0.0" in out


def test_caps_human_and_json(server, capsys):
    assert main(["caps", server.endpoint]) == 0
    out = capsys.readouterr().out
    assert "protocol        8.0.0" in out
    assert "transport       TCP" in out
    assert "1024 MiB total" in out
    assert main(["caps", server.endpoint, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["server_caps"] == "00" * 24 and info["devices"][0]["alignment"] == 32


def test_caps_on_dead_port_reports_error(capsys):
    from support.refenv import free_port

    assert main(["caps", f"127.0.0.1:{free_port()}"]) == 1
    assert "127.0.0.1" in capsys.readouterr().err


def test_ops_lists_kernels(capsys):
    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "MUL_MAT" in out and "ADD" in out


def test_serve_defaults_are_the_server_config_defaults():
    from rpcnet.cli import build_parser
    from rpcnet.server.config import ServerConfig

    args = build_parser().parse_args(["serve"])
    config = ServerConfig()
    pairs = {
        "host": "host",
        "port": "port",
        "proto": "proto",
        "device": "device",
        "max_clients": "max_clients",
        "hello_timeout": "hello_timeout",
        "comm_timeout": "comm_timeout",
        "max_payload": "max_data",
        "max_graph": "max_graph",
        "max_graph_nodes": "max_graph_nodes",
    }
    assert {arg: getattr(args, arg) for arg in pairs} == {
        arg: getattr(config, field) for arg, field in pairs.items()
    }
    assert (args.port, args.max_clients, args.max_graph) == (50052, 256, 256 << 20)


def test_parse_size():
    assert parse_size("512M") == 512 << 20
    assert parse_size("8G") == 8 << 30
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("4096") == 4096
    with pytest.raises(argparse.ArgumentTypeError):
        parse_size("lots")


def test_caps_decoding():
    assert decode_caps(bytes(24)) is None
    caps = (
        (0x1234).to_bytes(4, "little")
        + (0x1234).to_bytes(4, "little")
        + bytes(10)
        + b"\xff\xff"
        + bytes([10, 0, 0, 2])
    )
    rdma = decode_caps(caps)
    assert rdma is not None and rdma.qpn == 0x1234 and "10.0.0.2" in rdma.gid_text
    assert describe_caps(caps).startswith("RDMA qpn=0x1234")
    assert negotiated_transport(caps, bytes(24)) == "TCP"
    assert negotiated_transport(caps, caps) == "RDMA"
