"""The `rpcnet` command line: serve, caps, ops."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rpcnet import __version__
from rpcnet.protocol.commands import DEFAULT_PROTOCOL, SUPPORTED_PROTOCOLS
from rpcnet.server.config import ServerConfig, size_bytes


def parse_size(text: str) -> int:
    """'512M', '8G', '1.5g', '1048576' -> bytes."""
    try:
        return size_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_allow_arg(text: str):
    from rpcnet.server.access import parse_allow

    try:
        return parse_allow(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_positive(text: str) -> int:
    """'3' -> 3; a count below 1 would refuse every connection."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text!r}")
    return value


def parse_endpoint(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "127.0.0.1", int(port)


def parse_metrics_endpoint(text: str) -> tuple[str, int]:
    """'9100' or ':9100' -> loopback; 'HOST:PORT' as given."""
    return ("127.0.0.1", int(text)) if text.isdigit() else parse_endpoint(text)


# Limit options: (flag, parser, help); each one's default is its ServerConfig field's.
LIMIT_OPTIONS: tuple[tuple[str, Callable[[str], Any], str], ...] = (
    ("--client-mem", parse_size, "buffer memory one connection may hold"),
    (
        "--max-scratch",
        parse_size,
        "compute scratch per device; larger graphs are refused (default: min(1G, mem/10))",
    ),
    ("--max-clients", int, "concurrent connections"),
    (
        "--max-clients-per-addr",
        parse_positive,
        "concurrent connections from one client address (default: no limit)",
    ),
    ("--hello-timeout", float, "seconds a connection has to send HELLO"),
    (
        "--comm-timeout",
        float,
        "seconds COMM_INIT rank 0 waits for its peer server (then answers ok = 0)",
    ),
    ("--max-payload", parse_size, "largest SET_TENSOR payload"),
    ("--max-graph", parse_size, "largest GRAPH_COMPUTE payload"),
    ("--max-graph-nodes", int, "nodes and tensors per graph"),
)
# `serve` options whose ServerConfig field has another name (the rest share theirs).
CONFIG_FIELD_OF = {
    "max_payload": "max_data",
    "model_dir": "model_dirs",
    "peer_fingerprint": "peer_fingerprints",
}


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
    defaults = ServerConfig()  # the one definition of every serve default

    serve = sub.add_parser("serve", help="serve devices to llama.cpp RPC clients")
    serve.add_argument(
        "--host", default=defaults.host, help="address to bind (default %(default)s)"
    )
    serve.add_argument("--port", type=int, default=defaults.port)
    serve.add_argument(
        "--proto",
        type=int,
        choices=SUPPORTED_PROTOCOLS,
        default=defaults.proto,
        help="protocol major version",
    )
    serve.add_argument(
        "--device",
        default=defaults.device,
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
    for flag, parse, help_text in LIMIT_OPTIONS:
        dest = flag[2:].replace("-", "_")
        field = CONFIG_FIELD_OF.get(dest, dest)
        limits.add_argument(flag, type=parse, default=getattr(defaults, field), help=help_text)
    serve.add_argument(
        "--metrics",
        type=parse_metrics_endpoint,
        metavar="[HOST:]PORT",
        help="serve Prometheus /metrics and JSON /status here (default host 127.0.0.1)",
    )
    serve.add_argument(
        "--model-dir",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="answer SET_TENSOR_HASH from the tensors of the *.gguf files under DIR (repeatable)",
    )
    secure = serve.add_argument_group("TLS and tokens (docs/security.md)")
    secure.add_argument("--tls-cert", type=Path, metavar="FILE", help="TLS 1.3 only: PEM chain")
    secure.add_argument(
        "--tls-key", type=Path, metavar="FILE", help="its private key (default: in --tls-cert)"
    )
    secure.add_argument(
        "--tls-self-signed",
        action="store_true",
        help="TLS 1.3 with a key pair made once in $XDG_STATE_HOME/rpcnet/tls (fingerprint logged)",
    )
    secure.add_argument(
        "--tokens",
        type=Path,
        metavar="FILE",
        help="'NAME TOKEN [MEM]' per tenant: every connection presents one (reloaded on change)",
    )
    secure.add_argument(
        "--peer-ca",
        type=Path,
        metavar="PEM",
        help="tensor split: verify the rank-0 peer server's certificate with this CA",
    )
    secure.add_argument(
        "--peer-fingerprint",
        action="append",
        default=[],
        metavar="HEX",
        help="tensor split: or pin the peer's SHA-256 (repeatable; default: our own certificate)",
    )
    secure.add_argument(
        "--cache-shared",
        type=lambda t: tuple(filter(None, (x.strip() for x in t.split(",")))),
        default=(),
        metavar="NAME[,NAME]",
        help="cache namespaces every tenant trusts (tenant names; root: the cache directory)",
    )
    serve.add_argument(
        "-v", "--verbose", action="count", default=0, help="-v debug, -vv every command"
    )

    from rpcnet import cachecli, statuscli

    statuscli.add_parser(sub, parse_endpoint)
    cachecli.add_parser(sub, parse_size)

    caps = sub.add_parser(
        "caps",
        help="connect, HELLO, and show what was negotiated (or --local: this host's RDMA GIDs)",
    )
    caps.add_argument("endpoint", type=parse_endpoint, metavar="HOST:PORT", nargs="?")
    caps.add_argument("--proto", type=int, choices=SUPPORTED_PROTOCOLS, default=DEFAULT_PROTOCOL)
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

    tunnel = sub.add_parser(
        "tunnel",
        help="local plain-TCP forwarder to a TLS + token rpcnet server (llama.cpp connects to it)",
    )
    for flag, help_text in (
        ("--listen", "where llama.cpp connects (repeatable, one per --to, in order)"),
        ("--to", "the rpcnet serve --tls... server (repeatable)"),
    ):
        tunnel.add_argument(
            flag,
            type=parse_endpoint,
            action="append",
            required=True,
            metavar="HOST:PORT",
            help=help_text,
        )
    tunnel.add_argument(
        "--token-file", type=Path, required=True, metavar="FILE", help="the token alone"
    )
    verify = tunnel.add_mutually_exclusive_group(required=True)
    verify.add_argument("--ca", type=Path, metavar="PEM", help="verify the server against this CA")
    verify.add_argument(
        "--fingerprint",
        action="append",
        metavar="HEX",
        help="pin the server certificate's SHA-256 (colons optional; one per --to, or one)",
    )
    tunnel.add_argument(
        "--server-name", help="with --ca: the name to verify (default: the --to host)"
    )
    tunnel.add_argument(
        "--timeout", type=float, default=10.0, help="seconds for connect + TLS + token"
    )
    tunnel.add_argument("-v", "--verbose", action="count", default=0)
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    from rpcnet import logsetup
    from rpcnet.server.app import run
    from rpcnet.server.cache import default_cache_dir

    logsetup.configure(args.verbose)
    cache_dir = None
    if args.cache is not None:
        cache_dir = Path(args.cache) if args.cache else default_cache_dir()
    given = {CONFIG_FIELD_OF.get(name, name): value for name, value in vars(args).items()}
    config = ServerConfig(
        cache_dir=cache_dir,
        model_dirs=tuple(args.model_dir),
        peer_fingerprints=tuple(args.peer_fingerprint),
        **{
            f.name: given[f.name]
            for f in dataclasses.fields(ServerConfig)
            if f.name in given and f.name not in ("model_dirs", "peer_fingerprints")
        },
    )
    if args.tls_cert is not None and args.tls_self_signed:
        print("rpcnet: --tls-cert and --tls-self-signed exclude each other", file=sys.stderr)
        return 2
    return exit_status(lambda: run(config), "rpcnet", f"cannot serve on {args.host}:{args.port}: ")


def cmd_tunnel(args: argparse.Namespace) -> int:
    from rpcnet import logsetup
    from rpcnet.tunnel import TunnelConfig, run_tunnel

    logsetup.configure(args.verbose)

    def tunnel() -> None:
        config = TunnelConfig.from_args(
            listen=args.listen,
            to=args.to,
            token_file=args.token_file,
            ca=args.ca,
            fingerprints=args.fingerprint or [],
            server_name=args.server_name,
            timeout=args.timeout,
        )
        run_tunnel(config)

    return exit_status(tunnel, "rpcnet tunnel")


def exit_status(work: Callable[[], object], prefix: str, os_context: str = "") -> int:
    """Run a long-lived command: 0 when it ends, 2 on a bad configuration (ValueError), 1 when
    the system refuses (OSError: an address in use, a file that cannot be read)."""
    try:
        work()
    except ValueError as exc:
        print(f"{prefix}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prefix}: {os_context}{exc}", file=sys.stderr)
        return 1
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
    from rpcnet.compute.cuda.kernels import NOT_YET_ON_CUDA
    from rpcnet.compute.kernels.kernel_table import table
    from rpcnet.compute.ops import op_name

    for device in ("cpu", "cuda"):
        for k in table(device):
            print(f"{op_name(k.op):<20} {k.types:<48} {k.device}")
    print("\nnot yet on cuda (graphs with these nodes are refused on a cuda device):")
    for op, why in sorted(NOT_YET_ON_CUDA.items()):
        print(f"  {op:<20} {why}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from rpcnet import cachecli, statuscli

    handler = {
        "serve": cmd_serve,
        "caps": cmd_caps,
        "ops": cmd_ops,
        "status": statuscli.run,
        "cache": cachecli.run,
        "tunnel": cmd_tunnel,
    }[args.command]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
