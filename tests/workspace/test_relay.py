"""The relay: two authenticated peers naming one agent and session exchange opaque messages."""
import uuid

import pytest
import requests
from simple_websocket import Client, ConnectionClosed
from simple_websocket import ConnectionError as HandshakeRefused

from tests.workspace.conftest import TOKEN_HEADER, create_workspace


@pytest.fixture(scope="module")
def relay_setup(owned):
    ws, owner = owned
    created = create_workspace(ws, owner, "relayed", [{"name": "main"}, {"name": "second"}])
    return ws, owner, created["agents"][0], created["agents"][1]


def _url(ws, agent_id, role, session):
    return ws.url.replace("http://", "ws://") + f"/relay?agent={agent_id}&role={role}&session={session}"


def test_messages_pass_both_ways_unchanged(relay_setup):
    ws, owner, agent, _ = relay_setup
    session = uuid.uuid4()
    client = Client.connect(_url(ws, agent["id"], "client", session), headers={TOKEN_HEADER: owner})
    peer = Client.connect(_url(ws, agent["id"], "agent", session), headers={TOKEN_HEADER: agent["token"]})
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
    cases = [({"agent": agent["id"], "role": "client", "session": session}, {}, 401),
             ({"agent": agent["id"], "role": "agent", "session": session}, {TOKEN_HEADER: second["token"]}, 403),
             ({"agent": agent["id"], "role": "agent", "session": session}, {TOKEN_HEADER: owner}, 401),
             ({"agent": agent["id"], "role": "boss", "session": session}, {TOKEN_HEADER: owner}, 400),
             ({"agent": "nope", "role": "client", "session": session}, {TOKEN_HEADER: owner}, 400),
             ({"agent": str(uuid.uuid4()), "role": "client", "session": session}, {TOKEN_HEADER: owner}, 404)]
    for params, headers, status in cases:
        response = requests.get(plain, params=params, headers=headers, timeout=10)
        assert response.status_code == status, (params, response.text)
        assert response.json()["message"]
