"""The reports of `rpcnet caps HOST:PORT` (what each side advertised in HELLO, which transport the
connection ended on, and, at an `rpcnet tunnel` listen address, the tunnel's TLS connection: its
TLS version, the server's certificate fingerprint and the tenant) and `rpcnet caps --local`
(local RDMA devices and GIDs, and which one a connection would use). The caps codec itself is
`rpcnet.transport.caps`."""

from __future__ import annotations

import socket
import struct
import threading
from typing import Any

from rpcnet.transport.base import TransportError
from rpcnet.transport.caps import decode_caps, describe_caps
from rpcnet.transport.tls import colon_hex
from rpcnet.tunnelwire import STATUS, parse_status

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
    from rpcnet.client import connect_client
    from rpcnet.protocol import messages as msg
    from rpcnet.protocol.commands import Cmd

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
        tunnel = tunnel_status(conn) if conn.outcome.transport == "TCP" else None
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
        "tunnel": tunnel,
    }


def tunnel_status(conn: Any) -> dict | None:
    """The last query of a probe: an `rpcnet tunnel` answers STATUS (`rpcnet.tunnelwire`) with
    its connection's TLS facts; anything else closes the connection on this unknown command."""
    try:
        return parse_status(conn.call(STATUS, b""))
    except (OSError, TransportError, ValueError):
        return None


def render_tunnel(tunnel: dict) -> str:
    return (
        f"tunnel          {tunnel['listen']} -> {tunnel['server']}: {tunnel['tls_version']} "
        f"{tunnel['cipher']}\n"
        f"  server certificate sha256 {colon_hex(tunnel['fingerprint'])} "
        f"({tunnel['verified_by']})\n"
        f"  tenant {tunnel['tenant'] or '(the server has no tokens)'}"
    )


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
    if info.get("tunnel"):
        lines.append(render_tunnel(info["tunnel"]))
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
    for p in ports:
        chosen_gid = None  # the GID index a connection would use on this port, if any
        if selection is not None and (selection.device, selection.port) == (p.device, p.port):
            chosen_gid = selection.gid_index
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
                        "selected": g.index == chosen_gid,
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
