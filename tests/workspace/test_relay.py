"""The relay: two authenticated peers naming one agent and session exchange opaque
messages; a client on it reaches the real agent program's apps and shells (mux frames)."""

import json
import os
import subprocess
import time
import uuid

import pytest
import requests
from simple_websocket import Client, ConnectionClosed
from simple_websocket import ConnectionError as HandshakeRefused

from tests.support.shared import ROOT
from tests.support.workspace import TOKEN_HEADER, agent_program, create_workspace
from workspace_protocol import mux


@pytest.fixture(scope="module")
def relay_setup(connected):
    """On the platform of `connected` (one per module): a workspace whose agents
    no agent program runs."""
    ws, owner = connected.ws, connected.owner
    created = create_workspace(ws, owner, "relayed", [{"name": "main"}, {"name": "second"}])
    return ws, owner, created["agents"][0], created["agents"][1]


def _url(ws, agent_id, role, session):
    return ws.url.replace("http://", "ws://") + f"/relay?agent={agent_id}&role={role}&session={session}"


def test_messages_pass_both_ways_unchanged(relay_setup):
    ws, owner, agent, _ = relay_setup
    session = uuid.uuid4()
    # An agent-side peer waits first: the client joins it (the agent itself is not connected).
    peer = Client.connect(_url(ws, agent["id"], "agent", session), headers={TOKEN_HEADER: agent["token"]})
    client = Client.connect(_url(ws, agent["id"], "client", session), headers={TOKEN_HEADER: owner})
    try:
        client.send(b"\x00binary from the client")
        assert peer.receive(timeout=10) == b"\x00binary from the client"
        peer.send("text from the agent")
        assert client.receive(timeout=10) == "text from the agent"
        with pytest.raises(HandshakeRefused) as third:
            Client.connect(_url(ws, agent["id"], "client", session), headers={TOKEN_HEADER: owner})
        assert third.value.status_code == 409
    finally:
        client.close()
    with pytest.raises(ConnectionClosed):
        while True:
            peer.receive(timeout=10)  # the other side is closed when one leaves


def test_who_may_use_it(relay_setup):
    ws, owner, agent, second = relay_setup
    session = uuid.uuid4()
    plain = ws.url + "/relay"
    cases = [
        ({"agent": agent["id"], "role": "client", "session": session}, {}, 401),
        ({"agent": agent["id"], "role": "agent", "session": session}, {TOKEN_HEADER: second["token"]}, 403),
        ({"agent": agent["id"], "role": "agent", "session": session}, {TOKEN_HEADER: owner}, 401),
        ({"agent": agent["id"], "role": "boss", "session": session}, {TOKEN_HEADER: owner}, 400),
        ({"agent": "nope", "role": "client", "session": session}, {TOKEN_HEADER: owner}, 400),
        ({"agent": str(uuid.uuid4()), "role": "client", "session": session}, {TOKEN_HEADER: owner}, 404),
    ]
    for params, headers, status in cases:
        response = requests.get(plain, params=params, headers=headers, timeout=10)
        assert response.status_code == status, (params, response.text)
        assert response.json()["message"]


# --------------------------------------------------------------------------- the invitation and the agent program


def _frame(kind, payload=b""):
    return mux.HEADER.pack(kind, 0) + payload


def _next_connection_frame(peer, wanted, timeout=15.0):
    """The payload of the next stream-0 frame of type `wanted` (PINGs answered)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no frame of type {wanted} within {timeout} s"
        message = peer.receive(timeout=left)
        if message is None:
            continue
        kind, stream_id = mux.HEADER.unpack_from(message)
        if kind == mux.PING:
            peer.send(_frame(mux.PONG, message[mux.HEADER.size :]))
        elif kind == wanted and stream_id == 0:
            return json.loads(message[mux.HEADER.size :])


def test_a_client_invites_the_connected_agent(relay_setup):
    """The protocol seen by an agent: HELLO's answer names the agent; a client on the
    relay makes the platform send RELAY {session, apps}; the agent joins that session."""
    ws, owner, _, second = relay_setup
    rpc = Client.connect(
        ws.url.replace("http://", "ws://") + "/api/v2/workspaceagents/me/rpc", headers={TOKEN_HEADER: second["token"]}
    )
    try:
        rpc.send(
            _frame(
                mux.HELLO,
                json.dumps({"version": mux.VERSION, "apps": [{"slug": "web", "url": "http://127.0.0.1:9"}]}).encode(),
            )
        )
        assert _next_connection_frame(rpc, mux.HELLO)["agent_id"] == second["id"]
        session = str(uuid.uuid4())
        client = Client.connect(_url(ws, second["id"], "client", session), headers={TOKEN_HEADER: owner})
        try:
            invitation = _next_connection_frame(rpc, mux.RELAY)
            assert invitation == {"session": session, "apps": [{"slug": "web", "url": "http://127.0.0.1:9"}]}
            peer = Client.connect(_url(ws, second["id"], "agent", session), headers={TOKEN_HEADER: second["token"]})
            try:
                client.send(b"through")
                assert peer.receive(timeout=10) == b"through"
            finally:
                peer.close()
        finally:
            client.close()
    finally:
        rpc.close()


def _relay_client(ws, token, agent_id, *command, stdin=b""):
    """The relay client (the agent's zipapp, `relay`; the token in the environment): its result."""
    env = {**os.environ, "WORKSPACE_SESSION_TOKEN": token}
    return subprocess.run(
        [*agent_program(), "relay", "--url", ws.url, "--agent", agent_id, *command],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        timeout=60,
    )


def test_a_client_gets_an_app_through_the_relay(connected):
    done = _relay_client(connected.ws, connected.owner, connected.agent["id"], "app", "echo", "/hello")
    assert done.returncode == 0, (done.stderr.decode(), connected.agent_process.log())
    assert done.stdout == b"hello from the app\n"
    unknown = _relay_client(connected.ws, connected.owner, connected.agent["id"], "app", "nope", "/hello")
    assert unknown.returncode == 2
    assert b"no app 'nope'" in unknown.stderr


def test_a_client_runs_a_shell_through_the_relay(connected):
    done = _relay_client(
        connected.ws, connected.owner, connected.agent["id"], "pty", stdin=b"echo relay-$((6*7))\nexit\n"
    )
    assert done.returncode == 0, (done.stderr.decode(), connected.agent_process.log())
    assert b"relay-42" in done.stdout, done.stdout


def test_a_client_for_an_agent_not_connected_is_told_so(relay_setup):
    ws, owner, agent, _ = relay_setup
    done = _relay_client(ws, owner, agent["id"], "app", "web", "/")
    assert done.returncode == 2
    assert b"HTTP 502" in done.stderr and b"not connected" in done.stderr, done.stderr
    response = requests.get(
        ws.url + "/relay",
        params={"agent": agent["id"], "role": "client", "session": uuid.uuid4()},
        headers={TOKEN_HEADER: owner},
        timeout=10,
    )
    assert response.status_code == 502
    assert response.json()["detail"] == "the agent has no open connection to the platform"


def test_a_relay_client_the_cookie_signs_in_must_come_from_the_platforms_own_pages(relay_setup):
    ws, owner, agent, _ = relay_setup
    url = _url(ws, agent["id"], "client", uuid.uuid4())
    with pytest.raises(HandshakeRefused) as refused:
        Client.connect(url, headers={"Cookie": f"workspace_session_token={owner}", "Origin": "http://evil.example"})
    assert refused.value.status_code == 403
    plain = requests.get(
        url.replace("ws://", "http://"),
        cookies={"workspace_session_token": owner},
        headers={
            "Origin": "http://evil.example",
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        },
        timeout=10,
    )
    assert plain.status_code == 403
    assert plain.json()["message"] == "This request came from another site and was refused."
