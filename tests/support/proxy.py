"""The proxy tests' helpers: a service's request log read from its stderr file
(`ServiceLog`), a local echo server posing as a backend (`EchoServer`), and a hostile
workspace app (`HostileApp`)."""

import base64
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from devtools.fake_server import send_whole


class ServiceLog:
    """The stderr of a service, captured to a file: its one line per request."""

    def __init__(self, path):
        self.path = path

    def text(self):
        return self.path.read_text(errors="replace")

    def request_lines(self):
        return [line for line in self.text().splitlines() if " bundle.request " in line]

    def wait_for(self, fragment, timeout=10.0):
        """The first request line containing `fragment`, polled until `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.request_lines():
                if fragment in line:
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no request line with {fragment!r} in the service log within {timeout} s:\n{self.text()}"
                )
            time.sleep(0.05)  # polling the log file with a deadline


class _EchoHandler(BaseHTTPRequestHandler):
    """Answers every request with what it received, as JSON: method, path, HTTP
    version, the header lines in order (duplicates kept) and the body's size."""

    protocol_version = "HTTP/1.1"  # keepalive, as gunicorn

    def _echo(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        seen = {
            "method": self.command,
            "path": self.path,
            "version": self.request_version,
            "headers": [[name, value] for name, value in self.headers.items()],
            "body_bytes": len(body),
        }
        self.server.seen.append(seen)
        payload = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _echo

    def log_message(self, format, *args):
        pass


class EchoServer:
    """A stand-in backend posing as service `name`: `.seen` lists every request it got."""

    def __init__(self, name):
        self.name = name
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHandler)
        self.httpd.daemon_threads = True
        self.httpd.seen = self.seen = []
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="echo-backend", daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)


# --------------------------------------------------------------------------- a hostile workspace app

ATTACKER_TOKEN = "Attacker00-attackerattackerattacke"  # the shape of a session token


class _HostileHandler(BaseHTTPRequestHandler):
    """A workspace app that attacks its visitors (tests of app isolation):

    GET /page        an HTML page whose script (`HostileApp.script`) runs the attacks
    GET /cookies     answers Set-Cookie for the platform's cookies (and one of its own,
                     and one for the parent domain)
    GET /accel       answers X-Accel-Redirect to the platform's account route (and its kin)
    GET /ws          a websocket handshake answer that sets the platform's cookie too
    GET /seen        what it received (path and headers), as JSON
    """

    protocol_version = "HTTP/1.1"
    script = ""

    def log_message(self, format, *args):
        pass

    def _send(self, status, body, content_type, headers=()):
        send_whole(self, status, body, content_type, headers)

    def do_GET(self):
        route = self.path.split("?", 1)[0]
        if route == "/page":
            page = f"<!doctype html><title>hostile</title><pre id=out></pre><script>{self.script}</script>"
            self._send(200, page.encode(), "text/html")
        elif route == "/cookies":
            self._send(
                200,
                b"cookies\n",
                "text/plain",
                [
                    ("Set-Cookie", f"workspace_session_token={ATTACKER_TOKEN}; Path=/; HttpOnly"),
                    ("Set-Cookie", "workspace_app_token=forged; Path=/"),
                    ("Set-Cookie", "oidc_state=forged; Path=/api/v2/users/oidc"),
                    ("Set-Cookie", "tossed=1; Path=/; Domain=localhost"),
                    ("Set-Cookie", "app_cookie=kept; Path=/"),
                ],
            )
        elif route == "/accel":
            self._send(
                200,
                b"the app's own body\n",
                "text/plain",
                [
                    ("X-Accel-Redirect", "/api/v2/users/me"),
                    ("X-Accel-Buffering", "yes"),
                    ("X-Accel-Expires", "600"),
                    ("X-Accel-Limit-Rate", "1"),
                    ("X-Accel-Charset", "koi8-r"),
                ],
            )
        elif route == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            key = self.headers["Sec-WebSocket-Key"]
            accept = base64.b64encode(hashlib.sha1((key + WEBSOCKET_GUID).encode()).digest()).decode()
            self.wfile.write(
                (
                    f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    f"Sec-WebSocket-Accept: {accept}\r\n"
                    f"Set-Cookie: workspace_session_token={ATTACKER_TOKEN}; Path=/\r\n"
                    "X-Accel-Redirect: /api/v2/users/me\r\n\r\n"
                ).encode()
            )
            self.wfile.flush()
            self.close_connection = True
            self.connection.recv(1)  # until the client goes
        elif route in ("/ws-204", "/ws-bare-lf") and self.headers.get("Upgrade"):
            # An upgrade answered without switching, the connection kept open: after the
            # platform's splice, nginx would send its next request here (another user's).
            # Or a 101 whose Set-Cookie hides behind a bare LF.
            answer = (
                "HTTP/1.1 204 No Content\r\n\r\n"
                if route == "/ws-204"
                else "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"X-Ok: a\nSet-Cookie: workspace_session_token={ATTACKER_TOKEN}; Path=/\r\n\r\n"
            )
            self.wfile.write(answer.encode())
            self.wfile.flush()
            self.close_connection = True
            while data := self.connection.recv(65536):  # whatever comes next: kept for the test
                self.server.captured.append(data)
        elif route == "/seen":
            seen = {"path": self.path, "headers": [[name, value] for name, value in self.headers.items()]}
            self._send(200, json.dumps(seen).encode(), "application/json")
        else:
            self._send(404, b"no such page\n", "text/plain")


WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class HostileApp:
    """_HostileHandler on a free loopback port: `.url`, `.stop()`; `script` is the
    JavaScript of its /page."""

    def __init__(self, script=""):
        handler = type("Handler", (_HostileHandler,), {"script": script})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.httpd.captured = self.captured = []  # bytes that reached an app after a false upgrade
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="hostile-app", daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)
