"""A local HTTP server posing as a model provider, for the tests of the shared provider
transport (app/common/provider_http.py): JSON, compressed, capped and held answers,
errors that quote the key, redirects, lines and SSE records; `seen` holds each
request, `release` ends a held answer."""

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import urlsplit

from devtools.fake_server import BackgroundServer, QuietThreadingServer, send_whole

KEY = "sk-live-0123456789abcdef"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as providers answer

    def log_message(self, *args):
        pass

    def _send(self, code, body, content_type="application/json", headers=()):
        send_whole(self, code, body, content_type, headers)

    def do_GET(self):
        self._answer()

    def do_POST(self):
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self):
        fake = self.server.fake
        path = self.path
        fake.seen.append(
            {
                "path": path,
                "port": self.client_address[1],
                "headers": dict(self.headers),
                "method": self.command,
                "body": getattr(self, "body", b""),
            }
        )
        if path.startswith("http://"):  # asked as a proxy: route on the target's path
            path = urlsplit(path).path
        if path == "/json":
            self._send(200, b'{"ok": true}')
        elif path == "/gzip":
            self._send(200, gzip.compress(b'{"zipped": true}'), headers=[("Content-Encoding", "gzip")])
        elif path.startswith("/status/"):
            error = {"error": {"message": f"wrong key {KEY}, try   token_abcdef123 again"}}
            self._send(int(path.rsplit("/", 1)[1]), json.dumps(error).encode())
        elif path == "/big":
            self._send(200, b"x" * 5000, "text/plain")
        elif path == "/text":
            self._send(200, b"not json", "text/plain")
        elif path == "/lines":
            self._send(200, b'{"a": 1}\n{"b": 2}\r\n{"c": 3}', "application/x-ndjson")
        elif path == "/sse":
            self._send(200, b"data: one\n\nevent: x\ndata: two\ndata: lines\n\n", "text/event-stream")
        elif path.startswith("/redirect/"):
            self._send(302, b"", headers=[("Location", "http://" + path[len("/redirect/") :])])
        elif path.startswith("/moved/"):  # 308: the same request, elsewhere
            self._send(308, b"", headers=[("Location", "/" + path[len("/moved/") :])])
        elif path == "/hold-head":
            fake.release.wait(30)
            self._send(200, b"{}")
        elif path == "/hold-body":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"{")
            self.wfile.flush()
            fake.release.wait(30)
        else:
            self._send(404, b'{"error": "no such route"}')


class FakeProvider(BackgroundServer):
    def __init__(self):
        self._server = QuietThreadingServer(("127.0.0.1", 0), _Handler)
        self._server.fake = self
        self.seen = []
        self.release = threading.Event()

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"
