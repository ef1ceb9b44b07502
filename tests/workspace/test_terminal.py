"""The web terminal: a real shell on a PTY in the agent, through the platform."""

import json
import time
import uuid

import pytest
import requests
from simple_websocket import Client, ConnectionClosed
from simple_websocket import ConnectionError as HandshakeRefused

from tests.support.workspace import TOKEN_HEADER, create_workspace


def _open(connected, reconnect, width=80, height=24, token=None):
    url = (
        connected.ws.url.replace("http://", "ws://") + f"/api/v2/workspaceagents/{connected.agent['id']}/pty"
        f"?reconnect={reconnect}&width={width}&height={height}"
    )
    return Client.connect(url, headers={TOKEN_HEADER: token or connected.owner})


def _read_until(client, wanted, timeout=15.0):
    """Terminal output until `wanted` appears (bytes), within a deadline."""
    seen = b""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"{wanted!r} not in the terminal's output: {seen[-2000:]!r}"
        message = client.receive(timeout=left)
        if message is not None:
            assert isinstance(message, bytes)
            seen += message
    return seen


def _type(client, text):
    client.send(json.dumps({"data": text}))


def test_echo_resize_disconnect_and_reattach(connected):
    session = uuid.uuid4()
    client = _open(connected, session)
    try:
        _type(client, "echo marker-$((6*7))\r")
        _read_until(client, b"marker-42")
        client.send(json.dumps({"height": 31, "width": 101}))
        _type(client, "stty size\r")
        _read_until(client, b"31 101")
    finally:
        client.close()

    again = _open(connected, session)
    try:
        # simple-websocket's client leaves a frame that came in the same read as the
        # 101 unparsed until more bytes arrive: new output makes sure they do.
        _type(again, "echo still-$((1+1))\r")
        seen = _read_until(again, b"still-2")
        assert b"marker-42" in seen and b"31 101" in seen  # the earlier output, replayed first
        assert seen.index(b"marker-42") < seen.index(b"still-2")
    finally:
        again.close()

    fresh = _open(connected, uuid.uuid4())
    try:
        _type(fresh, "echo fresh-shell\r")
        assert b"marker-42" not in _read_until(fresh, b"fresh-shell")
    finally:
        fresh.close()


def test_shell_exit_ends_the_websocket(connected):
    client = _open(connected, uuid.uuid4())
    _type(client, "exit\r")
    deadline = time.monotonic() + 15
    try:
        while time.monotonic() < deadline:
            client.receive(timeout=1)
        raise AssertionError("the websocket stayed open after the shell exited")
    except ConnectionClosed:
        pass


def test_pty_rules(connected):
    pty = f"{connected.ws.api}/workspaceagents/{connected.agent['id']}/pty"
    assert requests.get(pty + f"?reconnect={uuid.uuid4()}", timeout=10).status_code == 401
    other = requests.get(pty + f"?reconnect={uuid.uuid4()}", headers={TOKEN_HEADER: connected.other}, timeout=10)
    assert other.status_code == 404
    bad = requests.get(pty + "?reconnect=nope", headers={TOKEN_HEADER: connected.owner}, timeout=10)
    assert bad.status_code == 400 and "reconnect" in bad.json()["message"]
    wide = requests.get(
        pty + f"?reconnect={uuid.uuid4()}&width=5000", headers={TOKEN_HEADER: connected.owner}, timeout=10
    )
    assert wide.status_code == 400 and "width" in wide.json()["message"]


def test_terminal_page_serves_xterm_from_the_bundle(connected):
    page = requests.get(
        f"{connected.ws.url}/@owner/dev.main/terminal", cookies={"workspace_session_token": connected.owner}, timeout=10
    )
    assert page.status_code == 200 and connected.agent["id"] in page.text
    assert "/static/vendor/xterm/xterm.js" in page.text and "cdn" not in page.text.lower()
    for name in ("xterm.js", "xterm.css", "addon-fit.js"):
        asset = requests.get(f"{connected.ws.url}/static/vendor/xterm/{name}", timeout=10)
        assert asset.status_code == 200 and len(asset.content) > 1000, name
    assert requests.get(f"{connected.ws.url}/static/terminal.js", timeout=10).status_code == 200
    login = requests.get(
        f"{connected.ws.url}/@owner/dev.main/terminal",
        headers={"Accept": "text/html"},
        allow_redirects=False,
        timeout=10,
    )
    assert login.status_code == 303 and login.headers["Location"].startswith("/login?redirect=")


def _pty_url(connected, query=""):
    return (
        connected.ws.url.replace("http://", "ws://") + f"/api/v2/workspaceagents/{connected.agent['id']}/pty"
        f"?reconnect={uuid.uuid4()}{query}"
    )


def test_a_websocket_the_cookie_signs_in_must_come_from_the_platforms_own_pages(connected):
    cookie = {"Cookie": f"workspace_session_token={connected.owner}"}
    # Another origin's page (a sibling host too: SameSite=Lax sends the cookie there).
    for refused in (
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Origin": "http://app.localhost", "Sec-Fetch-Site": "same-site"},
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
    ):
        with pytest.raises(HandshakeRefused) as answer:
            Client.connect(_pty_url(connected), headers={**cookie, **refused})
        assert answer.value.status_code == 403, refused
    # The platform's own page: the browser says same-origin.
    own = Client.connect(
        _pty_url(connected), headers={**cookie, "Origin": connected.ws.url, "Sec-Fetch-Site": "same-origin"}
    )
    own.close()
    # A client with the token in its header (the CLI) may come from anywhere: it is no browser's cookie.
    cli = Client.connect(_pty_url(connected), headers={TOKEN_HEADER: connected.owner, "Origin": "http://evil.example"})
    cli.close()


def test_the_session_token_in_the_query_string_is_taken_on_a_websocket_upgrade_only(connected):
    query = f"&workspace_session_token={connected.owner}"
    upgraded = Client.connect(_pty_url(connected, query))  # browsers cannot set headers on websockets
    try:
        _type(upgraded, "echo query-$((2*21))\r")
        _read_until(upgraded, b"query-42")
    finally:
        upgraded.close()
    plain = requests.get(_pty_url(connected, query).replace("ws://", "http://"), timeout=10)
    assert plain.status_code == 401 and plain.json()["detail"] == "no session token was given"


def test_the_terminal_pages_404_says_nothing_of_other_peoples_workspaces(connected):
    ws, other = connected.ws, {"workspace_session_token": connected.other}
    create_workspace(ws, connected.owner, "pair", [{"name": "left"}, {"name": "right"}])
    # `dev` and `pair` exist (the owner's; `pair` has two agents), `nope` and `nobody`
    # do not: the other user cannot tell.
    answers = [
        requests.get(f"{ws.url}/@{path}/terminal", cookies=other, timeout=10)
        for path in ("owner/dev", "owner/dev.main", "owner/pair", "owner/nope", "nobody/dev")
    ]
    assert {answer.status_code for answer in answers} == {404}
    assert len({answer.text for answer in answers}) == 1, [answer.text for answer in answers]
    # The owner is told what is wrong with her own address.
    own = requests.get(
        f"{ws.url}/@owner/pair/terminal", cookies={"workspace_session_token": connected.owner}, timeout=10
    )
    assert own.status_code == 404 and "several agents" in own.text
