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
               manage the agent's workspace: its owner or an administrator. Signed
               in by the cookie, the upgrade must come from the platform's own pages
               (403 otherwise, before the upgrade: sessions.current_user).

Across workers (with REDIS_URL): the first peer's worker claims the session (mesh.py)
and pairs it; the other peer, whichever worker it reaches, is carried there over the
mesh, its websocket's messages framed on a link stream (LinkPeer), and the answers
before the upgrade (409, 502) are the pairing worker's.

Limits: one peer of each role per (agent, session): a second one is 409 before the
upgrade. A message is at most 1 MiB (larger closes the websocket with 1009). A peer
waits at most WORKSPACE_RELAY_IDLE_SECONDS for its partner, and a pair with no
message for that long is closed. When one side leaves, the other is closed.
"""

import json
import struct
import time
import uuid

import gevent
from flask import Blueprint, current_app, request
from gevent.event import Event
from simple_websocket import ConnectionClosed

import workspace_protocol.websocket as wire
from app.common import lifecycle
from app.common.failures import ApiError, Conflict, Failure, Forbidden, Invalid, UpstreamFailed
from app.workspace.access import sessions
from app.workspace.core.models import database
from app.workspace.routes.workspaces import visible_agent
from app.workspace.transport import websocket
from app.workspace.transport.mesh import CALL_SECONDS, Unreachable, mesh
from app.workspace.transport.mux import StreamClosed
from app.workspace.tunnel import agents

bp = Blueprint("relay", __name__)

MESSAGE_LIMIT = 1024 * 1024
ROLES = ("client", "agent")
INVITE_WAIT_SECONDS = 20  # an invited agent dials in within a second or two
TRY_AGAIN_LATER = 1013  # the websocket close code when the agent did not join
# A websocket message on a mesh link stream (LinkPeer): its kind and length, then it.
KIND = struct.Struct("!BI")
BINARY, TEXT, CLOSE = 0, 1, 2

# (agent id, session id) -> Pair, in this worker process
pairs: dict[tuple[str, str], "Pair"] = {}


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
        raise Invalid("role: must be client or agent", field="role")
    try:
        agent_id, session = uuid.UUID(request.args.get("agent", "")), uuid.UUID(request.args.get("session", ""))
    except ValueError:
        raise Invalid("agent and session: must be UUIDs", field="agent") from None
    return role, str(agent_id), str(session)


def _authorize(role, agent_id):
    if role == "agent":
        agent = agents.authenticate_agent(request.headers.get(sessions.HEADER))
        if str(agent.id) != agent_id:
            raise Forbidden("An agent may only relay for itself.")
    else:
        visible_agent(sessions.current_user(), agent_id)


@websocket.route(bp, "/relay")
def relay():
    """The relay (websocket): forwards messages between a client and an agent that name the same agent and session."""
    role, agent_id, session = _query()
    _authorize(role, agent_id)
    key = (agent_id, session)
    idle = current_app.config["WORKSPACE"].relay_idle_seconds
    pairing = mesh.claim(("relay", agent_id, session), idle + INVITE_WAIT_SECONDS)
    if pairing is not None and pairing != mesh.address:
        return _relay_elsewhere(pairing, key, role, idle)
    try:
        invite = _admit(key, role)
        if not websocket.is_upgrade():
            raise Invalid("This is the relay's websocket: send a websocket upgrade request.")
        agents.refuse_while_stopping()
    except Failure:
        if key not in pairs:
            mesh.unclaim(("relay", agent_id, session))
        raise
    database.close()
    return websocket.accept(
        lambda transport: _serve(key, role, transport, idle, invite), "relay", max_message_size=MESSAGE_LIMIT
    )


def _admit(key, role):
    """409 if the session has its `role` already; else the function that invites the
    agent when a client comes first (502 now when the agent is not connected)."""
    pair = pairs.get(key)
    if pair is not None and role in pair.peers:
        raise Conflict(f"This relay session already has its {role}.")
    if role == "client" and (pair is None or "agent" not in pair.peers):
        return agents.relay_invitation(*key)
    return None


# --------------------------------------------------------------------------- a peer on another worker


def _relay_elsewhere(pairing, key, role, idle):
    """Carry this peer to the worker pairing the session: its answer before the
    upgrade is that worker's; then the websocket's messages go both ways."""
    agent_id, session = key
    try:
        peer = LinkPeer(
            mesh.open(pairing, {"kind": "relay", "agent": agent_id, "session": session, "role": role, "idle": idle})
        )
        verdict = json.loads(peer.receive(CALL_SECONDS))
    except (Unreachable, ConnectionClosed, TypeError, ValueError) as exc:
        mesh.unclaim(("relay", agent_id, session), pairing)  # a worker gone: the next try pairs here
        raise UpstreamFailed("The relay session's worker does not answer.", detail=str(exc)) from None
    if verdict.get("status") != 200:
        peer.close()
        raise ApiError(int(verdict.get("status") or 502), str(verdict.get("message")), detail=verdict.get("detail"))
    if not websocket.is_upgrade():
        peer.close()
        raise Invalid("This is the relay's websocket: send a websocket upgrade request.")
    database.close()
    return websocket.accept(lambda transport: _carry(transport, peer), "relay", max_message_size=MESSAGE_LIMIT)


def _carry(transport, peer):
    def down():
        try:
            while True:
                transport.send(peer.receive())
        except ConnectionClosed as exc:
            transport.close(exc.reason, exc.message)
        except OSError:
            transport.close()

    downward = gevent.spawn(down)
    try:
        while True:
            message = transport.receive()
            peer.send(message)
    except ConnectionClosed as exc:
        peer.close(exc.reason or 1000, exc.message or "")
    finally:
        downward.join(timeout=1.0)
        downward.kill()
        peer.stream.close()


@mesh.serves("relay")
def _pair_for_another_worker(link):
    """A relay peer whose websocket another worker holds: admitted and paired here."""
    meta = link.meta
    key, role = (str(meta.get("agent")), str(meta.get("session"))), meta.get("role")
    peer = LinkPeer(link)
    try:
        if role not in ROLES:
            raise Invalid("role: must be client or agent", field="role")
        invite = _admit(key, role)
    except Failure as exc:
        peer.send(json.dumps({"status": exc.status, "message": exc.message, "detail": exc.extra.get("detail")}))
        peer.close()
        return
    peer.send(json.dumps({"status": 200}))
    _serve(key, role, peer, int(meta.get("idle") or 300), invite)


class LinkPeer:
    """A websocket's messages on a mesh link stream, with the interface of
    websocket.Transport that _serve and _forward use: send, receive, close."""

    def __init__(self, stream):
        self.stream = stream
        self._buffer = b""
        self._closed = False

    def send(self, message):
        kind, data = (TEXT, message.encode()) if isinstance(message, str) else (BINARY, bytes(message))
        try:
            self.stream.write(KIND.pack(kind, len(data)) + data)
        except StreamClosed as exc:
            raise ConnectionClosed(1006, str(exc)) from None

    def receive(self, timeout=None):
        """The next message; None after `timeout`; ConnectionClosed at the end."""
        while len(self._buffer) < KIND.size or len(self._buffer) < KIND.size + KIND.unpack_from(self._buffer)[1]:
            try:
                data = self.stream.read(timeout)
            except StreamClosed as exc:
                raise ConnectionClosed(1006, str(exc)) from None
            if data is None:
                return None
            if not data:
                raise ConnectionClosed(1006, "the relay's link ended")
            self._buffer += data
        kind, length = KIND.unpack_from(self._buffer)
        data, self._buffer = self._buffer[KIND.size : KIND.size + length], self._buffer[KIND.size + length :]
        if kind == CLOSE:
            code = wire.CLOSE_CODE.unpack_from(data)[0] if len(data) >= 2 else 1000
            raise ConnectionClosed(code, data[2:].decode(errors="replace"))
        return data.decode() if kind == TEXT else data

    def close(self, code=None, message=None):
        if self._closed:
            return
        self._closed = True
        data = wire.CLOSE_CODE.pack(code or 1000) + (message or "").encode()[:120]
        try:
            self.stream.write(KIND.pack(CLOSE, len(data)) + data)
            self.stream.write_eof()
        except StreamClosed:
            pass


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
            mesh.unclaim(("relay", *pair.key))
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
