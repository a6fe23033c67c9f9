"""A TCP relay on 127.0.0.1 that counts the bytes each way: an oracle for the server's counters."""

from __future__ import annotations

import socket
import threading


class CountingProxy:
    """Accepts on a free port, relays every connection to `target`, counts both directions."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.to_server = 0
        self.to_client = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
            for src, dst, up in ((client, server, True), (server, client, False)):
                t = threading.Thread(target=self._pump, args=(src, dst, up), daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while True:
                data = src.recv(1 << 20)
                if not data:
                    break
                dst.sendall(data)
                with self._lock:
                    if up:
                        self.to_server += len(data)
                    else:
                        self.to_client += len(data)
        except OSError:
            pass
        finally:
            for s in (dst, src):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def join(self, timeout: float = 10.0) -> None:
        """Wait until every relayed connection has finished both directions."""
        for t in list(self._threads):
            t.join(timeout)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
