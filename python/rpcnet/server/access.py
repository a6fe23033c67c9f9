"""Who may connect: an allowlist of networks (loopback clients only by default)."""

from __future__ import annotations

import ipaddress
import logging

log = logging.getLogger("rpcnet.server")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK: tuple[Network, ...] = (
    ipaddress.ip_network("127.0.0.0/8"),
    ipaddress.ip_network("::1/128"),
)

EVERYONE: tuple[Network, ...] = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def parse_allow(text: str) -> tuple[Network, ...]:
    """'10.0.0.0/8,192.168.1.7' -> networks; ValueError names the bad entry."""
    nets = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ValueError(f"--allow: {item!r} is not an address or CIDR network") from exc
    return tuple(nets)


def default_allow(host: str, allow: tuple[Network, ...] | None) -> tuple[Network, ...]:
    """The effective allowlist. Without --allow it is loopback only, whatever the bind: a
    non-loopback bind never means "everyone" by default (pass --allow 0.0.0.0/0 for that)."""
    if allow is not None:
        return allow
    if not is_loopback(host):
        log.warning(
            "binding %s without --allow: only loopback clients are accepted; pass "
            "--allow CIDR[,CIDR] to admit others (the protocol has no authentication)",
            host,
        )
    return LOOPBACK


def allowed(peer_ip: str, allow: tuple[Network, ...] | None) -> bool:
    if allow is None:
        return True
    try:
        addr = ipaddress.ip_address(peer_ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr in net for net in allow)


def address_of(peer_ip: str) -> str:
    """The client address a per-address limit counts (an IPv4-mapped IPv6 address as IPv4)."""
    try:
        addr = ipaddress.ip_address(peer_ip.split("%", 1)[0])
    except ValueError:
        return peer_ip
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return str(addr.ipv4_mapped)
    return str(addr)


class AddressQuota:
    """`--max-clients-per-addr`: open connections per client address (None: no limit)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.open: dict[str, int] = {}

    def admit(self, peer_ip: str) -> bool:
        """Count a new connection from `peer_ip`; False (nothing counted) when it is over."""
        addr = address_of(peer_ip)
        count = self.open.get(addr, 0)
        if self.limit is not None and count >= self.limit:
            return False
        self.open[addr] = count + 1
        return True

    def release(self, peer_ip: str) -> None:
        addr = address_of(peer_ip)
        count = self.open.get(addr, 0) - 1
        if count > 0:
            self.open[addr] = count
        else:
            self.open.pop(addr, None)
