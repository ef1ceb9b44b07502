"""The built-in relay: `GET /relay?agent=<agent id>&role=<client|agent>&session=<uuid>`
(websocket).

It forwards websocket messages, opaque to it (text stays text, binary stays binary),
between exactly two peers that name the same agent and session id: for a client
that cannot reach the workspace directly (no route into its network) and an agent
that dials out to the platform anyway. The platform neither reads nor keeps them.

What they carry: the agent program speaks the multiplex protocol (mux.py) on it, the
client opening app and pty streams as the platform does on the agent connection
(`python -m app.workspace.relay_client` is such a client). A client that arrives
while no agent-role peer waits in its session makes the platform invite the agent
over its connection (a mux RELAY frame); the agent dials in as role=agent. If that
agent is not connected to this platform process, the client gets 502 before the
upgrade (JSON {message, detail}, as the apps path answers); if the invited agent has
not joined within INVITE_WAIT_SECONDS, the client's websocket is closed with 1013
and a reason that says so. An agent-side process other than the agent program may
still wait in a session as role=agent first: a client that joins it invites no one.

Who may use it:
  role=agent   the agent itself: its agent token in `Workspace-Session-Token`, and
               `agent` must be its own id;
  role=client  a signed-in user (session header, cookie or query token) who may
               manage the agent's workspace: its owner or an administrator.

Limits: one peer of each role per (agent, session): a second one is 409 before the
upgrade. A message is at most 1 MiB (larger closes the websocket with 1009). A peer
waits at most WORKSPACE_RELAY_IDLE_SECONDS for its partner, and a pair with no
message for that long is closed. When one side leaves, the other is closed.
"""
import time
import uuid

import gevent
from flask import current_app, request
from gevent.event import Event
from simple_websocket import ConnectionClosed

from app.common import lifecycle
from app.common.failures import ApiError
from app.workspace import agents, bp, sessions, websocket
from app.workspace.models import database
from app.workspace.workspaces import visible_agent

MESSAGE_LIMIT = 1024 * 1024
ROLES = ("client", "agent")
INVITE_WAIT_SECONDS = 20  # an invited agent dials in within a second or two
TRY_AGAIN_LATER = 1013  # the websocket close code when the agent did not join

# (agent id, session id) -> Pair, in this worker process
pairs = {}


class Pair:
    def __init__(self, key):
        self.key = key
        self.peers = {}
        self.complete = Event()
        self.last_message = time.monotonic()

    def other(self, role):
        return self.peers.get(ROLES[1 - ROLES.index(role)])


def _query():
    role = request.args.get("role", "")
    if role not in ROLES:
        raise ApiError(400, "role: must be client or agent", field="role")
    try:
        agent_id, session = uuid.UUID(request.args.get("agent", "")), uuid.UUID(request.args.get("session", ""))
    except ValueError:
        raise ApiError(400, "agent and session: must be UUIDs", field="agent") from None
    return role, str(agent_id), str(session)


def _authorize(role, agent_id):
    if role == "agent":
        agent = agents.authenticate_agent(request.headers.get(sessions.HEADER))
        if str(agent.id) != agent_id:
            raise ApiError(403, "An agent may only relay for itself.")
    else:
        visible_agent(sessions.current_user(), agent_id)


@websocket.route(bp, "/relay")
def relay():
    role, agent_id, session = _query()
    _authorize(role, agent_id)
    key = (agent_id, session)
    pair = pairs.get(key)
    if pair is not None and role in pair.peers:
        raise ApiError(409, f"This relay session already has its {role}.")
    invite = None
    if role == "client" and (pair is None or "agent" not in pair.peers):
        invite = agents.relay_invitation(agent_id, session)  # 502 when the agent is not connected here
    if not websocket.is_upgrade():
        raise ApiError(400, "This is the relay's websocket: send a websocket upgrade request.")
    agents.refuse_while_stopping()
    database.close()
    idle = current_app.config["WORKSPACE"].relay_idle_seconds
    return websocket.accept(lambda transport: _serve(key, role, transport, idle, invite),
                            max_message_size=MESSAGE_LIMIT)


def _serve(key, role, transport, idle, invite):
    pair = pairs.setdefault(key, Pair(key))
    if role in pair.peers:  # another one upgraded meanwhile
        transport.close(1008, f"this relay session already has its {role}")
        return
    pair.peers[role] = transport
    if len(pair.peers) == 2:
        pair.complete.set()
    try:
        wait = idle
        if invite is not None and not pair.complete.is_set():
            if not invite():
                transport.close(TRY_AGAIN_LATER, "the agent's connection to the platform closed")
                return
            wait = min(idle, INVITE_WAIT_SECONDS)
        if pair.complete.wait(wait):
            _forward(pair, transport, pair.other(role), idle)
        elif invite is not None:
            transport.close(TRY_AGAIN_LATER, f"the agent did not join the relay session within {wait} s")
        else:
            transport.close(1000, f"no {ROLES[1 - ROLES.index(role)]} joined the relay session within {wait} s")
    except ConnectionClosed:
        pass
    finally:
        pair.peers.pop(role, None)
        if pairs.get(pair.key) is pair and not pair.peers:
            del pairs[pair.key]
        other = pair.other(role)
        if other is not None:
            other.close(1000, f"the {role} left")


def _forward(pair, source, target, idle):
    while True:
        message = source.receive(timeout=idle)
        if message is None:
            if time.monotonic() - pair.last_message < idle:
                continue  # the other direction is busy
            source.close(1000, f"no message for {idle} s")
            return
        pair.last_message = time.monotonic()
        try:
            target.send(message)
        except (ConnectionClosed, OSError):
            return


def close_all():
    for pair in list(pairs.values()):
        for transport in list(pair.peers.values()):
            gevent.spawn(transport.close, 1001, "the platform is stopping")


lifecycle.on_stop(close_all)
