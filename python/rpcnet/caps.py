"""Connection capabilities exchanged in HELLO (spec §2, §12): decoding, display, and the reports of
`rpcnet caps HOST:PORT` (what each side advertised, which transport the connection ended on) and
`rpcnet caps --local` (local RDMA devices and GIDs, and which one a connection would use)."""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
from dataclasses import dataclass
from typing import Any


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

    def as_dict(self) -> dict:
        return {"qpn": self.qpn, "psn": self.psn, "gid": self.gid_text}


def decode_caps(caps: bytes) -> RdmaCaps | None:
    """None for the all-zero "no RDMA" caps; otherwise the Linux verbs layout (qpn, psn, gid)."""
    from rpcnet import _native  # the codec lives in rust/src/rdma.rs

    try:
        decoded = _native.rdma_decode_caps(bytes(caps))
    except _native.RdmaError as exc:
        raise ValueError(str(exc)) from exc
    return None if decoded is None else RdmaCaps(decoded[0], decoded[1], bytes(decoded[2]))


def describe_caps(caps: bytes) -> str:
    decoded = decode_caps(caps)
    if decoded is None:
        return "none"
    return f"RDMA qpn={decoded.qpn:#x} psn={decoded.psn:#x} gid={decoded.gid_text}"


def negotiated_transport(client_caps: bytes, server_caps: bytes) -> str:
    """Both sides must advertise caps for the connection to move to RDMA."""
    return "RDMA" if any(client_caps) and any(server_caps) else "TCP"


# ------------------------------------------------------------------------------------------------
# `rpcnet caps HOST:PORT`: connect, negotiate like a llama.cpp client, report what happened


def probe(
    host: str,
    port: int,
    proto: int = 8,
    *,
    provider: Any = None,
    timeout: float = 10.0,
) -> dict:
    """HELLO (offering RDMA when `provider` can), then the device queries over the transport the
    connection ended on. `provider` None offers no RDMA."""
    from rpcnet.protocol import messages as msg
    from rpcnet.protocol.commands import Cmd
    from rpcnet.transport.negotiate import connect_client

    conn = connect_client(host, port, provider=provider, timeout=timeout)
    watchdog = threading.Timer(timeout, getattr(conn.transport, "stop", threading.Event()).set)
    watchdog.daemon = True
    watchdog.start()
    try:
        devices = []
        for index in range(msg.parse_u32(conn.call(Cmd.DEVICE_COUNT, b"", 4))):
            dev = msg.u32(index)
            free, total = struct.unpack("<QQ", conn.call(Cmd.GET_DEVICE_MEMORY, dev, 16))
            devices.append(
                {
                    "index": index,
                    "free": free,
                    "total": total,
                    "alignment": msg.parse_u64(conn.call(Cmd.GET_ALIGNMENT, dev, 8)),
                    "max_size": msg.parse_u64(conn.call(Cmd.GET_MAX_SIZE, dev, 8)),
                }
            )
    finally:
        watchdog.cancel()
        conn.close()
    client_rdma, server_rdma = decode_caps(conn.client_caps), decode_caps(conn.server_caps)
    return {
        "endpoint": f"{host}:{port}",
        "version": ".".join(map(str, conn.version)),
        "client_caps": conn.client_caps.hex(),
        "client_caps_decoded": describe_caps(conn.client_caps),
        "client_offer": conn.offer_reason,
        "client_rdma": None if client_rdma is None else client_rdma.as_dict(),
        "server_caps": conn.server_caps.hex(),
        "server_caps_decoded": describe_caps(conn.server_caps),
        "server_rdma": None if server_rdma is None else server_rdma.as_dict(),
        "transport": conn.outcome.transport,
        "transport_detail": conn.outcome.reason,
        "devices": devices,
    }


def render(info: dict) -> str:
    client = info["client_caps_decoded"]
    if info.get("client_offer") and client == "none":
        client = f"none: {info['client_offer']}"
    lines = [
        f"endpoint        {info['endpoint']}",
        f"protocol        {info['version']}",
        f"client caps     {info['client_caps']}  ({client})",
        f"server caps     {info['server_caps']}  ({info['server_caps_decoded']})",
        f"transport       {info['transport']}  ({info['transport_detail']})",
        f"devices         {len(info['devices'])}",
    ]
    for d in info["devices"]:
        lines.append(
            f"  [{d['index']}] memory {d['free'] >> 20} MiB free / {d['total'] >> 20} MiB total, "
            f"alignment {d['alignment']}, max size {d['max_size']:#x}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# `rpcnet caps --local [--to ADDR]`: local devices, GIDs, and the one a connection would use


def route_source(dest: str) -> str:
    """The local address the kernel would use to reach `dest` (HOST or HOST:PORT); no packet
    is sent (a connected UDP socket only looks the route up)."""
    host, port = dest, 50052
    if dest.count(":") == 1:
        host, _, p = dest.partition(":")
        port = int(p) if p.isdigit() else port
    host = host.strip("[]")
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)
        return s.getsockname()[0]


def local_report(to: str | None = None, *, root: str | None = None, environ: Any = None) -> dict:
    from rpcnet import _native
    from rpcnet.transport.rdma import RdmaUnavailable, local_ports, pyverbs_status

    info: dict[str, Any] = {"source": None, "error": None, "ports": [], "environment": {}}
    try:
        ports, info["source"] = local_ports(root)
    except RdmaUnavailable as exc:
        ports, info["error"] = [], str(exc)
    env = None
    try:
        env = _native.rdma_env(environ)
        info["environment"] = {
            name: value
            for name, value in (
                (env.disabled_by, "set"),
                (env.device_var, env.device),
                (env.gid_var, None if env.gid_index is None else str(env.gid_index)),
            )
            if name
        }
    except _native.RdmaError as exc:
        info["environment_error"] = str(exc)
    ok, text = pyverbs_status()
    info["data_path"] = {"available": ok, "detail": text}
    selection = None
    if to is not None:
        info["to"] = to
        try:
            local = route_source(to)
            info["local_address"] = local
            if env is None:
                raise _native.RdmaError(info["environment_error"])
            if not ports and info["error"]:
                raise _native.RdmaError(info["error"])
            selection = _native.rdma_resolve(ports, local, env)
            info["selection"] = {
                "device": selection.device,
                "port": selection.port,
                "gid_index": selection.gid_index,
                "gid": selection.gid_text,
                "kind": selection.kind,
                "ndev": selection.ndev,
                "how": selection.how,
            }
        except (OSError, ValueError) as exc:
            info["no_rdma"] = f"cannot find the local address towards {to}: {exc}"
        except _native.RdmaError as exc:
            info["no_rdma"] = str(exc)
    chosen_gid = selection.gid_index if selection is not None else None
    for p in ports:
        chosen = selection is not None and (selection.device, selection.port) == (p.device, p.port)
        info["ports"].append(
            {
                "device": p.device,
                "port": p.port,
                "state": p.state,
                "link_layer": p.link_layer,
                "gids": [
                    {
                        "index": g.index,
                        "gid": g.gid_text,
                        "address": g.address,
                        "kind": g.kind,
                        "ndev": g.ndev,
                        "selected": chosen and g.index == chosen_gid,
                    }
                    for g in p.gids
                ],
            }
        )
    return info


def render_local(info: dict) -> str:
    lines = []
    if info["error"]:
        lines.append(f"RDMA devices    none: {info['error']}")
    elif not info["ports"]:
        lines.append(f"RDMA devices    none (read from {info['source']})")
    else:
        lines.append(f"RDMA devices    read from {info['source']}")
    for p in info["ports"]:
        extras = "  ".join(x for x in (p["state"], p["link_layer"]) if x)
        lines.append(f"  {p['device']} port {p['port']}  {extras}".rstrip())
        if not p["gids"]:
            lines.append("      (no GIDs)")
        for g in p["gids"]:
            mark = f"   <= used for {info['to']}" if g["selected"] else ""
            lines.append(
                f"      GID {g['index']:>3}  {g['address']:<28} {g['kind']:<8} "
                f"{g['ndev'] or '-'}{mark}"
            )
    env = info["environment"]
    shown = ", ".join(f"{k}={v}" if v != "set" else f"{k} set" for k, v in env.items())
    if info.get("environment_error"):
        shown = f"invalid: {info['environment_error']}"
    lines.append(f"environment     {shown or 'no GGML_RDMA_* / RPCNET_*RDMA* variables set'}")
    data = info["data_path"]
    state = data["detail"] if data["available"] else f"unavailable: {data['detail']}"
    lines.append(f"data path       {state}")
    if "to" in info:
        sel = info.get("selection")
        if sel is not None:
            lines.append(
                f"connection to   {info['to']}: local address {info['local_address']} -> "
                f"{sel['device']} port {sel['port']} GID {sel['gid_index']} ({sel['kind']}): "
                f"{sel['how']}"
            )
        else:
            lines.append(f"connection to   {info['to']}: no RDMA: {info['no_rdma']}")
    else:
        lines.append("connection to   (give --to ADDR to see which GID a connection would use)")
    return "\n".join(lines)
