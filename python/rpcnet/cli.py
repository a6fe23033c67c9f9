"""The `rpcnet` command line: serve, caps, ops."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from pathlib import Path

from rpcnet import __version__
from rpcnet.protocol.commands import DEFAULT_PROTOCOL

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """'512M', '8G', '1.5g', '1048576' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 512M, 8G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def parse_allow_arg(text: str):
    from rpcnet.server.access import parse_allow

    try:
        return parse_allow(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rpcnet", description="Remote ggml device server for llama.cpp"
    )
    parser.add_argument(
        "--version",
        action="version",
        version=(
            f"rpcnet {__version__} "
            f"(ggml RPC protocol {DEFAULT_PROTOCOL}.0.0 default, 7.0.0 with --proto 7)"
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve devices to llama.cpp RPC clients")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=50052)
    serve.add_argument(
        "--proto", type=int, choices=(8, 7), default=DEFAULT_PROTOCOL, help="protocol major version"
    )
    serve.add_argument(
        "--device",
        default="cpu",
        help="device to serve: cpu, cuda (every GPU), cuda:0,cuda:1, cuda:0,cpu (docs/gpu.md)",
    )
    serve.add_argument(
        "--mem", type=parse_size, help="memory to report and enforce (default: physical RAM)"
    )
    serve.add_argument("--threads", type=int, help="compute threads")
    serve.add_argument(
        "--cache",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="enable the weight hash cache (default: $LLAMA_CACHE/rpc or ~/.cache/llama.cpp/rpc)",
    )
    serve.add_argument(
        "--cache-max", type=parse_size, help="bound the cache directory (LRU eviction)"
    )
    limits = serve.add_argument_group("limits and access")
    limits.add_argument(
        "--allow",
        type=parse_allow_arg,
        metavar="CIDR[,CIDR]",
        help="client networks allowed (default: loopback clients only)",
    )
    limits.add_argument(
        "--client-mem", type=parse_size, help="buffer memory one connection may hold"
    )
    limits.add_argument("--max-clients", type=int, default=256, help="concurrent connections")
    limits.add_argument(
        "--hello-timeout", type=float, default=10.0, help="seconds a connection has to send HELLO"
    )
    limits.add_argument(
        "--comm-timeout",
        type=float,
        default=30.0,
        help="seconds COMM_INIT rank 0 waits for its peer server (then answers ok = 0)",
    )
    limits.add_argument(
        "--max-payload", type=parse_size, default=1 << 40, help="largest SET_TENSOR payload"
    )
    limits.add_argument(
        "--max-graph", type=parse_size, default=256 << 20, help="largest GRAPH_COMPUTE payload"
    )
    limits.add_argument(
        "--max-graph-nodes", type=int, default=1 << 16, help="nodes and tensors per graph"
    )
    serve.add_argument("-v", "--verbose", action="count", default=0)

    caps = sub.add_parser(
        "caps",
        help="connect, HELLO, and show what was negotiated (or --local: this host's RDMA GIDs)",
    )
    caps.add_argument("endpoint", type=parse_endpoint, metavar="HOST:PORT", nargs="?")
    caps.add_argument("--proto", type=int, choices=(8, 7), default=DEFAULT_PROTOCOL)
    caps.add_argument("--json", action="store_true")
    caps.add_argument("--no-rdma", action="store_true", help="advertise zero caps (TCP only)")
    caps.add_argument(
        "--local", action="store_true", help="list local RDMA devices, ports and GIDs instead"
    )
    caps.add_argument(
        "--to", metavar="ADDR", help="with --local: the GID a connection to ADDR would use"
    )
    caps.add_argument("--sysfs", metavar="DIR", help=argparse.SUPPRESS)  # fake trees in tests

    sub.add_parser("ops", help="list the supported (op, types) kernels")
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    from rpcnet.server.app import ServerConfig, run
    from rpcnet.server.cache import default_cache_dir

    level = logging.WARNING - 10 * min(args.verbose, 2) + (10 if args.verbose == 0 else 0)
    logging.basicConfig(
        level=min(level, logging.INFO), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.verbose >= 2:
        logging.getLogger().setLevel(logging.DEBUG)
    cache_dir = None
    if args.cache is not None:
        cache_dir = Path(args.cache) if args.cache else default_cache_dir()
    config = ServerConfig(
        host=args.host,
        port=args.port,
        proto=args.proto,
        device=args.device,
        mem=args.mem,
        threads=args.threads,
        cache_dir=cache_dir,
        cache_max=args.cache_max,
        allow=args.allow,
        client_mem=args.client_mem,
        max_clients=args.max_clients,
        hello_timeout=args.hello_timeout,
        comm_timeout=args.comm_timeout,
        max_data=args.max_payload,
        max_graph=args.max_graph,
        max_graph_nodes=args.max_graph_nodes,
    )
    try:
        run(config)
    except OSError as exc:
        print(f"rpcnet: cannot serve on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"rpcnet: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_caps(args: argparse.Namespace) -> int:
    from rpcnet import caps

    if args.local:
        info = caps.local_report(args.to, root=args.sysfs)
        print(json.dumps(info, indent=2) if args.json else caps.render_local(info))
        return 0
    if args.endpoint is None:
        print("rpcnet caps: give HOST:PORT, or --local", file=sys.stderr)
        return 2
    host, port = args.endpoint
    provider = None
    if not args.no_rdma:
        from rpcnet.transport.rdma import PyverbsProvider

        provider = PyverbsProvider(sysfs_root=args.sysfs)
    try:
        info = caps.probe(host, port, args.proto, provider=provider, timeout=10.0)
    except Exception as exc:  # noqa: BLE001 - report any failure plainly
        print(f"rpcnet caps: {host}:{port}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2) if args.json else caps.render(info))
    return 0


def cmd_ops(args: argparse.Namespace) -> int:
    from rpcnet.compute import kernels  # noqa: F401 - registers the kernels
    from rpcnet.compute.kernels.registry import table
    from rpcnet.compute.ops import op_name

    for k in table("cpu"):
        print(f"{op_name(k.op):<20} {k.types:<48} {k.device}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = {"serve": cmd_serve, "caps": cmd_caps, "ops": cmd_ops}[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
