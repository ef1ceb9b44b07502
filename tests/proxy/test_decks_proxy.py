"""The deck review service behind a real nginx (spec 000 part B: proxy rules and
limits). Every request goes to nginx on 127.0.0.1 with the Host header of the site;
nginx runs from the templates of nginx/, rendered by devtools.nginx."""

import base64
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import requests

from devtools import nginx as nginx_tool
from devtools import services
from tests.support.decks import SAMPLE_DECK, burst_until_refused, connection_from, request_from
from tests.support.shared import STOP_TIMEOUT

ROOT = Path(__file__).resolve().parents[2]
READ_TIMEOUT = 5.0  # far below the 25 s keepalive: a held-back record cannot hide behind it
LIMIT = 64 * 1024 * 1024


# --------------------------------------------------------------------------- helpers


class SSEReader:
    """SSE records from a streaming `requests` response, read byte by byte so that
    nothing waits for a fuller buffer on our side."""

    def __init__(self, response):
        self.lines = response.iter_lines(chunk_size=1)

    def next_record(self, timeout=READ_TIMEOUT):
        """The next record as {"id", "data", "comment"}; fails past `timeout`."""
        deadline = time.monotonic() + timeout
        record = {"id": None, "data": [], "comment": None}
        try:
            for raw in self.lines:
                line = raw.decode("utf-8")
                if line.startswith(":"):
                    record["comment"] = line[1:].strip()
                elif line.startswith("id:"):
                    record["id"] = line[3:].strip()
                elif line.startswith("data:"):
                    record["data"].append(line[5:].strip())
                elif line == "" and (record["data"] or record["comment"]):
                    record["data"] = "\n".join(record["data"])
                    return record
                if time.monotonic() > deadline:
                    break
        except requests.exceptions.RequestException as exc:  # a read time-out, wrapped
            pytest.fail(f"no complete SSE record within {timeout} s through nginx: {exc}")
        pytest.fail(f"no complete SSE record within {timeout} s through nginx")

    def record_with_seq(self, seq, timeout=READ_TIMEOUT):
        """Skip comments and earlier records until the record of `seq` arrives."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.next_record(max(deadline - time.monotonic(), 0.1))
            if record["data"] and json.loads(record["data"])["seq"] == seq:
                return record


def header_values(seen, name):
    """Every value of header `name` the echo backend received (case-insensitive)."""
    return [value for key, value in seen["headers"] if key.lower() == name.lower()]


def raw_exchange(port, request, until=b"\r\n\r\n", timeout=READ_TIMEOUT):
    """Send raw bytes to nginx and read until `until` has arrived after the header."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        deadline = time.monotonic() + timeout
        while until not in data.partition(b"\r\n\r\n")[2] or b"\r\n\r\n" not in data:
            if time.monotonic() > deadline:
                break
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


def https_get(port, host, path, cafile):
    """GET over TLS with SNI `host`, verifying the certificate against `cafile`."""
    context = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while chunk := tls.recv(65536):
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.fixture(scope="module")
def oversized_body():
    """65 MB, one MB over the limit: built once for the module."""
    return b"x" * (LIMIT + 1024 * 1024)


# --------------------------------------------------------------------------- config


def all_sites():
    return {s: f"127.0.0.1:{7080 + i}" for i, s in enumerate(nginx_tool.site_services())}


@pytest.mark.parametrize("listen_address", ["127.0.0.1", ["0.0.0.0", "[::]"]])
def test_rendered_config_passes_nginx_t(tmp_path, listen_address):
    conf = nginx_tool.render(tmp_path, nginx_tool.variables_for(8080, all_sites(), listen_address=listen_address))
    result = nginx_tool.test_config(tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert "test is successful" in result.stderr
    rendered = "\n".join(
        line
        for p in tmp_path.rglob("*.conf")
        for line in p.read_text().splitlines()
        if not line.strip().startswith("#")
    )
    # Everything nginx opens is inside the prefix: nothing of the system's nginx.
    for system_path in ("/etc/nginx", "/var/log/nginx", "/var/lib/nginx", "/run"):
        assert system_path not in rendered
    assert f'pid "{tmp_path.resolve()}/nginx.pid"' in conf.read_text()
    assert ("user root;" in conf.read_text()) == (os.geteuid() == 0)


def test_templates_need_only_the_site_variables(tmp_path):
    """As Ansible renders them (an undefined variable is an error): the sites and
    snippets need nothing but <service>_host and <service>_upstream."""
    variables = {"decks_host": "decks.example.org", "decks_upstream": "127.0.0.1:7081"}
    nginx_tool.render(tmp_path, variables)
    site = (tmp_path / "sites" / "decks.conf").read_text()
    assert "server_name decks.example.org;" in site
    assert "server 127.0.0.1:7081 max_fails=0;" in site
    assert "listen 127.0.0.1:80;" in site  # the defaults: loopback, port 80 without TLS
    assert nginx_tool.test_config(tmp_path, check=False).returncode == 0


def test_tls_config_passes_nginx_t(tmp_path, self_signed_cert):
    cert, key = self_signed_cert
    variables = nginx_tool.variables_for(
        8443, all_sites(), tls_certificate=cert, tls_certificate_key=key, http2=True, http_redirect_port=8080
    )
    nginx_tool.render(tmp_path, variables)
    result = nginx_tool.test_config(tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    site = (tmp_path / "sites" / "decks.conf").read_text()
    assert "listen 127.0.0.1:8443 ssl http2;" in site
    assert f"ssl_certificate {cert};" in site
    assert "return 301 https://$host:8443$request_uri;" in (tmp_path / "sites" / "default.conf").read_text()


def test_tls_serves_the_site_and_forwards_https(nginx_for, echo_backend, self_signed_cert):
    cert, key = self_signed_cert
    proxy = nginx_for(echo_backend, tls_certificate=cert, tls_certificate_key=key)
    assert proxy.url.startswith("https://")
    status, body = https_get(proxy.port, "decks.localhost", "/api/decks", cert)
    assert status == 200
    seen = json.loads(body)
    assert header_values(seen, "X-Forwarded-Proto") == ["https"]
    assert header_values(seen, "Host") == ["decks.localhost"]
    # A name the bundle does not serve gets no certificate at all.
    with pytest.raises(ssl.SSLError):
        https_get(proxy.port, "other.localhost", "/", cert)
    assert len(echo_backend.seen) == 1


# --------------------------------------------------------------------------- SSE


def test_stream_is_not_buffered(deck_session, nginx_for):
    service, session = deck_session
    proxy = nginx_for(service)
    headers = proxy.headers("decks")
    stream_url = f"{proxy.url}/api/sessions/{session['id']}/stream"
    events_url = f"{proxy.url}/api/sessions/{session['id']}/events"
    # requests asks for gzip: the stream must come back uncompressed all the same.
    with requests.get(stream_url, headers=headers, stream=True, timeout=(READ_TIMEOUT, READ_TIMEOUT)) as response:
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["Cache-Control"] == "no-cache"
        # nginx consumes X-Accel-Buffering by default; the sse snippet passes it on
        # (proxy_pass_header) so that a further proxy in front does not buffer either.
        assert response.headers["X-Accel-Buffering"] == "no"
        assert "Content-Encoding" not in response.headers
        assert "Transfer-Encoding" not in response.headers  # not re-chunked
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["X-Request-Id"])

        reader = SSEReader(response)
        # The 15-byte opening comment arrives alone: a buffering proxy would hold it.
        assert reader.next_record()["comment"] == "stream open"
        for _n, text in enumerate(["first through nginx", "second through nginx"], start=1):
            posted = requests.post(
                events_url, headers=headers, timeout=10, json={"type": "note", "slide": 0, "text": text}
            )
            assert posted.status_code == 201, posted.text
            seq = posted.json()["seq"]
            record = reader.record_with_seq(seq)
            assert record["id"] == str(seq)
            assert json.loads(record["data"])["text"] == text


def test_stream_bytes_are_relayed_without_rechunking(deck_session, nginx_for):
    """On the wire, the body after the header is the SSE text itself: no chunk
    sizes, no compression, one HTTP/1.1 response delimited by closing."""
    service, session = deck_session
    proxy = nginx_for(service)
    request = (
        f"GET /api/sessions/{session['id']}/stream HTTP/1.1\r\nHost: decks.localhost\r\nAccept-Encoding: gzip\r\n\r\n"
    ).encode()
    data = raw_exchange(proxy.port, request, until=b": stream open\n\n")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), data
    assert b"transfer-encoding" not in head.lower()
    assert body.startswith(b": stream open\n\n"), body


def test_last_event_id_passes_through_for_the_replay(deck_session, nginx_for):
    service, session = deck_session
    proxy = nginx_for(service)
    headers = proxy.headers("decks")
    seqs = []
    for text in ("one", "two"):
        posted = requests.post(
            f"{proxy.url}/api/sessions/{session['id']}/events",
            headers=headers,
            json={"type": "note", "slide": 0, "text": text},
            timeout=10,
        )
        assert posted.status_code == 201, posted.text
        seqs.append(posted.json()["seq"])
    with requests.get(
        f"{proxy.url}/api/sessions/{session['id']}/stream",
        stream=True,
        headers={**headers, "Last-Event-ID": str(seqs[0])},
        timeout=(READ_TIMEOUT, READ_TIMEOUT),
    ) as response:
        reader = SSEReader(response)
        assert reader.next_record()["comment"] == "stream open"
        replayed = reader.next_record()
        assert json.loads(replayed["data"])["seq"] == seqs[1]  # only what follows the cursor


# --------------------------------------------------------------------------- body limit


def test_body_over_the_limit_is_refused_by_nginx(logged_deck_session, nginx_for, oversized_body):
    service, session, log = logged_deck_session
    proxy = nginx_for(service)
    headers = proxy.headers("decks", **{"Content-Type": "application/json"})
    path = f"/api/sessions/{session['id']}/scribble"

    refused = requests.post(proxy.url + path, data=oversized_body, headers=headers, timeout=60)
    assert refused.status_code == 413
    assert refused.headers["Content-Type"] == "application/json"
    assert "64 MB" in refused.json()["error"]

    # Without a length (chunked), nginx counts as it reads and stops at the limit.
    def pieces(size=1024 * 1024):
        view = memoryview(oversized_body)
        for start in range(0, len(view), size):
            yield bytes(view[start : start + size])

    refused = requests.post(proxy.url + path, data=pieces(), headers=headers, timeout=60)
    assert refused.status_code == 413
    assert "64 MB" in refused.json()["error"]
    assert "client intended to send too large body" in proxy.stderr_text()
    assert "client intended to send too large chunked body" in proxy.stderr_text()

    # A later request is logged by the service; the refused ones never reached it.
    marker = requests.get(f"{proxy.url}/api/sessions/{session['id']}", headers=headers, timeout=10)
    assert marker.status_code == 200
    log.wait_for(f"GET /api/sessions/{session['id']} 200")
    assert not [line for line in log.request_lines() if path in line], log.text()


def test_body_under_the_limit_reaches_the_service(logged_deck_session, nginx_for):
    """A scribble padded to 2 MB (past nginx's in-memory body buffer, so through the
    temporary file in the prefix) is stored, and reads back through nginx."""
    service, session, log = logged_deck_session
    proxy = nginx_for(service)
    png = (SAMPLE_DECK / "images" / "chart.png").read_bytes()
    body = json.dumps({"slide": 0, "image": "data:image/png;base64," + base64.b64encode(png).decode()})
    body = body.encode() + b" " * (2 * 1024 * 1024)  # JSON allows trailing whitespace
    posted = requests.post(
        f"{proxy.url}/api/sessions/{session['id']}/scribble",
        data=body,
        headers=proxy.headers("decks", **{"Content-Type": "application/json"}),
        timeout=30,
    )
    assert posted.status_code == 201, posted.text
    assert "buffered to a temporary file" in proxy.stderr_text()
    name = posted.json()["file"]
    fetched = requests.get(
        f"{proxy.url}/api/sessions/{session['id']}/scribbles/{name}", headers=proxy.headers("decks"), timeout=10
    )
    assert fetched.status_code == 200
    assert fetched.content == png
    line = log.wait_for(f"POST /api/sessions/{session['id']}/scribble 201")
    # nginx's request id is the one the service logs (correlation of the two logs).
    assert f"id={posted.headers['X-Request-Id']}" in line


# --------------------------------------------------------------------------- backend down


def test_502_for_every_route_while_the_backend_is_down(deck_session, nginx_for):
    service, session = deck_session
    proxy = nginx_for(service)
    headers = proxy.headers("decks")
    assert requests.get(f"{proxy.url}/api/decks", headers=headers, timeout=10).status_code == 200

    took = service.stop(timeout=STOP_TIMEOUT)
    assert took < STOP_TIMEOUT
    sid = session["id"]
    calls = [
        ("GET", "/", None),
        ("GET", "/healthz", None),
        ("GET", "/api/decks", None),
        ("GET", f"/api/sessions/{sid}", None),
        ("GET", f"/api/sessions/{sid}/stream", None),
        ("POST", "/api/sessions", {"deck_id": "welcome"}),
        ("POST", f"/api/sessions/{sid}/events", {"type": "note", "slide": 0, "text": "x"}),
        ("DELETE", "/api/decks/welcome", None),
    ]
    for method, path, body in calls:
        response = requests.request(method, proxy.url + path, headers=headers, json=body, timeout=10)
        assert response.status_code == 502, (method, path, response.text)
        assert response.headers["Content-Type"] == "application/json"
        assert response.json() == {"error": "the deck review service is not available"}

    # Back on the same port, it is reached at once (a single upstream is never
    # marked down for fail_timeout).
    restarted = services.start("decks", service.data_dir, port=service.port)
    try:
        response = requests.get(f"{proxy.url}/api/decks", headers=headers, timeout=10)
        assert response.status_code == 200
        assert [d["id"] for d in response.json()] == ["welcome"]
    finally:
        proxy.stop()  # close nginx's idle upstream connections before the service stops
        took = restarted.stop(timeout=STOP_TIMEOUT)
    assert took < STOP_TIMEOUT


# --------------------------------------------------------------------------- headers

SPOOFED = {
    "Remote-User": "admin",
    "Remote-Groups": "admins",
    "Remote-Email": "admin@example.org",
    "Remote-Name": "Admin",
    "X-Forwarded-User": "admin",
    "X-Auth-Request-User": "admin",
    "X-Forwarded-For": "203.0.113.9",
    "X-Real-IP": "203.0.113.9",
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "evil.example",
    "X-Request-Id": "chosen-by-the-client",
}


@pytest.mark.parametrize("path", ["/api/decks", "/api/sessions/s1/stream"], ids=["api", "stream"])
def test_proxy_headers_reach_the_backend_and_identity_does_not(nginx_for, echo_backend, path):
    proxy = nginx_for(echo_backend)
    response = requests.get(
        proxy.url + path,
        timeout=10,
        headers={"Host": "decks.localhost", **SPOOFED, "Last-Event-ID": "7", "Authorization": "Bearer kept"},
    )
    assert response.status_code == 200
    seen = response.json()
    assert seen["path"] == path and seen["version"] == "HTTP/1.1"
    assert header_values(seen, "Host") == ["decks.localhost"]
    assert header_values(seen, "X-Forwarded-For") == ["127.0.0.1"]  # set, not appended to
    assert header_values(seen, "X-Real-IP") == ["127.0.0.1"]
    assert header_values(seen, "X-Forwarded-Proto") == ["http"]
    assert header_values(seen, "X-Forwarded-Host") == ["decks.localhost"]
    assert header_values(seen, "X-Forwarded-Port") == [str(proxy.port)]
    request_id = header_values(seen, "X-Request-Id")
    assert len(request_id) == 1 and re.fullmatch(r"[0-9a-f]{32}", request_id[0])
    for name in (
        "Remote-User",
        "Remote-Groups",
        "Remote-Email",
        "Remote-Name",
        "X-Forwarded-User",
        "X-Auth-Request-User",
    ):
        assert header_values(seen, name) == [], name
    assert header_values(seen, "Connection") == []  # keepalive to the backend
    # The client's own headers pass.
    assert header_values(seen, "Last-Event-ID") == ["7"]
    assert header_values(seen, "Authorization") == ["Bearer kept"]


def test_underscore_spelling_of_identity_headers_is_dropped(nginx_for, echo_backend):
    """WSGI maps Remote_User and Remote-User to the same HTTP_REMOTE_USER; nginx
    drops header names with an underscore (ignore_invalid_headers)."""
    proxy = nginx_for(echo_backend)
    response = requests.get(
        proxy.url + "/api/decks",
        timeout=10,
        headers={"Host": "decks.localhost", "Remote_User": "admin", "X_Forwarded_For": "203.0.113.9"},
    )
    assert response.status_code == 200
    names = {name.lower().replace("_", "-") for name, _ in response.json()["headers"]}
    assert "remote-user" not in names
    assert header_values(response.json(), "X-Forwarded-For") == ["127.0.0.1"]


def test_unknown_host_is_refused_without_reaching_a_backend(nginx_for, echo_backend):
    proxy = nginx_for(echo_backend)
    response = requests.get(proxy.url + "/api/decks", headers={"Host": "other.localhost"}, timeout=10)
    assert response.status_code == 421
    assert echo_backend.seen == []
    assert requests.get(proxy.url + "/api/decks", headers=proxy.headers("decks"), timeout=10).status_code == 200
    assert len(echo_backend.seen) == 1


def test_request_bodies_pass_unchanged(nginx_for, echo_backend):
    proxy = nginx_for(echo_backend)
    body = os.urandom(300 * 1024)
    response = requests.post(proxy.url + "/api/decks/import", data=body, timeout=10, headers=proxy.headers("decks"))
    assert response.status_code == 200
    seen = response.json()
    assert seen["method"] == "POST" and seen["body_bytes"] == len(body)


# --------------------------------------------------------------------------- tooling


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs the tooling as an unprivileged user: needs root and setpriv",
)
def test_tooling_runs_nginx_as_an_unprivileged_user(echo_backend):
    """The same tooling as a normal user: no `user` line, nothing outside the prefix."""
    prefix = Path(tempfile.mkdtemp(prefix="bundle-nginx-nobody-"))
    try:
        os.chown(prefix, 65534, 65534)
        script = (
            "import sys, urllib.request\n"
            "from devtools import nginx\n"
            f"proxy = nginx.start({str(prefix)!r}, None, {{'decks': '127.0.0.1:{echo_backend.port}'}})\n"
            "try:\n"
            "    request = urllib.request.Request(proxy.url + '/api/decks',"
            " headers=proxy.headers('decks'))\n"
            "    print(urllib.request.urlopen(request, timeout=10).status)\n"
            "    print(proxy.test_config().returncode)\n"
            "finally:\n"
            "    proxy.stop()\n"
        )
        result = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", script],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(prefix)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["200", "0"]
        assert "user " not in (prefix / "nginx.conf").read_text()
        assert len(echo_backend.seen) == 1
    finally:
        shutil.rmtree(prefix)


# --------------------------------------------------------------------------- abuse limits


def test_a_burst_of_writes_is_refused_per_address_and_others_still_write(deck_session, nginx_for):
    service, session = deck_session
    proxy = nginx_for(service)
    note = {"type": "note", "slide": 0, "text": "flood"}
    # A session that does not exist: the service's answer (404) is cheap; nginx counts it all the same.
    answers = burst_until_refused(
        lambda: request_from(proxy.port, "127.0.0.2", "POST", "/api/sessions/nope/events", "decks.localhost", note)
    )
    assert {status for status, _, _ in answers} <= {404, 429}
    refused = [(headers, body) for status, headers, body in answers if status == 429]
    for headers, body in refused:
        assert headers["content-type"] == "application/json" and headers["retry-after"] == "1"
        assert json.loads(body) == {"error": "too many requests from this address, slow down"}
    # Another address writes at once.
    status, _, body = request_from(
        proxy.port,
        "127.0.0.3",
        "POST",
        f"/api/sessions/{session['id']}/events",
        "decks.localhost",
        {"type": "note", "slide": 0, "text": "legitimate"},
    )
    assert status == 201, body
    assert json.loads(body)["text"] == "legitimate"


def test_the_streams_one_address_may_hold_stay_open_and_the_next_is_refused(deck_session, nginx_for):
    """limit_conn allows decks_streams_per_address open streams per address (200 by
    default; 20 here); they are not cut by the limits, and each gets the events posted
    from elsewhere."""
    service, session = deck_session
    proxy = nginx_for(service, variables={"decks_streams_per_address": 20})
    path = f"/api/sessions/{session['id']}/stream"
    streams = []
    try:
        for _ in range(20):
            connection = connection_from(proxy.port, "127.0.0.4")
            connection.request("GET", path, headers={"Host": "decks.localhost"})
            response = connection.getresponse()
            assert response.status == 200
            assert response.fp.readline() == b": stream open\n"
            streams.append((connection, response))
        connection = connection_from(proxy.port, "127.0.0.4")
        streams.append((connection, None))
        connection.request("GET", path, headers={"Host": "decks.localhost"})
        refused = connection.getresponse()
        assert refused.status == 429  # (a stream let through would never end: not read)
        assert json.loads(refused.read())["error"].startswith("too many requests")
        # Other routes from that address, and streams from others, are served.
        assert request_from(proxy.port, "127.0.0.4", "GET", "/api/decks", "decks.localhost")[0] == 200
        status, _, body = request_from(
            proxy.port,
            "127.0.0.5",
            "POST",
            f"/api/sessions/{session['id']}/events",
            "decks.localhost",
            {"type": "note", "slide": 0, "text": "to all"},
        )
        assert status == 201, body
        seq = json.loads(body)["seq"]
        for _, response in streams[:20]:
            while not (line := response.fp.readline()).startswith(b"data:"):
                assert line, "a stream was cut"
            assert json.loads(line[5:])["seq"] == seq
    finally:
        for connection, _ in streams:
            connection.close()
