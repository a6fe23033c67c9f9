"""Connection capabilities exchanged in HELLO (spec §2, §12): decoding and display."""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass


@dataclass(frozen=True)
class RdmaCaps:
    qpn: int
    psn: int
    gid: bytes

    @property
    def gid_text(self) -> str:
        addr = ipaddress.IPv6Address(self.gid)
        mapped = addr.ipv4_mapped
        return f"{addr} ({mapped})" if mapped else str(addr)


def decode_caps(caps: bytes) -> RdmaCaps | None:
    """None for the all-zero "no RDMA" caps; otherwise the Linux verbs layout (qpn, psn, gid)."""
    if len(caps) != 24:
        raise ValueError(f"conn_caps must be 24 bytes, got {len(caps)}")
    if not any(caps):
        return None
    qpn, psn = struct.unpack_from("<II", caps)
    return RdmaCaps(qpn, psn, bytes(caps[8:24]))


def describe_caps(caps: bytes) -> str:
    decoded = decode_caps(caps)
    if decoded is None:
        return "none"
    return f"RDMA qpn={decoded.qpn:#x} psn={decoded.psn:#x} gid={decoded.gid_text}"


def negotiated_transport(client_caps: bytes, server_caps: bytes) -> str:
    """Both sides must advertise caps for the connection to move to RDMA."""
    return "RDMA" if any(client_caps) and any(server_caps) else "TCP"
