"""Raw-socket helpers for sending hand-made (often malformed) frames."""

from __future__ import annotations

import socket
import struct
import time

HELLO = b"\x0e" + struct.pack("<Q", 24) + bytes(24)


def frame(cmd: int, payload: bytes = b"", size: int | None = None) -> bytes:
    return struct.pack("<BQ", cmd, len(payload) if size is None else size) + payload


class RawConn:
    def __init__(self, port: int, hello: bool = True, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if hello:
            self.sock.sendall(HELLO)
            self.read_response(28)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_exact(self, n: int) -> bytes:
        out = bytearray(n)
        view = memoryview(out)
        got = 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if not k:
                raise ConnectionError("closed")
            got += k
        return bytes(out)

    def read_response(self, expected: int | None = None) -> bytes:
        (size,) = struct.unpack("<Q", self.recv_exact(8))
        if expected is not None:
            assert size == expected, f"response size {size} != {expected}"
        return self.recv_exact(size)

    def call(self, cmd: int, payload: bytes = b"", expected: int | None = None) -> bytes:
        self.send(frame(cmd, payload))
        return self.read_response(expected)

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True if the server closes without sending anything more."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                data = self.sock.recv(65536)
                if not data:
                    return True
                return False  # it answered instead of closing
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
        return False

    def close(self) -> None:
        self.sock.close()
