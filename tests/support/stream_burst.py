"""Many SSE streams opened at once, as a reconnect storm opens them: one socket each,
every request written before any answer is read, so that they reach the worker
together. Raw sockets: a thread per stream would spread the opens over time."""

import socket
from contextlib import contextmanager

OPENED = b": stream open"


class Stream:
    """One stream on a socket of its own: what it received so far."""

    def __init__(self, sock):
        self.sock, self.received = sock, b""

    def read_until(self, marker):
        """Read until `marker` is in what was received; AssertionError if the server closes first."""
        while marker not in self.received:
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError(f"the stream ended before {marker!r}: {self.received[-300:]!r}")
            self.received += data
        return self.received

    def status_line(self):
        return self.received.split(b"\r\n", 1)[0].decode("latin-1")


@contextmanager
def streams_opened_at_once(port, path, headers_of, count, timeout=60):
    """`count` GETs of `path` on `port` (loopback), the i-th with the headers
    `headers_of(i)`, all sent before any answer is read; yields the Streams once each
    answered with its head and `: stream open` (or its error: see `status_line`)."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=timeout) for _ in range(count)]
    try:
        for i, sock in enumerate(socks):
            head = "".join(f"{name}: {value}\r\n" for name, value in headers_of(i).items())
            sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode("latin-1"))
        streams = [Stream(sock) for sock in socks]
        for stream in streams:
            try:
                stream.read_until(OPENED)
            except AssertionError:
                pass  # an error answer (its status line tells): the caller asserts on it
        yield streams
    finally:
        for sock in socks:
            sock.close()
