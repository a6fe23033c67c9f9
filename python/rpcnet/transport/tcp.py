"""Blocking TCP transport (used by `rpcnet caps` and tests; the server's TCP path is the uvloop
BufferedProtocol in `rpcnet.server.stream`, which this module does not replace)."""

from __future__ import annotations

import select
import socket
from typing import Any

from rpcnet._native import MAX_CHUNK
from rpcnet.transport.base import Transport, TransportClosed, TransportError


class TcpTransport(Transport):
    name = "TCP"

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._closed = False

    @classmethod
    def connect(cls, host: str, port: int, timeout: float | None = 10.0) -> TcpTransport:
        sock = socket.create_connection((host, port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(sock)

    def local_address(self) -> str:
        """The socket's local IP (what the RDMA GID selection matches against, spec §12)."""
        return self.sock.getsockname()[0]

    def send(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        try:
            # Never more than 1 GiB per syscall, like the reference (spec §1.2).
            for off in range(0, view.nbytes, MAX_CHUNK):
                self.sock.sendall(view[off : off + MAX_CHUNK])
        except OSError as exc:
            raise TransportClosed(f"TCP send failed: {exc}") from exc

    def recv_into(self, dest: Any) -> None:
        view = memoryview(dest).cast("B")
        got = 0
        while got < view.nbytes:
            try:
                n = self.sock.recv_into(view[got : got + MAX_CHUNK])
            except TimeoutError as exc:
                raise TransportError(f"TCP receive timed out: {exc}") from exc
            except OSError as exc:
                raise TransportClosed(f"TCP receive failed: {exc}") from exc
            if n == 0:
                raise TransportClosed("peer closed the connection")
            got += n

    def peer_closed(self) -> bool:
        """True once the peer hung up (non-blocking; the RDMA transport's liveness check)."""
        if self._closed:
            return True
        try:
            hangup = select.POLLRDHUP | select.POLLHUP | select.POLLERR
            poller = select.poll()
            poller.register(self.sock, hangup)
            return any(ev & hangup for _, ev in poller.poll(0))
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.sock.close()
            except OSError:
                pass
