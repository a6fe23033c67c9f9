"""What `rpcnet tunnel` reads of the client's request stream (sans-I/O).

The tunnel forwards the client's bytes unchanged except for three frames, so it tracks frame
boundaries (a 9-byte header: u8 command, u64 payload size; spec §1) and counts payload bytes
through without looking at them:

- HELLO (14, 24 bytes): the client's transport caps become zeros. The link to the server is TLS
  over TCP; an RDMA upgrade (spec §12) cannot pass through it.
- COMM_INIT (20, 80 bytes; spec §11): handed to `rewrite` (the tunnel maps the rank-0 address the
  client sees, a tunnel listen address, to the real rank-0 server). `rewrite` may answer None:
  the frame is then passed on as a `Deferred` for the tunnel to complete once it has looked the
  address up (another tunnel's listen address).
- STATUS (0xFE, no payload): never a ggml RPC command id (they stop at 24). The tunnel answers it
  itself, with what it knows of this connection (`rpcnet caps` asks it), and forwards nothing.

Chunks inside a payload are passed on as they came (no copy); only headers and the two small
payloads above are gathered.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HEADER = struct.Struct("<BQ")
HELLO, COMM_INIT, STATUS = 14, 20, 0xFE
HELLO_SIZE, COMM_INIT_SIZE = 24, 80
COMM_INIT_BODY = struct.Struct("<IIII64s")  # device, rank, world, port, host (NUL-padded)
STATUS_MAGIC = b"RPCNTUN1"


@dataclass
class Deferred:
    """A COMM_INIT frame whose rank-0 address is still to be looked up."""

    header: bytes
    payload: bytes


class RequestScanner:
    """Feed the client's bytes in order; get back what to send to the server."""

    def __init__(
        self, rewrite: Callable[[bytes], bytes | None], on_status: Callable[[], None]
    ) -> None:
        self._rewrite = rewrite  # None: defer
        self._on_status = on_status
        self._head = bytearray()  # a header split across chunks
        self._remaining = 0  # payload bytes still to pass through untouched
        self._held: bytearray | None = None  # a HELLO or COMM_INIT payload being gathered
        self._held_cmd = 0
        self._held_header = b""
        self._held_last = b""

    def feed(self, data: Any) -> list[Any]:
        out: list[Any] = []
        view = memoryview(data).cast("B")
        while view.nbytes:
            if self._remaining:  # inside a payload
                n = min(self._remaining, view.nbytes)
                if self._held is None:
                    out.append(data if n == view.nbytes == len(data) else view[:n])
                else:
                    self._held += view[:n]
                self._remaining -= n
                view = view[n:]
                if not self._remaining and self._held is not None:
                    done = self._finish_held()
                    out.append(
                        Deferred(self._held_header, bytes(self._held_last))
                        if done is None
                        else self._held_header + done
                    )
                continue
            need = HEADER.size - len(self._head)
            self._head += view[:need]
            view = view[need:]
            if len(self._head) < HEADER.size:
                break
            header = bytes(self._head)
            self._head.clear()
            cmd, size = HEADER.unpack(header)
            if cmd == STATUS and size == 0:
                self._on_status()
                continue
            self._remaining = size
            if (cmd, size) in ((HELLO, HELLO_SIZE), (COMM_INIT, COMM_INIT_SIZE)):
                self._held, self._held_cmd, self._held_header = bytearray(), cmd, header
            else:
                out.append(header)
        return out

    def _finish_held(self) -> bytes | None:
        held, cmd = bytes(self._held or b""), self._held_cmd
        self._held, self._held_last = None, held
        if cmd == HELLO:
            return bytes(HELLO_SIZE)  # no RDMA through a tunnel
        return self._rewrite(held)


def status_frame(info: dict[str, Any]) -> bytes:
    """The tunnel's answer to STATUS: a response frame (u64 size) holding the magic and JSON."""
    body = STATUS_MAGIC + json.dumps(info, sort_keys=True).encode()
    return struct.pack("<Q", len(body)) + body


def parse_status(body: bytes) -> dict[str, Any] | None:
    """The tunnel's status from a STATUS answer; None when `body` is not one."""
    if not body.startswith(STATUS_MAGIC):
        return None
    info = json.loads(body[len(STATUS_MAGIC) :])
    return info if isinstance(info, dict) else None


def rewrite_comm_init(
    payload: bytes, mapping: Callable[[int, str, int], tuple[str, int] | None]
) -> tuple[bytes, tuple[str, int, str, int] | None]:
    """COMM_INIT with its rank-0 address mapped: `mapping(rank, host, port)` gives the new
    (host, port) or None to keep them. Returns the payload and (old host, old port, new host,
    new port) when it changed."""
    device, rank, world, port, raw_host = COMM_INIT_BODY.unpack(payload)
    host = raw_host.split(b"\0", 1)[0].decode("ascii", "replace")
    mapped = mapping(rank, host, port)
    if mapped is None:
        return payload, None
    new_host, new_port = mapped
    encoded = new_host.encode("ascii") if rank != 0 else b""
    if len(encoded) >= 64 or not 0 <= new_port < 1 << 32:
        return payload, None
    body = COMM_INIT_BODY.pack(device, rank, world, new_port, encoded)
    return body, (host, port, new_host if rank else host, new_port)
