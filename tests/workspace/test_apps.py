"""The workspace apps proxy through a real agent process to a real local app."""

import hashlib
import json
import os
import re
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from simple_websocket import Client

from tests.support.workspace import OWNER, TOKEN_HEADER, create_workspace, run_cli
from tests.support.workspace_app import Handler, random_pieces


def test_get_through_the_agent(connected):
    response = requests.get(connected.app_url + "/hello", headers=connected.ws.as_user(connected.owner), timeout=10)
    assert response.status_code == 200 and response.text == "hello from the app\n"
    assert response.headers["Content-Type"] == "text/plain"


def test_the_percent_form_and_the_sole_agent_form(connected):
    auth = connected.ws.as_user(connected.owner)
    for base in (f"{connected.ws.url}/%40owner/dev.main/apps/echo", f"{connected.ws.url}/@owner/dev/apps/echo"):
        response = requests.get(base + "/hello", headers=auth, timeout=10)
        assert response.status_code == 200 and response.text == "hello from the app\n", base


def test_post_of_5_mb_streams_to_the_app(connected):
    body = os.urandom(5 * 1024 * 1024)
    response = requests.post(
        connected.app_url + "/upload", data=body, headers=connected.ws.as_user(connected.owner), timeout=30
    )
    assert response.status_code == 200
    assert response.json() == {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}


def test_chunked_upload_is_rechunked_to_the_app(connected):
    pieces = [os.urandom(100_000) for _ in range(5)]
    response = requests.post(
        connected.app_url + "/upload", data=iter(pieces), headers=connected.ws.as_user(connected.owner), timeout=30
    )
    assert response.json() == {"length": 500_000, "sha256": hashlib.sha256(b"".join(pieces)).hexdigest()}


def test_streaming_answer_arrives_piece_by_piece(connected):
    with requests.get(
        connected.app_url + "/stream?chunks=6", headers=connected.ws.as_user(connected.owner), stream=True, timeout=10
    ) as response:
        assert response.status_code == 200
        arrivals = []
        for line in response.iter_lines():
            arrivals.append((time.monotonic(), line))
    assert [line.split(b" at ")[0] for _, line in arrivals] == [b"piece %d" % n for n in range(6)]
    assert arrivals[-1][0] - arrivals[0][0] > 0.15  # not buffered into one piece at the end


def test_websocket_echo_through_the_app_path(connected):
    url = connected.app_url.replace("http://", "ws://") + "/ws"
    client = Client.connect(url, headers={TOKEN_HEADER: connected.owner})
    try:
        for message in ("hello", b"\x00\x01binary", "x" * 50_000):
            client.send(message)
            assert client.receive(timeout=10) == message
    finally:
        client.close()


def test_100_concurrent_requests_are_demultiplexed(connected):
    auth = connected.ws.as_user(connected.owner)

    def fetch(number):
        # Later requests answer sooner: answers come back out of order on the one connection.
        wait = (100 - number) % 7 * 0.02
        response = requests.get(f"{connected.app_url}/slow?id={number}&wait={wait}", headers=auth, timeout=60)
        return number, response.status_code, response.json()

    with ThreadPoolExecutor(max_workers=100) as pool:
        results = list(pool.map(fetch, range(100)))
    assert all(status == 200 and body == {"id": str(number)} for number, status, body in results), results


def test_platform_credentials_are_stripped(connected):
    response = requests.get(
        connected.app_url + f"/headers?a=1&workspace_session_token={connected.owner}&b=2",
        headers={TOKEN_HEADER: connected.owner, "X-Custom": "kept"},
        cookies={"workspace_session_token": connected.owner, "app_cookie": "mine"},
        timeout=10,
    )
    seen = response.json()
    headers = {name.lower(): value for name, value in seen["headers"]}
    assert seen["path"] == "/headers?a=1&b=2"
    assert "workspace-session-token" not in headers
    assert headers["cookie"] == "app_cookie=mine"
    assert connected.owner not in json.dumps(seen)
    assert headers["x-custom"] == "kept"
    assert headers["x-forwarded-prefix"] == "/@owner/dev.main/apps/echo"
    assert headers["x-forwarded-for"] == "127.0.0.1"
    assert headers["host"].startswith("127.0.0.1:")


def test_missing_trailing_slash_redirects_keeping_the_query(connected):
    response = requests.get(
        connected.app_url + "?x=1", headers=connected.ws.as_user(connected.owner), allow_redirects=False, timeout=10
    )
    assert response.status_code == 307
    assert response.headers["Location"].endswith("/@owner/dev.main/apps/echo/?x=1")


def test_unauthenticated_browser_is_sent_to_login_and_machine_gets_401(connected):
    browser = requests.get(
        connected.app_url + "/hello?x=1", headers={"Accept": "text/html,*/*"}, allow_redirects=False, timeout=10
    )
    assert browser.status_code == 303
    assert browser.headers["Location"] == "/login?redirect=%2F%40owner%2Fdev.main%2Fapps%2Fecho%2Fhello%3Fx%3D1"
    machine = requests.get(connected.app_url + "/hello", allow_redirects=False, timeout=10)
    assert machine.status_code == 401 and machine.json()["message"] == "You must be signed in to do this."


def test_path_apps_are_the_owners_only(connected):
    """On the platform's origin an app's script would run as its visitor: by default
    a path app opens for its owner only, even when it is shared (tests/workspace/
    test_app_hosts.py: the dangerous flags, and sharing on the app's own host)."""
    other = connected.ws.as_user(connected.other)
    for slug in ("echo", "shared"):
        refused = requests.get(f"{connected.ws.url}/@owner/dev.main/apps/{slug}/hello", headers=other, timeout=10)
        assert refused.status_code == 404 and refused.json()["message"] == "Workspace app not found.", slug
    mine = requests.get(
        f"{connected.ws.url}/@owner/dev.main/apps/shared/hello",
        headers=connected.ws.as_user(connected.owner),
        timeout=10,
    )
    assert mine.status_code == 200 and mine.text == "hello from the app\n"


def test_unknown_workspace_agent_or_app_is_one_404(connected):
    """The same answer whether the user, the workspace, the agent or the app is
    missing, or someone else's: it says nothing of who and what exists."""
    owner, other = connected.ws.as_user(connected.owner), connected.ws.as_user(connected.other)
    cases = [
        (owner, path)
        for path in (
            "/@owner/nope.main/apps/echo/",
            "/@owner/dev.nope/apps/echo/",
            "/@owner/dev.main/apps/nope/",
            "/@nobody/dev.main/apps/echo/",
        )
    ]
    cases += [
        (other, "/@owner/dev.main/apps/echo/"),
        (other, "/@owner/dev/apps/echo/"),
        (other, "/@nobody/dev/apps/echo/"),
    ]
    for auth, path in cases:
        response = requests.get(connected.ws.url + path, headers=auth, timeout=10)
        assert response.status_code == 404 and response.json() == {"message": "Workspace app not found."}, path


# --------------------------------------------------------------------------- bulk bytes and back-pressure


def _sha256_of_random(count, seed):
    digest = hashlib.sha256()
    for piece in random_pieces(count, seed):
        digest.update(piece)
    return digest.hexdigest()


def test_20_mb_download_arrives_byte_exact(connected):
    count, seed = 20 * 1024 * 1024 + 12345, "download"
    digest, length = hashlib.sha256(), 0
    with requests.get(
        f"{connected.app_url}/random?count={count}&seed={seed}",
        headers=connected.ws.as_user(connected.owner),
        stream=True,
        timeout=30,
    ) as response:
        assert response.status_code == 200 and int(response.headers["Content-Length"]) == count
        for data in response.iter_content(256 * 1024):
            digest.update(data)
            length += len(data)
    assert length == count and digest.hexdigest() == _sha256_of_random(count, seed)


def test_20_mb_upload_arrives_byte_exact(connected):
    body = b"".join(random_pieces(20 * 1024 * 1024 + 777, "upload"))
    response = requests.post(
        connected.app_url + "/upload", data=body, headers=connected.ws.as_user(connected.owner), timeout=30
    )
    assert response.status_code == 200
    assert response.json() == {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}


def _rss_bytes(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


class SlowClient:
    """A raw HTTP/1.1 client with a small receive buffer, that reads only when told."""

    def __init__(self, connected, path):
        port = int(connected.ws.url.rsplit(":", 1)[1])
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # before connect: a small window
        self.sock.settimeout(30)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{TOKEN_HEADER}: {connected.owner}\r\n"
            f"Connection: close\r\n\r\n".encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            data = self.sock.recv(4096)
            assert data, "closed before the answer's head"
            head += data
        head, self.body_start = head.split(b"\r\n\r\n", 1)
        self.status = int(head.split(b" ", 2)[1])

    def read_rest(self, count):
        """SHA-256 of the body (what came with the head, then the rest until `count`)."""
        digest, received = hashlib.sha256(self.body_start), len(self.body_start)
        buffer = bytearray(1024 * 1024)
        while received < count:
            read = self.sock.recv_into(buffer)
            assert read, f"closed after {received} of {count} bytes"
            digest.update(memoryview(buffer)[:read])
            received += read
        return digest.hexdigest()


def _wait_until_stalled(progress, pid, quiet_s=1.0, deadline_s=15.0):
    """Wait (a deadline, polling) until the app has written nothing for `quiet_s`:
    back-pressure reached it. Returns the largest platform worker RSS seen meanwhile."""
    peak, last, last_change = 0, -1, time.monotonic()
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        peak = max(peak, _rss_bytes(pid))
        if progress.sent != last:
            last, last_change = progress.sent, time.monotonic()
        elif time.monotonic() - last_change >= quiet_s:
            return peak
        time.sleep(0.05)
    raise AssertionError(f"the app kept writing for {deadline_s} s ({progress.sent} bytes): no back-pressure")


def test_a_client_that_stops_reading_holds_the_app_back_not_platform_memory(connected):
    count, seed = 128 * 1024 * 1024, "slow-reader"
    worker = connected.ws.service.worker_pids()[0]
    before = _rss_bytes(worker)
    client = SlowClient(connected, f"/@owner/dev.main/apps/echo/random?count={count}&seed={seed}")
    try:
        assert client.status == 200
        progress = Handler.progress[seed]
        peak = _wait_until_stalled(progress, worker)
        # What is in flight: socket buffers and a window or two per hop, not the body.
        assert progress.sent < 96 * 1024 * 1024, progress.sent
        assert peak - before < 64 * 1024 * 1024, f"the platform grew {(peak - before) >> 20} MiB"
        assert client.read_rest(count) == _sha256_of_random(count, seed)
    finally:
        client.sock.close()
    assert progress.ended.wait(10) and progress.outcome == "done"


def test_a_client_that_goes_away_ends_the_app_request(connected):
    count, seed = 200 * 1024 * 1024, "gone-reader"
    client = SlowClient(connected, f"/@owner/dev.main/apps/echo/random?count={count}&seed={seed}")
    assert client.status == 200
    progress = Handler.progress[seed]
    _wait_until_stalled(progress, connected.ws.service.worker_pids()[0], quiet_s=0.5)
    client.sock.close()
    # The close travels platform -> agent -> app: the app's writes fail, its request ends.
    assert progress.ended.wait(10), f"the app is still writing after the client left ({progress.sent} bytes)"
    assert progress.outcome != "done" and progress.sent < count
    follow_up = requests.get(connected.app_url + "/hello", headers=connected.ws.as_user(connected.owner), timeout=10)
    assert follow_up.status_code == 200


# --------------------------------------------------------------------------- methods, tokens and the request log


def test_head_and_options_reach_the_app(connected):
    auth = connected.ws.as_user(connected.owner)
    head = requests.head(connected.app_url + "/hello", headers=auth, timeout=10)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["Content-Length"] == "19" and head.headers["Content-Type"] == "text/plain"
    options = requests.options(connected.app_url + "/headers", headers=auth, timeout=10)
    assert options.status_code == 200 and options.json()["method"] == "OPTIONS"
    assert requests.get(connected.app_url + "/hello", headers=auth, timeout=10).status_code == 200


def test_a_revoked_session_token_is_refused_at_once(connected):
    token = connected.ws.login(OWNER["email"], OWNER["password"]).json()["session_token"]
    shared = f"{connected.ws.url}/@owner/dev.main/apps/shared/hello"
    assert requests.get(shared, headers=connected.ws.as_user(token), timeout=10).status_code == 200
    assert (
        requests.post(connected.ws.api + "/users/logout", headers=connected.ws.as_user(token), timeout=10).status_code
        < 300
    )
    for carried in ({"headers": {TOKEN_HEADER: token}}, {"cookies": {"workspace_session_token": token}}):
        refused = requests.get(shared, timeout=10, allow_redirects=False, **carried)
        assert refused.status_code == 401 and "revoked" in refused.json()["detail"], carried
    refused = requests.get(shared + f"?workspace_session_token={token}", timeout=10)
    assert refused.status_code == 401


def test_the_token_in_a_cookie_is_accepted_in_the_query_not(connected):
    """A token in a URL ends up in logs and histories: the query carries one on a
    websocket upgrade only (app/workspace/access/sessions.py)."""
    by_cookie = requests.get(
        connected.app_url + "/hello", cookies={"workspace_session_token": connected.owner}, timeout=10
    )
    by_query = requests.get(connected.app_url + f"/hello?workspace_session_token={connected.owner}", timeout=10)
    assert (by_cookie.status_code, by_query.status_code) == (200, 401)


def test_a_proxied_request_is_logged_once_with_its_request_id(start_service, start_agent, local_app, tmp_path):
    from tests.support.workspace import AGENT_ENV, Workspace, create_workspace, wait_status

    log_path = tmp_path / "platform.log"
    with open(log_path, "wb") as log:
        ws = Workspace(start_service("workspace", env=AGENT_ENV, stdout=log, stderr=subprocess.STDOUT))
    owner = ws.first_user()
    agent = create_workspace(ws, owner, "dev", [{"name": "main", "apps": [{"slug": "echo", "url": local_app.url}]}])
    agent = agent["agents"][0]
    start_agent(ws.url, agent["token"])
    wait_status(ws, owner, agent["id"], "connected")
    path = "/@owner/dev.main/apps/echo/hello"
    answer = requests.get(
        ws.url + path + "?secret=1", headers={TOKEN_HEADER: owner, "X-Request-Id": "bench-42"}, timeout=10
    )
    assert answer.status_code == 200 and answer.headers["X-Request-Id"] == "bench-42"
    unnamed = requests.get(ws.url + path, headers={TOKEN_HEADER: owner, "X-Request-Id": "bad id!"}, timeout=10)
    assert re.fullmatch(r"[0-9a-f]{32}", unnamed.headers["X-Request-Id"])
    refused = requests.get(ws.url + path, headers={"X-Request-Id": "refused-1"}, timeout=10)
    assert refused.status_code == 401 and refused.headers["X-Request-Id"] == "refused-1"
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if " bundle.request " in line]
        mine = [line for line in lines if path in line]
        if len(mine) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # polling the log file with a deadline
    assert len(mine) == 3, lines
    assert re.search(r" GET /@owner/dev\.main/apps/echo/hello 200 [0-9.]+ms id=bench-42$", mine[0]), mine
    assert mine[1].endswith(f"id={unnamed.headers['X-Request-Id']}") and " 200 " in mine[1]
    assert re.search(r" 401 [0-9.]+ms id=refused-1$", mine[2]), mine
    assert "secret" not in log_path.read_text(errors="replace") and owner not in log_path.read_text(errors="replace")


def test_requests_to_an_app_share_its_kept_connections(connected):
    """One connection from the agent to the app serves request after request, whoever
    sends them (as nginx keeps its upstream connections). A request with a body gets
    a connection of its own, never kept: what the app leaves of a body unread would be
    read as the next request."""
    shared = connected.ws.url + "/@owner/dev.main/apps/shared/headers"
    second = connected.ws.login(OWNER["email"], OWNER["password"]).json()["session_token"]
    ports = [
        requests.get(shared, headers=connected.ws.as_user(token), timeout=10).json()["port"]
        for token in (connected.owner, second, connected.owner)
    ]
    assert len(set(ports)) == 1, ports
    posted = requests.post(shared, data=b"a body", headers=connected.ws.as_user(connected.owner), timeout=10)
    assert posted.status_code == 200 and posted.json()["port"] != ports[0]
    after = requests.get(shared, headers=connected.ws.as_user(second), timeout=10)
    assert after.json()["port"] == ports[0]


def test_an_app_that_closed_a_kept_connection_is_asked_again(connected):
    """The app closes the connection after each /hello-then-close, without saying so:
    the next request, whether it finds that stream already ended or sends on it as it
    ends, is answered."""
    for _ in range(20):
        for path in ("/hello-then-close", "/hello"):
            answer = requests.get(connected.app_url + path, headers=connected.ws.as_user(connected.owner), timeout=10)
            assert (answer.status_code, answer.text) == (200, "hello from the app\n"), path


def test_a_request_on_a_kept_connection_the_app_drops_is_sent_again(connected):
    """The app closes the kept connection as the next request arrives, without an
    answer: a GET is sent again on a new connection and answered."""
    headers = connected.ws.as_user(connected.owner)
    for _ in range(5):
        first = requests.get(connected.app_url + "/hello-then-drop-next", headers=headers, timeout=10)
        assert first.status_code == 200
        kept = requests.get(connected.app_url + "/headers", headers=headers, timeout=10)
        assert kept.status_code == 200 and kept.json()["path"] == "/headers"


def test_an_answer_with_a_malformed_length_is_a_502_and_its_connection_is_dropped(connected):
    headers = connected.ws.as_user(connected.owner)
    bad = requests.get(connected.app_url + "/bad-length", headers=headers, timeout=10)
    assert bad.status_code == 502 and "Content-Length" in bad.json()["detail"]
    assert requests.get(connected.app_url + "/hello", headers=headers, timeout=10).text == "hello from the app\n"


def test_a_deleted_workspace_is_refused_at_once(connected):
    """Its app answered a moment ago (a 502: its agent never connected); once the
    workspace is deleted, the next request is a 404."""
    created = create_workspace(
        connected.ws,
        connected.owner,
        "brief",
        [{"name": "main", "apps": [{"slug": "app", "url": "http://127.0.0.1:9"}]}],
    )
    url = connected.ws.url + "/@owner/brief.main/apps/app/"
    headers = connected.ws.as_user(connected.owner)
    assert requests.get(url, headers=headers, timeout=10).status_code == 502  # its agent never connected
    assert (
        requests.delete(f"{connected.ws.api}/workspaces/{created['id']}", headers=headers, timeout=10).status_code
        == 204
    )
    assert requests.get(url, headers=headers, timeout=10).status_code == 404


def test_a_password_reset_on_the_host_refuses_the_sessions_at_once(connected):
    """The host's command runs in a process of its own: it tells the service's
    workers through the data folder (or Redis) that their grants are stale."""
    requests.post(
        connected.ws.api + "/users",
        json={"email": "third@example.com", "username": "third", "password": "another long passphrase"},
        headers=connected.ws.as_user(connected.owner),
        timeout=10,
    ).raise_for_status()
    token = connected.ws.login("third@example.com", "another long passphrase").json()["session_token"]
    # Third's own app: its agent never connects, so a 502 says that access was granted.
    create_workspace(
        connected.ws, token, "thirds", [{"name": "main", "apps": [{"slug": "app", "url": "http://127.0.0.1:9"}]}]
    )
    own = f"{connected.ws.url}/@third/thirds.main/apps/app/hello"
    assert requests.get(own, headers=connected.ws.as_user(token), timeout=10).status_code == 502
    done = run_cli(connected.ws, "reset-password", "third", stdin="a brand new passphrase\n")
    assert done.returncode == 0, done.stderr
    refused = requests.get(own, headers=connected.ws.as_user(token), timeout=10)
    assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
