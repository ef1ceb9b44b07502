"""Fixtures of the proxy tests: a real nginx (devtools.nginx, rendered from nginx/)
in front of real gunicorn services, or in front of a local echo server."""
import json
import shutil
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from devtools import nginx as nginx_tool
from tests.conftest import copy_sample_deck


@pytest.fixture
def nginx_for(tmp_path_factory):
    """nginx_for(service, **start_kwargs) -> RunningNginx.

    A real nginx in its own prefix in front of `service` (a RunningService, or
    anything with `.name` and `.port`), on a free port; `start_kwargs` go to
    devtools.nginx.start (hosts, tls_certificate, variables, ...). Stopped at teardown."""
    started = []

    def start(service, **kwargs):
        prefix = tmp_path_factory.mktemp(f"nginx-{service.name}")
        proxy = nginx_tool.start(prefix, upstreams={service.name: f"127.0.0.1:{service.port}"},
                                 **kwargs)
        started.append(proxy)
        return proxy

    yield start
    for proxy in reversed(started):
        proxy.stop()


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


@pytest.fixture
def logged_deck_session(start_service, tmp_path):
    """(service, session, log): a deck service whose stderr goes to a file, the sample
    deck imported, one session."""
    data_dir = tmp_path / "decks-data"
    data_dir.mkdir()
    import_body = copy_sample_deck(data_dir)
    log_path = tmp_path / "decks.stderr"
    with open(log_path, "wb") as log_file:  # the child keeps its own descriptor
        service = start_service("decks", data_dir=data_dir, stderr=log_file)
    url = service.base_url
    requests.post(f"{url}/api/decks/import", json=import_body, timeout=10).raise_for_status()
    response = requests.post(f"{url}/api/sessions", json={"deck_id": "welcome"}, timeout=10)
    response.raise_for_status()
    return service, response.json(), ServiceLog(log_path)


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


@pytest.fixture
def echo_backend():
    """A local HTTP server that echoes each request's headers as JSON, posing as the
    deck service's backend: nginx_for(echo_backend) puts the decks site in front of it."""
    server = EchoServer("decks")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def self_signed_cert(tmp_path_factory):
    """(certificate, key) for decks.localhost, self-signed, valid one day."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed: make test installs it (devtools/system-deps.sh)")
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "decks.localhost.crt", directory / "decks.localhost.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=decks.localhost", "-addext", "subjectAltName=DNS:decks.localhost",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key
