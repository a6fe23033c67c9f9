"""HELLO's conn_caps (spec §2, §12): the codec of the Linux verbs layout and its display.

`qpn u32, psn u32, gid[16]`, little-endian; all-zero means "no RDMA". The bytes are parsed by the
Rust codec (`rust/src/rdma.rs`); this module only gives them a Python shape.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from rpcnet import _native


@dataclass(frozen=True)
class RdmaCaps:
    qpn: int
    psn: int
    gid: bytes

    @classmethod
    def decode(cls, caps: bytes) -> RdmaCaps | None:
        """None for the all-zero caps; `_native.RdmaError` for bytes that are not caps."""
        decoded = _native.rdma_decode_caps(bytes(caps))
        return None if decoded is None else cls(decoded[0], decoded[1], bytes(decoded[2]))

    @property
    def gid_text(self) -> str:
        addr = ipaddress.IPv6Address(self.gid)
        mapped = addr.ipv4_mapped
        return f"{addr} ({mapped})" if mapped else str(addr)

    def as_dict(self) -> dict:
        return {"qpn": self.qpn, "psn": self.psn, "gid": self.gid_text}


def decode_caps(caps: bytes) -> RdmaCaps | None:
    """Like `RdmaCaps.decode`, with malformed caps as ValueError."""
    try:
        return RdmaCaps.decode(caps)
    except _native.RdmaError as exc:
        raise ValueError(str(exc)) from exc


def describe_caps(caps: bytes) -> str:
    decoded = decode_caps(caps)
    if decoded is None:
        return "none"
    return f"RDMA qpn={decoded.qpn:#x} psn={decoded.psn:#x} gid={decoded.gid_text}"


def negotiated_transport(client_caps: bytes, server_caps: bytes) -> str:
    """Both sides must advertise caps for the connection to move to RDMA."""
    return "RDMA" if any(client_caps) and any(server_caps) else "TCP"
