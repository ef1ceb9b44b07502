"""The proxy tests' helpers: a service's request log read from its stderr file
(`ServiceLog`), and a local echo server posing as a backend (`EchoServer`)."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


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
                raise AssertionError(f"no request line with {fragment!r} in the service log "
                                     f"within {timeout} s:\n{self.text()}")
            time.sleep(0.05)  # polling the log file with a deadline


class _EchoHandler(BaseHTTPRequestHandler):
    """Answers every request with what it received, as JSON: method, path, HTTP
    version, the header lines in order (duplicates kept) and the body's size."""
    protocol_version = "HTTP/1.1"  # keepalive, as gunicorn

    def _echo(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        seen = {"method": self.command, "path": self.path, "version": self.request_version,
                "headers": [[name, value] for name, value in self.headers.items()],
                "body_bytes": len(body)}
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
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="echo-backend",
                                       daemon=True)
        self.thread.start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)
