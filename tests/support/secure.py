"""TLS + tokens test helpers: certificates (a CA, leaves, expired ones), tokens files, an
in-process `rpcnet tunnel` on its own thread, and a blocking TLS client for raw checks."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
from pathlib import Path

from rpcnet.server.tokens import ANSWER_HEAD, encode_request, parse_answer_head
from rpcnet.tunnel import Route, Tunnel, TunnelConfig

from support.inproc import LoopThread


def _pem_pair(cert, key) -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM), key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


class Pki:
    """A throwaway CA in `directory` and leaf certificates it signs."""

    def __init__(self, directory: Path, name: str = "test-ca") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.subject)
            .issuer_name(self.subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.ca_path = directory / f"{name}.pem"
        self.ca_path.write_bytes(_pem_pair(self.cert, self.key)[0])

    def leaf(self, name: str, ips: tuple[str, ...], expired: bool = False) -> tuple[Path, Path]:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        start, end = (
            (now - datetime.timedelta(days=10), now - datetime.timedelta(days=1))
            if expired
            else (now - datetime.timedelta(days=1), now + datetime.timedelta(days=30))
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(i)) for i in ips]),
                critical=False,
            )
            .sign(self.key, hashes.SHA256())
        )
        pem_cert, pem_key = _pem_pair(cert, key)
        cert_path, key_path = self.directory / f"{name}.pem", self.directory / f"{name}.key"
        cert_path.write_bytes(pem_cert)
        key_path.write_bytes(pem_key)
        return cert_path, key_path


def write_tokens(path: Path, tenants: dict[str, tuple[str, str | None]]) -> Path:
    lines = ["# test tenants"]
    lines += [f"{name} {token} {mem or ''}".rstrip() for name, (token, mem) in tenants.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


class TunnelThread(LoopThread):
    """`rpcnet tunnel` in-process, on its own event loop thread (ports chosen by the OS)."""

    thread_name = "rpcnet-test-tunnel"

    def __init__(
        self,
        targets: list[tuple[str, int]],
        token: str,
        *,
        fingerprint: str | None = None,
        ca: Path | None = None,
        timeout: float = 5.0,
        listen_host: str = "127.0.0.1",
    ) -> None:
        routes = tuple(Route((listen_host, 0), t, fingerprint) for t in targets)
        self.config = TunnelConfig(routes, token.encode(), ca, None, timeout)
        super().__init__()

    def make(self) -> Tunnel:
        return Tunnel(self.config)

    @property
    def tunnel(self) -> Tunnel | None:
        return self.service

    @property
    def ports(self) -> list[int]:
        assert self.tunnel is not None
        return self.tunnel.ports

    @property
    def endpoints(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]


def tls_socket(port: int, host: str = "127.0.0.1", **ctx_opts) -> ssl.SSLSocket:
    """A blocking TLS connection that verifies nothing (raw checks of the server side)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    for key, value in ctx_opts.items():
        setattr(ctx, key, value)
    raw = socket.create_connection((host, port), timeout=5)
    return ctx.wrap_socket(raw)


def present_token(sock: ssl.SSLSocket, token: str) -> tuple[int, str] | None:
    """Send the preamble; (status, tenant) answered, or None when the server just closed."""
    sock.sendall(encode_request(token.encode()))
    head = b""
    while len(head) < ANSWER_HEAD.size:
        chunk = sock.recv(ANSWER_HEAD.size - len(head))
        if not chunk:
            return None
        head += chunk
    status, length = parse_answer_head(head)
    name = b""
    while len(name) < length:
        name += sock.recv(length - len(name))
    return status, name.decode()
