"""Strict-Transport-Security on the TLS sites: every answer of every site, whether the
service wrote it or nginx did (a location with add_header lines of its own drops the
server's, so each such location includes the snippet again)."""

import re
import shutil
import socket
import ssl
import subprocess

import pytest

from devtools import nginx as nginx_tool
from tests.support.proxy import EchoServer

HSTS = "strict-transport-security"
INCLUDE = re.compile(r"^\s*include \S+/hsts\.conf;$", re.M)


@pytest.fixture(scope="module")
def every_host_cert(tmp_path_factory):
    """(certificate, key) naming every site's default host, self-signed."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is not installed: make test installs it (devtools/system-deps.sh)")
    names = ",".join(f"DNS:{nginx_tool.default_host(s)}" for s in nginx_tool.SERVICES)
    directory = tmp_path_factory.mktemp("tls-all")
    cert, key = directory / "all.crt", directory / "all.key"
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
            "/CN=bundle.localhost",
            "-addext",
            f"subjectAltName={names}",
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


def _blocks(text, keyword):
    """The bodies of the `keyword ... { ... }` blocks of a rendered config (braces balanced)."""
    bodies = []
    for match in re.finditer(rf"^\s*{keyword}\b[^{{;]*\{{", text, re.M):
        depth, start = 1, match.end()
        for index in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[index], 0)
            if depth == 0:
                bodies.append(text[start:index])
                break
    return bodies


def _own_lines(body):
    """`body` less its nested blocks."""
    while True:
        nested = re.sub(r"\{[^{}]*\}", "", body)
        if nested == body:
            return body
        body = nested


def _rendered_sites(prefix, **tls):
    # Every optional location rendered: the wizard's files, the workspace's app hosts.
    optional = {
        "wizard_uploads_dir": str(prefix / "uploads"),
        "wizard_lists_dir": str(prefix / "lists"),
        "workspace_apps_host": "*.apps.localhost",
    }
    variables = nginx_tool.variables_for(8443, {s: "127.0.0.1:9" for s in nginx_tool.SERVICES}, **tls, **optional)
    nginx_tool.render(prefix, variables)
    return {site.name: site.read_text() for site in (prefix / "sites").glob("*.conf")}


def test_each_tls_server_and_each_location_with_headers_of_its_own_sends_hsts(tmp_path, every_host_cert):
    cert, key = every_host_cert
    for name, text in _rendered_sites(tmp_path, tls_certificate=cert, tls_certificate_key=key).items():
        for server in _blocks(text, "server"):
            if "ssl_certificate " not in server:
                continue  # the catch-all refuses the handshake; the port-80 redirect is plain HTTP
            assert INCLUDE.search(_own_lines(server)), f"{name}: a TLS server without HSTS"
            for location in _blocks(server, "location"):
                own = _own_lines(location)
                if "add_header" in own:
                    assert INCLUDE.search(own), f"{name}: a location with its own headers drops HSTS:\n{own}"


def test_plain_http_sites_send_no_hsts(tmp_path):
    for name, text in _rendered_sites(tmp_path).items():
        assert not INCLUDE.search(text), f"{name} sends HSTS over plain HTTP"


def _head(port, host, path, cafile):
    context = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    head = data.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    return int(head[0].split()[1]), {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])
    }


def test_answers_of_the_services_and_of_nginx_carry_hsts(tmp_path, every_host_cert):
    cert, key = every_host_cert
    backends = {service: EchoServer(service) for service in nginx_tool.SERVICES}
    (tmp_path / "uploads").mkdir()
    proxy = nginx_tool.start(
        tmp_path / "nginx",
        upstreams={s: f"127.0.0.1:{b.port}" for s, b in backends.items()},
        tls_certificate=cert,
        tls_certificate_key=key,
        variables={"wizard_uploads_dir": str(tmp_path / "uploads")},
    )
    try:
        for service in nginx_tool.SERVICES:
            status, headers = _head(proxy.port, nginx_tool.default_host(service), "/healthz", cert)
            assert status == 200 and headers.get(HSTS) == "max-age=31536000", (service, status, headers)
        # An answer nginx writes itself, from a location with headers of its own.
        status, headers = _head(proxy.port, "wizard.localhost", "/uploads/" + "0" * 32 + ".png", cert)
        assert status == 404 and headers.get(HSTS) == "max-age=31536000", headers
    finally:
        proxy.stop()
        for backend in backends.values():
            backend.stop()
