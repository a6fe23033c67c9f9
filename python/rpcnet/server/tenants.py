"""The tenants of `--tokens`: the file's current table, reloads, and each tenant's shared quota.

`Tenants.poll()` re-reads the file when its identity (mtime, size, inode) changed; the server
calls it every `tokens_poll` seconds and closes the connections whose token is gone. A file
that fails to parse keeps the previous table (one log line says why).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rpcnet.server.tokens import Tenant, TokensError, TokenTable, parse_tokens

log = logging.getLogger("rpcnet.server")


class Holder(Protocol):
    def bytes_held(self) -> int: ...


class TenantShare:
    """What all connections of one tenant hold together, and the cap on it (MEM)."""

    def __init__(self, name: str, mem: int | None) -> None:
        self.name = name
        self.mem = mem
        self.sessions: set[Holder] = set()

    def held(self) -> int:
        return sum(s.bytes_held() for s in self.sessions)


class Tenants:
    def __init__(self, path: Path, parse_size: Callable[[str], int]) -> None:
        self.path = Path(path)
        self._parse_size = parse_size
        self._identity: tuple[int, int, int] | None = None
        self.shares: dict[str, TenantShare] = {}
        self.table = self._read()  # a bad file at start is an error (ValueError)

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self.path)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _read(self) -> TokenTable:
        try:
            identity = self._stat()
            text = self.path.read_text()
        except OSError as exc:
            raise TokensError(f"--tokens {self.path}: {exc}") from exc
        try:
            table = parse_tokens(text, self._parse_size)
        except TokensError as exc:
            raise TokensError(f"--tokens {self.path}: {exc}") from exc
        self._identity = identity
        for tenant in table.tenants:
            share = self.shares.get(tenant.name)
            if share is not None:
                share.mem = tenant.mem
        return table

    def poll(self) -> bool:
        """Re-read the file if it changed; True when a new table is in force."""
        try:
            identity = self._stat()
        except OSError as exc:
            if self._identity is not None:
                log.warning("--tokens %s: %s; keeping the tenants read before", self.path, exc)
                self._identity = None
            return False
        if identity == self._identity:
            return False
        try:
            table = self._read()
        except TokensError as exc:
            self._identity = identity  # one log line per change, not one per poll
            log.warning("%s; keeping the tenants read before", exc)
            return False
        self.table = table
        log.info("--tokens %s reloaded: %d tenants", self.path, len(table))
        return True

    def authenticate(self, token: bytes) -> Tenant | None:
        return self.table.match(token)

    def valid(self, tenant: Tenant) -> bool:
        return self.table.holds(tenant)

    def share(self, tenant: Tenant) -> TenantShare:
        share = self.shares.get(tenant.name)
        if share is None:
            share = self.shares[tenant.name] = TenantShare(tenant.name, tenant.mem)
        share.mem = tenant.mem
        return share

    def snapshot(self) -> dict[str, Any]:
        return {
            name: {"connections": len(s.sessions), "held": s.held(), "mem": s.mem}
            for name, s in self.shares.items()
        }
