"""A real HTTP app to put behind a workspace agent (tests and bench/workspace_apps.py):

    GET  /hello              a small text answer
    GET  /headers?...        what it received, as JSON: method, path, header lines, and
                             the client's port (which connection it came on)
    GET  /hello-then-close   /hello, then the connection is closed (no `Connection: close`
                             said: as an app whose keep-alive timeout ran out)
    GET  /bad-length         an answer whose Content-Length is "+2" (int() would take it)
    GET  /hello-then-drop-next  /hello; the next request on this connection is not
                             answered, the connection closed instead (as an app whose
                             keep-alive timeout runs out just as a request comes)
    POST /upload             the body's length and SHA-256 (Content-Length or chunked)
    GET  /stream?chunks=N    a chunked answer written piece by piece, 0.05 s apart
    GET  /bytes?count=N      N bytes (Content-Length), written from a reused buffer
    GET  /random?count=N&seed=S  N pseudo-random bytes (Content-Length), the same for
                             the same seed: random_bytes(); what it has written so far
                             and whether it ended are in Handler.progress[S]
    GET  /ws                 a websocket that echoes every message (wsproto)
    GET  /slow?id=X&wait=S   answers {"id": X} after S seconds (for demultiplexing)

A threaded server: each connection gets a thread of its own.
"""

import hashlib
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Ping, Request, TextMessage

BLOCK = b"0123456789abcdef" * 4096  # 64 KiB
RANDOM_PIECE = 1024 * 1024


def random_pieces(count, seed):
    """The body of /random?count=N&seed=S, in pieces of at most 1 MiB."""
    generator = random.Random(seed)
    while count > 0:
        piece = generator.randbytes(min(count, RANDOM_PIECE))
        count -= len(piece)
        yield piece


class Progress:
    """How far one /random answer got: bytes written (to the socket), and its end
    ("done", or the error that cut it)."""

    def __init__(self):
        self.sent = 0
        self.ended = threading.Event()
        self.outcome = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    progress = {}  # seed -> Progress of /random
    disable_nagle_algorithm = True  # headers and body are separate writes: no 40 ms delayed-ACK stall

    def log_message(self, format, *args):
        pass

    def _query(self):
        return {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}

    def _answer(self, status, body, content_type="application/json"):
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self):
        if getattr(self, "drop_next", False):
            self.close_connection = True
            return
        route = urlsplit(self.path).path
        handler = {
            "/hello": self._hello,
            "/hello-then-close": self._hello_then_close,
            "/hello-then-drop-next": self._hello_then_drop_next,
            "/bad-length": self._bad_length,
            "/headers": self._headers,
            "/stream": self._stream,
            "/bytes": self._bytes,
            "/random": self._random,
            "/ws": self._websocket,
            "/slow": self._slow,
        }.get(route)
        if handler is None:
            self._answer(404, {"error": f"no route {route}"})
        else:
            handler()

    do_HEAD = do_GET

    def do_POST(self):
        if urlsplit(self.path).path == "/upload":
            self._upload()
        else:
            self._headers()

    do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_POST

    def _hello(self):
        self._answer(200, b"hello from the app\n", "text/plain")

    def _hello_then_close(self):
        self._hello()
        self.close_connection = True

    def _bad_length(self):
        self.send_response(200)
        self.send_header("Content-Length", "+2")
        self.end_headers()
        self.wfile.write(b"ok")

    def _hello_then_drop_next(self):
        self._hello()
        self.drop_next = True

    def _headers(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))  # the next request follows it
        self._answer(
            200,
            {
                "method": self.command,
                "path": self.path,
                "port": self.client_address[1],
                "headers": [[name, value] for name, value in self.headers.items()],
            },
        )

    def _body_chunks(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return
                yield self.rfile.read(size)
                self.rfile.readline()
        remaining = int(self.headers.get("Content-Length") or 0)
        while remaining:
            data = self.rfile.read(min(remaining, 65536))
            if not data:
                return
            remaining -= len(data)
            yield data

    def _upload(self):
        digest, length = hashlib.sha256(), 0
        for data in self._body_chunks():
            digest.update(data)
            length += len(data)
        self._answer(200, {"length": length, "sha256": digest.hexdigest()})

    def _stream(self):
        chunks = int(self._query().get("chunks", "5"))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for number in range(chunks):
            piece = f"piece {number} at {time.monotonic():.3f}\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            self.wfile.flush()
            time.sleep(0.05)
        self.wfile.write(b"0\r\n\r\n")

    def _bytes(self):
        count = int(self._query().get("count", "0"))
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(count))
        self.end_headers()
        view = memoryview(BLOCK)
        while count > 0:
            self.wfile.write(view[: min(count, len(BLOCK))])
            count -= len(BLOCK)

    def _random(self):
        query = self._query()
        count, seed = int(query.get("count", "0")), query.get("seed", "")
        progress = self.progress[seed] = Progress()
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(count))
        self.end_headers()
        try:
            for piece in random_pieces(count, seed):
                view = memoryview(piece)
                while view:  # socket-sized writes: `sent` follows what the reader let through
                    written = self.connection.send(view[:65536])
                    progress.sent += written
                    view = view[written:]
            progress.outcome = "done"
        except OSError as exc:
            progress.outcome = repr(exc)
            raise
        finally:
            progress.ended.set()

    def _slow(self):
        query = self._query()
        time.sleep(float(query.get("wait", "0")))
        self._answer(200, {"id": query.get("id")})

    def _websocket(self):
        connection = WSConnection(ConnectionType.SERVER)
        head = f"GET {self.path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in self.headers.items()) + "\r\n"
        connection.receive_data(head.encode("latin-1"))
        for event in connection.events():
            if isinstance(event, Request):
                self.wfile.write(connection.send(AcceptConnection()))
        self.wfile.flush()
        sock = self.connection
        while True:
            data = sock.recv(65536)
            if not data:
                return
            connection.receive_data(data)
            for event in connection.events():
                if isinstance(event, (TextMessage, BytesMessage)):
                    # wsproto hands over a message in pieces as its bytes arrive: each
                    # piece goes back as a fragment of the same message.
                    sock.sendall(connection.send(type(event)(data=event.data, message_finished=event.message_finished)))
                elif isinstance(event, Ping):
                    sock.sendall(connection.send(event.response()))
                elif isinstance(event, CloseConnection):
                    sock.sendall(connection.send(event.response()))
                    return


class LocalApp:
    """The app on a free loopback port: `.url`, `.stop()`."""

    def __init__(self):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="local-app", daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


if __name__ == "__main__":  # python -m tests.support.workspace_app PORT (the bench runs it in a process of its own)
    import sys

    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()
