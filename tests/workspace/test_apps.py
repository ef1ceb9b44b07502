"""The workspace apps proxy through a real agent process to a real local app."""
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from simple_websocket import Client

from tests.workspace.conftest import TOKEN_HEADER


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
    response = requests.post(connected.app_url + "/upload", data=body, headers=connected.ws.as_user(connected.owner),
                             timeout=30)
    assert response.status_code == 200
    assert response.json() == {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}


def test_chunked_upload_is_rechunked_to_the_app(connected):
    pieces = [os.urandom(100_000) for _ in range(5)]
    response = requests.post(connected.app_url + "/upload", data=iter(pieces),
                             headers=connected.ws.as_user(connected.owner), timeout=30)
    assert response.json() == {"length": 500_000, "sha256": hashlib.sha256(b"".join(pieces)).hexdigest()}


def test_streaming_answer_arrives_piece_by_piece(connected):
    with requests.get(connected.app_url + "/stream?chunks=6", headers=connected.ws.as_user(connected.owner),
                      stream=True, timeout=10) as response:
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
    response = requests.get(connected.app_url + f"/headers?a=1&workspace_session_token={connected.owner}&b=2",
                            headers={TOKEN_HEADER: connected.owner, "X-Custom": "kept"},
                            cookies={"workspace_session_token": connected.owner, "app_cookie": "mine"}, timeout=10)
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
    response = requests.get(connected.app_url + "?x=1", headers=connected.ws.as_user(connected.owner),
                            allow_redirects=False, timeout=10)
    assert response.status_code == 307
    assert response.headers["Location"].endswith("/@owner/dev.main/apps/echo/?x=1")


def test_unauthenticated_browser_is_sent_to_login_and_machine_gets_401(connected):
    browser = requests.get(connected.app_url + "/hello?x=1", headers={"Accept": "text/html,*/*"},
                           allow_redirects=False, timeout=10)
    assert browser.status_code == 303
    assert browser.headers["Location"] == "/login?redirect=%2F%40owner%2Fdev.main%2Fapps%2Fecho%2Fhello%3Fx%3D1"
    machine = requests.get(connected.app_url + "/hello", allow_redirects=False, timeout=10)
    assert machine.status_code == 401 and machine.json()["message"] == "You must be signed in to do this."


def test_sharing_levels(connected):
    other = connected.ws.as_user(connected.other)
    owner_only = requests.get(connected.app_url + "/hello", headers=other, timeout=10)
    assert owner_only.status_code == 404 and owner_only.json()["message"] == "Workspace app not found."
    shared = requests.get(f"{connected.ws.url}/@owner/dev.main/apps/shared/hello", headers=other, timeout=10)
    assert shared.status_code == 200 and shared.text == "hello from the app\n"


def test_unknown_workspace_agent_or_app_is_404(connected):
    auth = connected.ws.as_user(connected.owner)
    for path in ("/@owner/nope.main/apps/echo/", "/@owner/dev.nope/apps/echo/", "/@owner/dev.main/apps/nope/",
                 "/@nobody/dev.main/apps/echo/"):
        response = requests.get(connected.ws.url + path, headers=auth, timeout=10)
        assert response.status_code == 404, path
