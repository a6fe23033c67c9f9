"""TLS 1.3 for the wire: contexts, certificate fingerprints and the self-signed key pair.

No sockets here: the server's connections (`rpcnet.transport.tlssocket`) and the tunnel
(`rpcnet.tunnelio`) run TLS as `ssl.SSLObject`s over memory BIOs made from these contexts. A
fingerprint is the hex SHA-256 of the certificate's DER form.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import re
import shutil
import ssl
import subprocess
from pathlib import Path
from typing import Any

log = logging.getLogger("rpcnet.tls")

SELF_SIGNED_DAYS = 3650
CERT_NAME, KEY_NAME = "server.pem", "server.key"


class TlsSetupError(ValueError):
    """A certificate, key or fingerprint cannot be used (the message says which and why)."""


def state_dir() -> Path:
    """rpcnet's state directory: $XDG_STATE_HOME/rpcnet, default ~/.local/state/rpcnet."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "rpcnet"


class DirectSSLObject(ssl.SSLObject):
    """An `ssl.SSLObject` whose `read`, `write` and `pending` are the C methods themselves.

    They are called once per 16 KiB record; the Python wrapper frames of `ssl.SSLObject` would
    cost a large part of the CPU time of a large upload. Behaviour is the wrappers' (they only
    pass their arguments on)."""

    @classmethod
    def _create(cls, *args: Any, **kwargs: Any) -> DirectSSLObject:
        self = super()._create(*args, **kwargs)  # type: ignore[misc]
        inner = self._sslobj
        self.__dict__.update(read=inner.read, write=inner.write, pending=inner.pending)
        return self


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """TLS 1.3 only, the given certificate chain and key."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.sslobject_class = DirectSSLObject
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise TlsSetupError(f"cannot load certificate {cert} / key {key}: {exc}") from exc
    return ctx


def client_context(ca: Path | None) -> ssl.SSLContext:
    """TLS 1.3 only. With `ca`: the server's chain and name are verified against it. Without:
    nothing is verified by OpenSSL; the caller must pin the fingerprint (`check_fingerprint`)
    before it sends anything."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.sslobject_class = DirectSSLObject
    if ca is None:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    try:
        ctx.load_verify_locations(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise TlsSetupError(f"cannot load CA file {ca}: {exc}") from exc
    return ctx


def fingerprint(der: bytes) -> str:
    """Lowercase hex SHA-256 of a DER certificate."""
    return hashlib.sha256(der).hexdigest()


def parse_fingerprint(text: str) -> str:
    """'AB:CD:...' or 'abcd...' (64 hex digits, colons optional) -> lowercase hex."""
    hexed = text.strip().replace(":", "").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", hexed):
        raise TlsSetupError(
            f"fingerprint {text!r}: expected the 64 hex digits of a SHA-256, colons optional"
        )
    return hexed


def colon_hex(hexed: str) -> str:
    return ":".join(hexed[i : i + 2] for i in range(0, len(hexed), 2)).upper()


def cert_fingerprint(path: Path) -> str:
    """The fingerprint of the first certificate in a PEM file."""
    pem = path.read_text()
    begin, end_mark = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = pem.find(begin)
    end = pem.find(end_mark, start)
    if start < 0 or end < 0:
        raise TlsSetupError(f"{path}: no PEM certificate")
    return fingerprint(ssl.PEM_cert_to_DER_cert(pem[start : end + len(end_mark)]))


def check_fingerprint(der: bytes | None, pinned: str) -> str:
    """The server certificate's fingerprint; TlsSetupError when it is not the pinned one."""
    if der is None:
        raise TlsSetupError("the server sent no certificate")
    got = fingerprint(der)
    if got != pinned:
        raise TlsSetupError(
            f"server certificate fingerprint {colon_hex(got)} is not the pinned {colon_hex(pinned)}"
        )
    return got


def self_signed(directory: Path | None = None, hosts: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """The key pair of `--tls-self-signed`: made once (EC P-256, 10 years) and kept in
    `directory` (default: the state directory's tls/), the key readable by its owner only."""
    directory = directory or state_dir() / "tls"
    cert, key = directory / CERT_NAME, directory / KEY_NAME
    if cert.exists() and key.exists():
        return cert, key
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    names = tuple(dict.fromkeys(("localhost", "127.0.0.1", *hosts)))
    try:
        pem_cert, pem_key = _make_with_cryptography(names)
    except ImportError:
        pem_cert, pem_key = _make_with_openssl(names, directory)
    _write_private(key, pem_key)
    cert.write_bytes(pem_cert)
    log.info("made a self-signed TLS key pair in %s", directory)
    return cert, key


def _write_private(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _make_with_cryptography(names: tuple[str, ...]) -> tuple[bytes, bytes]:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rpcnet")])
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem_key = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), pem_key


def _make_with_openssl(names: tuple[str, ...], directory: Path) -> tuple[bytes, bytes]:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise TlsSetupError(
            "--tls-self-signed needs the 'cryptography' package (pip install 'rpcnet[tls]') "
            "or the openssl command"
        )
    san = ",".join(f"IP:{n}" if re.fullmatch(r"[0-9.:]+", n) else f"DNS:{n}" for n in names)
    cert, key = directory / ".new.pem", directory / ".new.key"
    try:
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
            + ["-nodes", "-keyout", str(key), "-out", str(cert), "-days", str(SELF_SIGNED_DAYS)]
            + ["-subj", "/CN=rpcnet", "-addext", f"subjectAltName={san}"],
            check=True,
            capture_output=True,
        )
        return cert.read_bytes(), key.read_bytes()
    except subprocess.CalledProcessError as exc:
        raise TlsSetupError(f"openssl req failed: {exc.stderr.decode(errors='replace')}") from exc
    finally:
        for path in (cert, key):
            path.unlink(missing_ok=True)
