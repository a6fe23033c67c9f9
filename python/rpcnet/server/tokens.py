"""Tenant tokens (sans-I/O): the `--tokens` file, constant-time lookup and the token preamble.

The tokens file has one tenant per line, ``NAME TOKEN [MEM]`` separated by whitespace; ``#``
starts a comment. MEM caps what all of that tenant's connections hold together (the units of
``--client-mem``: 512M, 8G, a byte count).

The preamble is what `rpcnet tunnel` sends right after the TLS handshake, before any ggml RPC
frame (docs/security.md has the bytes)::

    request:  b"RPCNTOK1" | u16 little-endian token length (1..1024) | token bytes (UTF-8)
    answer:   b"RPCNTOK1" | u8 status (0 accepted, 1 refused) | u8 name length | tenant name

Its first byte ("R", 0x52) is no ggml RPC command id, so a server tells a preamble from a HELLO
(id 14) by its first byte.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

MAGIC = b"RPCNTOK1"
MAX_TOKEN = 1024
MIN_TOKEN = 16  # characters: shorter tokens are refused when the file is read
REQUEST_HEAD = struct.Struct("<8sH")  # magic, token length
ANSWER_HEAD = struct.Struct("<8sBB")  # magic, status, tenant name length
ACCEPTED, REFUSED = 0, 1
NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
RESERVED_NAMES = frozenset({"root"})  # the cache root namespace (`--cache-shared root`)


class TokensError(ValueError):
    """The tokens file is malformed; the message names the line."""


class PreambleError(ValueError):
    """The bytes a connection sent are not a token preamble."""


@dataclass(frozen=True)
class Tenant:
    name: str
    digest: bytes  # SHA-256 of the token: compared in constant time, whatever its length
    mem: int | None  # bytes all of this tenant's connections may hold together
    # The token itself: a TLS server presents it to its tensor-split peer (server/peertls.py).
    token: bytes = field(default=b"", repr=False, compare=False)


def token_digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class TokenTable:
    """The tenants of one version of the tokens file."""

    def __init__(self, tenants: tuple[Tenant, ...] = ()) -> None:
        self.tenants = tenants

    def __len__(self) -> int:
        return len(self.tenants)

    def match(self, token: bytes) -> Tenant | None:
        """The tenant whose token this is. Every entry is compared (`hmac.compare_digest` of
        SHA-256 digests), so the time taken says nothing about which one, or how close."""
        digest = token_digest(token)
        found = None
        for tenant in self.tenants:
            if hmac.compare_digest(tenant.digest, digest):
                found = tenant
        return found

    def holds(self, tenant: Tenant) -> bool:
        """`tenant`'s token is still in this table (under the same name)."""
        return any(
            t.name == tenant.name and hmac.compare_digest(t.digest, tenant.digest)
            for t in self.tenants
        )

    def by_name(self, name: str) -> Tenant | None:
        return next((t for t in self.tenants if t.name == name), None)


def parse_tokens(text: str, parse_size: Callable[[str], int]) -> TokenTable:
    """The table of a tokens file's text; `TokensError` names the first bad line."""
    tenants: list[Tenant] = []
    names: set[str] = set()
    digests: set[bytes] = set()
    for number, raw in enumerate(text.splitlines(), 1):
        fields = raw.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) not in (2, 3):
            raise TokensError(f"line {number}: expected NAME TOKEN [MEM], got {len(fields)} fields")
        name, token = fields[0], fields[1]
        if not NAME.fullmatch(name) or name in RESERVED_NAMES:
            raise TokensError(
                f"line {number}: tenant name {name!r}: 1-64 of A-Z a-z 0-9 _ . - (not 'root')"
            )
        if name in names:
            raise TokensError(f"line {number}: tenant {name!r} appears twice")
        encoded = token.encode()
        if not MIN_TOKEN <= len(encoded) <= MAX_TOKEN:
            raise TokensError(
                f"line {number}: tenant {name!r}: a token has {MIN_TOKEN} to {MAX_TOKEN} bytes"
            )
        digest = token_digest(encoded)
        if digest in digests:
            raise TokensError(f"line {number}: tenant {name!r} reuses another tenant's token")
        mem = None
        if len(fields) == 3:
            try:
                mem = parse_size(fields[2])
            except ValueError as exc:
                raise TokensError(f"line {number}: tenant {name!r}: MEM: {exc}") from exc
        names.add(name)
        digests.add(digest)
        tenants.append(Tenant(name, digest, mem, encoded))
    return TokenTable(tuple(tenants))


# ------------------------------------------------------------------------------- the preamble


def encode_request(token: bytes) -> bytes:
    if not 1 <= len(token) <= MAX_TOKEN:
        raise PreambleError(f"a token has 1 to {MAX_TOKEN} bytes, this one {len(token)}")
    return REQUEST_HEAD.pack(MAGIC, len(token)) + token


def is_preamble_start(first: int) -> bool:
    return first == MAGIC[0]


def parse_request_head(head: bytes) -> int:
    """The token length announced by the first `REQUEST_HEAD.size` bytes."""
    magic, length = REQUEST_HEAD.unpack(head)
    if magic != MAGIC:
        raise PreambleError("no token preamble (a plain ggml RPC client, or not rpcnet tunnel)")
    if not 1 <= length <= MAX_TOKEN:
        raise PreambleError(f"token preamble announces {length} bytes (1 to {MAX_TOKEN})")
    return length


def encode_answer(status: int, tenant: str = "") -> bytes:
    name = tenant.encode()
    return ANSWER_HEAD.pack(MAGIC, status, len(name)) + name


def parse_answer_head(head: bytes) -> tuple[int, int]:
    """(status, tenant name length) from the first `ANSWER_HEAD.size` bytes of the answer."""
    magic, status, length = ANSWER_HEAD.unpack(head)
    if magic != MAGIC:
        raise PreambleError("the server answered something else than a token answer")
    return status, length
