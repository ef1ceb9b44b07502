"""Fixtures of the proxy tests: a real nginx (devtools.nginx, rendered from nginx/)
in front of real gunicorn services, or in front of a local echo server."""

import shutil
import subprocess

import pytest
import requests

from devtools import nginx as nginx_tool
from tests.support.decks import copy_sample_deck
from tests.support.proxy import EchoServer, ServiceLog


@pytest.fixture
def nginx_for(tmp_path_factory):
    """nginx_for(service, **start_kwargs) -> RunningNginx.

    A real nginx in its own prefix in front of `service` (a RunningService, or
    anything with `.name` and `.port`), on a free port; `start_kwargs` go to
    devtools.nginx.start (hosts, tls_certificate, variables, ...). Stopped at teardown."""
    started = []

    def start(service, **kwargs):
        prefix = tmp_path_factory.mktemp(f"nginx-{service.name}")
        proxy = nginx_tool.start(prefix, upstreams={service.name: f"127.0.0.1:{service.port}"}, **kwargs)
        started.append(proxy)
        return proxy

    yield start
    for proxy in reversed(started):
        proxy.stop()


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
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=decks.localhost",
            "-addext",
            "subjectAltName=DNS:decks.localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key
