"""The server's settings and their defaults (the one place they are defined; the CLI reads them).

Importing this module stays cheap (no NumPy, no devices): `rpcnet --help` builds its parser from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from rpcnet.protocol.commands import DEFAULT_PROTOCOL
from rpcnet.server.access import Network


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 50052
    proto: int = DEFAULT_PROTOCOL
    device: str = "cpu"
    mem: int | None = None  # device capacity to report; default physical RAM
    threads: int | None = None
    cache_dir: Path | None = None
    cache_max: int | None = None
    max_data: int = 1 << 40  # SET_TENSOR payloads are also bounded by their buffer
    max_graph: int = 256 << 20  # GRAPH_COMPUTE payload bytes
    max_graph_nodes: int = 1 << 16  # nodes and tensors per graph
    client_mem: int | None = None  # per-connection buffer quota; default: the device capacity
    max_scratch: int | None = None  # compute scratch per device; default min(1 GiB, mem / 10)
    max_clients: int = 256
    max_clients_per_addr: int | None = None  # open connections per client address; None: any
    hello_timeout: float = 10.0  # seconds a new connection may take to send HELLO
    allow: tuple[Network, ...] | None = None  # None: loopback on a loopback bind
    drain_timeout: float = 30.0
    comm_timeout: float = 30.0  # COMM_INIT: rank 0's wait for its peer, each handshake
    metrics: tuple[str, int] | None = None  # --metrics HOST:PORT: /metrics and /status
    model_dirs: tuple[Path, ...] = ()  # --model-dir: GGUF files whose tensors answer hashes
    tls_cert: Path | None = None  # --tls-cert/--tls-key: TLS 1.3 only
    tls_key: Path | None = None
    tls_self_signed: bool = False  # --tls-self-signed: a key pair kept in the state directory
    peer_ca: Path | None = None  # --peer-ca: tensor-split peers' certificates verified by it
    peer_fingerprints: tuple[str, ...] = ()  # --peer-fingerprint: or pinned (default: our own)
    tokens: Path | None = None  # --tokens FILE: NAME TOKEN [MEM] per tenant
    tokens_poll: float = 1.0  # seconds between checks of the tokens file's mtime
    cache_shared: tuple[str, ...] = ()  # --cache-shared: namespaces every tenant trusts


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_bytes(text: str) -> int:
    """'512M', '8G', '1.5g', '1048576' -> bytes (ValueError otherwise)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtKMGT]?)(?:i?[bB])?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 512M, 8G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
