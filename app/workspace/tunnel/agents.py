"""Workspace agents: their tokens, their status, and their one live connection.

`GET /api/v2/workspaceagents/me/rpc` is the agent's websocket (mux.py's protocol),
authenticated by the agent token in `Workspace-Session-Token` before the upgrade.
A process keeps the connections it holds in `connections`; a reconnecting agent
replaces (and closes) its previous connection. Without REDIS_URL the platform runs
one worker, which holds them all. With it, each worker records the agents it holds
in Redis and a request for an agent held by another worker is carried there over
the mesh between the workers (mesh.py): `open_stream`, `relay_invitation` and
`disconnect` work whichever worker holds the agent.

Status, as Coder derives it from the timestamps:
  connecting    never connected, and created less than WORKSPACE_AGENT_CONNECTION_TIMEOUT ago
  timeout       never connected, created longer ago than that
  connected     last_connected_at (the upgrade, then answered pings, written in batches
                by liveness.py) is recent
                (within 3 ping intervals) and after disconnected_at
  disconnected  otherwise (closed, two pings missed, or the platform went away)
"""

import logging
import time
from collections import deque
from datetime import timedelta

import gevent
from flask import Blueprint, current_app, request
from gevent.lock import BoundedSemaphore
from peewee import fn
from prometheus_client import Counter, Gauge

from app.common import lifecycle
from app.common.broker import broker
from app.common.db import connection_for_block
from app.common.failures import Failure, Invalid, Unauthenticated, Unavailable, UpstreamFailed
from app.workspace.access import app_hosts, grants
from app.workspace.access.sessions import HEADER, TOKEN_SHAPE, new_token, secret_matches
from app.workspace.core import payloads
from app.workspace.core.models import WorkspaceAgent, WorkspaceApp, database, now
from app.workspace.transport import websocket
from app.workspace.transport.mesh import Refused, Unreachable, mesh
from app.workspace.transport.mux import Mux, StreamClosed, join
from app.workspace.tunnel.liveness import liveness
from workspace_protocol.mux import MESSAGE_LIMIT, TRY_AGAIN_LATER, VERSION_REFUSED, version_mismatch

bp = Blueprint("agents", __name__)

log = logging.getLogger("bundle.workspace.agents")

# agent id (str) -> AgentConnection, in this worker process
connections: dict[str, "AgentConnection"] = {}
# The agents' connections held: those of `connections` (a connection being replaced, for a moment, too).
CONNECTED = Gauge(
    "bundle_workspace_agents_connected",
    "Agents' connections held by the workers, summed over them",
    multiprocess_mode="livesum",
)
ARRIVALS = Counter(
    "bundle_workspace_agent_arrivals_total",
    "Agents' websocket upgrades at a worker's gate, by outcome: admitted, refused (after the wait in line, "
    "with a Retry-After), gone (the agent left the line before its turn)",
    ["outcome"],
)
for _outcome in ("admitted", "refused", "gone"):  # every series from the start, at 0
    ARRIVALS.labels(_outcome)
# Set when the worker is told to stop: it still serves requests on open connections
# meanwhile, and an agent reconnecting then would hold it until gunicorn's time-out.
stopping = False


def _settings():
    return current_app.config["WORKSPACE"]


# --------------------------------------------------------------------------- tokens


def rotate_token(agent):
    """A new token for `agent`; the old one stops working and its connection closes."""
    token_id, token_hash, token = new_token()
    WorkspaceAgent.update(token_id=token_id, token_hash=token_hash).where(WorkspaceAgent.id == agent.id).execute()
    disconnect(agent.id, "the agent token was revoked")
    return token


def authenticate_agent(token):
    """The agent whose token this is, else a 401 saying why (never which part failed)."""
    if not token:
        raise Unauthenticated("You must be signed in to do this.", detail="no agent token was given")
    match = TOKEN_SHAPE.match(token)
    agent = WorkspaceAgent.get_or_none(WorkspaceAgent.token_id == match.group(1)) if match else None
    if agent is None or not secret_matches(agent.token_hash, match.group(2)):
        raise Unauthenticated("You must be signed in to do this.", detail="the agent token is not valid")
    return agent


# --------------------------------------------------------------------------- status


def status_of(agent, settings, at=None):
    at = at or now()
    if agent.first_connected_at is None:
        waited = at - agent.created_at
        return "timeout" if waited > timedelta(seconds=settings.agent_timeout_seconds) else "connecting"
    last = agent.last_connected_at or agent.first_connected_at
    if agent.disconnected_at is not None and agent.disconnected_at >= last:
        return "disconnected"
    if at - last > timedelta(seconds=3 * settings.agent_ping_seconds):
        return "disconnected"
    return "connected"


def _stamp(value):
    return value.isoformat(timespec="milliseconds") + "Z" if value else None


def public(agent, settings, workspace=None, owner_name=None):
    """The agent as the API shows it (never its token)."""
    workspace = workspace or agent.workspace
    owner_name = owner_name or workspace.owner.username
    base = f"/@{owner_name}/{workspace.name}.{agent.name}"
    apps = WorkspaceApp.select().where(WorkspaceApp.agent == agent.id).order_by(WorkspaceApp.slug)
    return {
        "id": str(agent.id),
        "name": agent.name,
        "workspace_id": str(workspace.id),
        "status": status_of(agent, settings),
        "created_at": _stamp(agent.created_at),
        "first_connected_at": _stamp(agent.first_connected_at),
        "last_connected_at": _stamp(agent.last_connected_at),
        "disconnected_at": _stamp(agent.disconnected_at),
        "connection_timeout_seconds": settings.agent_timeout_seconds,
        "terminal_url": base + "/terminal",
        "apps": [
            {
                "slug": app.slug,
                "display_name": app.display_name,
                "url": app.url,
                "sharing_level": app.sharing_level,
                "path": f"{base}/apps/{app.slug}/",
                # Its own host (WORKSPACE_WILDCARD_ACCESS_URL), where browsers should open it; else null.
                "host_url": app_hosts.app_url(settings, app.slug, agent.name, workspace.name, owner_name),
            }
            for app in apps
        ],
    }


def status_topic(owner_id):
    return f"workspace-agents:{owner_id}"


def _publish(agent_id, owner_id, status=None):
    """Tell the owner's dashboards that this agent's status changed (to `status`, if the
    caller knows it: a connection just recorded is `connected`, with no read)."""
    if status is None:
        with database.connection_context():
            agent = WorkspaceAgent.get_or_none(WorkspaceAgent.id == agent_id)
            status = status_of(agent, _settings()) if agent else "deleted"
    broker.publish(status_topic(owner_id), {"agent_id": str(agent_id), "status": status})


# --------------------------------------------------------------------------- connections


class AgentUnavailable(UpstreamFailed):
    def __init__(self, detail):
        super().__init__("The workspace agent is not connected.", detail=detail)


class AgentConnection:
    def __init__(self, agent_id, owner_id, mux):
        self.agent_id, self.owner_id, self.mux = agent_id, owner_id, mux


NOT_CONNECTED = "the agent has no open connection to the platform"


def _holder(agent_id):
    """The mesh address of the other worker holding the agent's connection; else 502."""
    address = mesh.holder(agent_id)
    if address is None or address == mesh.address:  # this worker's entry, of a connection just gone
        raise AgentUnavailable(NOT_CONNECTED)
    return address


def _unreachable(agent_id, address, exc):
    if isinstance(exc, Refused):  # a misconfigured worker (this one, perhaps) must not drop a good entry
        return AgentUnavailable(f"the worker holding the agent's connection refused this one: {exc}")
    mesh.forget(agent_id, address)
    return AgentUnavailable(f"the worker holding the agent's connection does not answer ({exc})")


# An agent whose connection ended moments ago (a restart of the platform, a network
# blip) is most likely on its way back: a request for it waits for it, polling, rather
# than failing at once. A lone agent's reconnect takes seconds; while this worker
# settles a reconnect storm (agents in line at its gate, or many admitted of late),
# the wait covers the storm: 10,000 agents are back within a minute of a restart,
# and a user's request is slow meanwhile rather than failed.
RETURN_WINDOW_SECONDS = 90.0
RETURN_WAIT_SECONDS = 5.0  # below the usual clients' 10 s time-outs
STORM_WAIT_SECONDS = 45.0  # within nginx's 60 s for an answer (proxy_read_timeout)
RETURN_POLL_SECONDS = 0.5


def _held_somewhere(agent_id):
    return str(agent_id) in connections or mesh.holder(agent_id) is not None


def _wait_if_returning(agent_id):
    """Wait (up to RETURN_WAIT_SECONDS, or STORM_WAIT_SECONDS in a storm) for an agent
    that is not connected anywhere but was connected within RETURN_WINDOW_SECONDS.
    Takes a database connection only for the one read (the callers hold none)."""
    if stopping or _held_somewhere(agent_id):  # a stopping worker's requests must not hold its exit
        return
    with connection_for_block(database):
        agent = WorkspaceAgent.get_or_none(WorkspaceAgent.id == agent_id)
    seen = agent and max(filter(None, (agent.last_connected_at, agent.disconnected_at)), default=None)
    if not seen or now() - seen > timedelta(seconds=RETURN_WINDOW_SECONDS):
        return
    deadline = time.monotonic() + (STORM_WAIT_SECONDS if arrivals.settling() else RETURN_WAIT_SECONDS)
    while time.monotonic() < deadline and not _held_somewhere(agent_id):
        gevent.sleep(RETURN_POLL_SECONDS)


def open_stream(agent_id, meta, data=b""):
    """A new stream to the agent, its first `data` sent with the OPEN, through the
    worker holding its connection (this one or another); or 502 (after a wait for an
    agent that was connected moments ago: _wait_if_returning).

    An entry naming a worker that does not answer is most often a stopped worker's (a
    restart: it writes nothing as it stops): forgotten, and the agent waited for once
    more, as one on its way back to the new workers."""
    for last_try in (False, True):
        _wait_if_returning(agent_id)
        connection = connections.get(str(agent_id))
        if connection is not None:
            try:
                return connection.mux.open(meta, data)
            except StreamClosed as exc:
                raise AgentUnavailable(f"the agent's connection is closing: {exc}") from None
        address = _holder(agent_id)
        try:
            return mesh.open(address, {"kind": "agent", "agent": str(agent_id), "meta": meta}, data)
        except Unreachable as exc:
            failure = _unreachable(agent_id, address, exc)
            if last_try or isinstance(exc, Refused):
                raise failure from None
    raise AssertionError("not reached: the last try returns or raises")


@mesh.serves("agent")
def _serve_stream_for_another_worker(link):
    """A stream to an agent held here, opened by another worker: joined to the agent's."""
    connection = connections.get(str(link.meta.get("agent")))
    if connection is None:
        link.close(NOT_CONNECTED)
        return
    meta = link.meta.get("meta")
    # What came with the OPEN goes with ours, unless a terminal was resized before
    # this ran: then the size goes first, and what was typed after it.
    resized = link.unheard_size
    try:
        stream = connection.mux.open(meta if isinstance(meta, dict) else {}, b"" if resized else link.take_buffered())
    except StreamClosed as exc:
        link.close(f"the agent's connection is closing: {exc}")
        return
    link.on_resize = stream.resize
    try:
        if resized:
            stream.resize(*resized)
        join(link, stream)
    finally:
        stream.close()


def relay_invitation(agent_id, session):
    """502 now if the agent is not connected; else a function that invites it (mux
    RELAY, with its apps) to join relay `session`, through the worker holding its
    connection, and says whether the invitation could be sent."""
    key = str(agent_id)
    address = None if key in connections else _holder(agent_id)
    with database.connection_context():
        apps = WorkspaceApp.select(WorkspaceApp.slug, WorkspaceApp.url).where(WorkspaceApp.agent == agent_id)
        info = {"session": session, "apps": [{"slug": app.slug, "url": app.url} for app in apps]}

    def invite():
        if address is None:
            return _invite_here(key, info)
        try:
            return mesh.call(address, {"kind": "invite", "agent": key, "info": info}) == b"1"
        except Unreachable:
            return False

    return invite


def _invite_here(key, info):
    connection = connections.get(key)
    return connection is not None and connection.mux.invite(info)


@mesh.serves("invite")
def _invite_for_another_worker(link):
    info = link.meta.get("info")
    mesh.answer(
        link, b"1" if _invite_here(str(link.meta.get("agent")), info if isinstance(info, dict) else {}) else b"0"
    )


def disconnect(agent_id, reason):
    """Close the agent's connection, whichever worker holds it."""
    connection = connections.get(str(agent_id))
    if connection is not None:
        connection.mux.close(reason)
        return
    try:
        address = mesh.holder(agent_id)
        if address is not None and address != mesh.address:
            mesh.call(address, {"kind": "disconnect", "agent": str(agent_id), "reason": reason})
    except Unreachable:
        pass  # a worker gone took the connection with it
    except Failure:
        # Redis is down: the token is revoked all the same, and the connection,
        # refused at its next upgrade, ends when the holder next loses it.
        log.warning("agent %s: its connection could not be closed: %s", agent_id, reason)


@mesh.serves("disconnect")
def _disconnect_for_another_worker(link):
    connection = connections.get(str(link.meta.get("agent")))
    if connection is not None:
        connection.mux.close(str(link.meta.get("reason") or "closed by the platform")[:200])
    mesh.answer(link, b"1")


def refuse_while_stopping():
    if stopping:
        raise Unavailable("The platform is stopping; connect again in a moment.", retry_after=1)


def close_all():
    global stopping
    stopping = True
    for connection in list(connections.values()):
        connection.mux.close("the platform is stopping")


lifecycle.on_stop(close_all)


def _update(agent_id, **values):
    with database.connection_context():
        WorkspaceAgent.update(**values).where(WorkspaceAgent.id == agent_id).execute()


def _record_apps(agent_id, info):
    """Apps the agent reports (`--app slug=url`): a declared app's URL follows the
    agent's; a new one is added, shared with its owner only."""
    apps = info.get("apps")
    if not isinstance(apps, list):
        return
    moved = False
    with database.connection_context():
        known = dict(
            WorkspaceApp.select(WorkspaceApp.slug, WorkspaceApp.url).where(WorkspaceApp.agent == agent_id).tuples()
        )
        for app in apps[:32]:
            slug, url = payloads.valid_app_report(app)  # the one place names and URLs are checked
            if slug is None or known.get(slug) == url:
                continue
            if slug in known:
                WorkspaceApp.update(url=url).where(
                    (WorkspaceApp.agent == agent_id) & (WorkspaceApp.slug == slug)
                ).execute()
                moved = True
            else:
                WorkspaceApp.create(agent=agent_id, slug=slug, display_name=slug, url=url)
            known[slug] = url
    if moved:
        grants.changed()  # requests kept going to the old address would reach another app


STORM_ADMISSIONS = 16  # admitted within STORM_WINDOW_SECONDS: a storm, not a lone agent's reconnect
STORM_WINDOW_SECONDS = 10.0


class _Arrivals:
    """The agents' connections this worker is setting up (from the upgrade request to
    the agent recorded as held): at most HANDSHAKES_AT_ONCE; a further one waits its
    turn (in order, costing nothing meanwhile) for up to ARRIVAL_WAIT_SECONDS, then is
    answered 503 with a Retry-After, before any database work, and its agent backs off.
    Without it, a reconnect storm (10,000 agents after a restart) ran every handshake
    at once, each slower than the agents' own time-out (10 s): each agent retried, the
    work done for it was lost, and none connected.

    The wait is long, as the agent's patience for the answer is (60 s), and longer than
    a restart's storm takes to clear: a refused agent stays away for its Retry-After
    (10-20 s) even once the line is empty, so refusals after a 5 s wait left the
    workers idle while agents slept (10,000 agents took 52 s to connect and 65 s to
    come back after a restart; 20-28 s and 36-48 s with the long wait). An arrival
    whose client left the line meanwhile (an older agent's 10 s) is dropped when its
    turn comes, before any work is done for it."""

    def __init__(self, at_once, wait):
        self._free, self._wait = BoundedSemaphore(at_once), wait
        self._admitted_at: deque[float] = deque(maxlen=STORM_ADMISSIONS)  # the latest admissions' times

    def settling(self) -> bool:
        """This worker is in a reconnect storm: every slot is taken (arrivals are in
        line), or it admitted STORM_ADMISSIONS agents within STORM_WINDOW_SECONDS."""
        latest = self._admitted_at
        return self._free.locked() or (
            len(latest) == latest.maxlen and time.monotonic() - latest[0] < STORM_WINDOW_SECONDS
        )

    def admit(self, still_there=lambda: True):
        """A release() callable (idempotent) for an admitted arrival; else Unavailable
        (refused after the wait, or `still_there()` false once its turn came)."""
        if not self._free.acquire(timeout=self._wait):
            ARRIVALS.labels("refused").inc()
            raise Unavailable("The platform is busy connecting other agents; try again in a moment.", retry_after=10)
        if not still_there():
            self._free.release()
            ARRIVALS.labels("gone").inc()
            raise Unavailable("The agent left before its turn came.", retry_after=10)
        ARRIVALS.labels("admitted").inc()
        self._admitted_at.append(time.monotonic())
        released = []

        def release():
            if not released:
                released.append(True)
                self._free.release()

        return release


HANDSHAKES_AT_ONCE = 16  # per worker: CPU-bound work, and half the database pool at most
ARRIVAL_WAIT_SECONDS = 45.0  # well within the agent's 60 s for the upgrade's answer (UPGRADE_ANSWER_S)
arrivals = _Arrivals(HANDSHAKES_AT_ONCE, ARRIVAL_WAIT_SECONDS)
# Views that take no database connection per request (app.common.db.bind_to_requests):
# the agent's websocket takes one for its reads once admitted.
NO_CONNECTION = frozenset({"agent_rpc"})


@websocket.route(bp, "/api/v2/workspaceagents/me/rpc")
def agent_rpc():
    """The agent's websocket (authenticated by its token): the one connection the platform reaches the workspace
    through."""
    release = arrivals.admit(still_there=websocket.client_still_there)
    try:
        with connection_for_block(database):  # given back before the websocket, which lasts hours
            agent = authenticate_agent(request.headers.get(HEADER))
            if not websocket.is_upgrade():
                raise Invalid("This is the agent's websocket: send a websocket upgrade request.")
            refuse_while_stopping()
            owner_id = agent.workspace.owner_id
        app = current_app._get_current_object()
        return websocket.accept_frames(
            lambda transport: _serve_agent(app, agent.id, owner_id, transport, release),
            "agent",
            max_message_size=MESSAGE_LIMIT,
        )
    finally:
        release()


def _serve_agent(app, agent_id, owner_id, transport, arrived=lambda: None):
    """The agent's connection until it ends; `arrived()` once it is set up (or refused)."""
    try:
        _hold_agent(app, agent_id, owner_id, transport, arrived)
    finally:
        arrived()


def _hold_agent(app, agent_id, owner_id, transport, arrived):
    settings = app.config["WORKSPACE"]
    key = str(agent_id)

    def hello(info):
        refused = version_mismatch(info, "agent", "platform")
        if refused is not None:
            log.warning("agent %s refused: %s", agent_id, refused)
            mux.close(refused + "; update the agent", VERSION_REFUSED)
            return
        with app.app_context():
            _record_apps(agent_id, info)
        mux.hello({"ping_seconds": settings.agent_ping_seconds, "agent_id": key})

    liveness.interval = settings.agent_ping_seconds
    mux = Mux(transport, opens=True, on_hello=hello, on_pong=lambda: liveness.answered(agent_id), tunnel=True)
    if len(connections) >= settings.agents_per_worker and key not in connections:
        # Past what this worker holds, the agents it holds and the users stay served; the
        # agent backs off and retries (here, or on a worker with room).
        log.warning("agent %s refused: this worker holds %d agents", agent_id, len(connections))
        mux.close(
            f"the platform holds its most agents ({settings.agents_per_worker} per worker); try again later",
            TRY_AGAIN_LATER,
        )
        return
    # Here before the mesh names this worker: another worker may carry a request here
    # the moment the entry is written, before this greenlet runs again.
    connection = AgentConnection(agent_id, owner_id, mux)
    previous, connections[key] = connections.get(key), connection
    try:
        holding = mesh.hold(key, on_lost=lambda: mux.close("replaced by a newer connection of the agent"))
    except Failure as exc:
        if connections.get(key) is connection:
            _put_back(key, previous)
        mux.close(exc.message, TRY_AGAIN_LATER)
        return
    if previous is not None:
        previous.mux.close("replaced by a new connection of the agent")
    with app.app_context(), CONNECTED.track_inprogress():
        _connected(agent_id, owner_id)
        arrived()
        pinger = gevent.spawn(mux.keepalive, settings.agent_ping_seconds)
        try:
            reason = mux.run()
        finally:
            pinger.kill()
            liveness.forget(agent_id)
            # A newer connection, here or on another worker, keeps the agent connected. A
            # worker that stops writes nothing: its agents come back to the next workers
            # within seconds (an agent that does not shows `disconnected` once its last
            # answered ping is three intervals old), and a stop with 10,000 agents would
            # otherwise queue 10,000 writes while new connections wait for it.
            if mesh.release(holding) and connections.get(key) is connection and not stopping:
                _update(agent_id, disconnected_at=now())
                _publish(agent_id, owner_id)
            if connections.get(key) is connection:
                del connections[key]
    log.info("agent %s disconnected: %s", agent_id, reason)


def _put_back(key, previous):
    if previous is None:
        del connections[key]
    else:
        connections[key] = previous


def _connected(agent_id, owner_id):
    at = now()
    # One statement: a status read never sees a first connection without a last one.
    with database.connection_context():
        WorkspaceAgent.update(
            first_connected_at=fn.COALESCE(WorkspaceAgent.first_connected_at, at), last_connected_at=at
        ).where(WorkspaceAgent.id == agent_id).execute()
    _publish(agent_id, owner_id, "connected")
    log.info("agent %s connected", agent_id)
