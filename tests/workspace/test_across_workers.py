"""Agents on any worker: with REDIS_URL the platform runs several workers, and a
request for an agent that reaches a worker not holding the agent's connection is
carried to the one that does, over the workers' mesh (app/workspace/transport/mesh.py)."""

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import threading
import uuid

import pytest
import redis
import requests
from simple_websocket import ConnectionClosed

from devtools.waiting import wait_for
from devtools.worker_sockets import socket_inodes, tcp_sockets
from tests.support.shared import ROOT, serving_pid
from tests.support.workspace import (
    AGENT_ENV,
    MESH_ENV,
    OWNER,
    TOKEN_HEADER,
    AgentProcess,
    Workspace,
    agent_program,
    connect_to_worker,
    create_workspace,
    http_on,
    wait_status,
    websocket_on,
)

WORKERS = 4
APP = "/@owner/dev.main/apps/echo"


class Platform:
    """Four workers on PostgreSQL and Redis, an owner, workspace `dev` with agent
    `main` (app `echo`), its agent running."""

    def headers(self):
        return {TOKEN_HEADER: self.owner}

    def holder(self):
        """The mesh address that Redis names for the agent's connection, or None."""
        value = redis.Redis.from_url(self.service.env["REDIS_URL"]).get(f"bundle:workspace:agent:{self.agent_id}")
        return value.decode().split(" ")[0] if value else None

    def holder_pid(self):
        """The pid of the worker holding the agent (its unix mesh address names it)."""
        address = self.holder()
        return int(address.split("-")[3]) if address and address.startswith("unix:@") else None

    def others(self):
        return [pid for pid in self.service.worker_pids() if pid != self.holder_pid()]

    def start_agent(self, url):
        self.agent_process = AgentProcess(self.tmp, url, self.token)


@pytest.fixture(scope="module")
def platform(start_module_service, postgres_server, redis_server, local_app, tmp_path_factory):
    setup = Platform()
    setup.tmp = tmp_path_factory.mktemp("agent")
    setup.service = start_module_service(
        "workspace",
        workers=WORKERS,
        env={
            "DATABASE_URL": postgres_server.new_database(),
            "REDIS_URL": redis_server.new_url(),
            **MESH_ENV,
            **AGENT_ENV,
        },
    )
    setup.ws = Workspace(setup.service)
    setup.owner = setup.ws.first_user()
    agent = create_workspace(
        setup.ws, setup.owner, "dev", [{"name": "main", "apps": [{"slug": "echo", "url": local_app.url}]}]
    )["agents"][0]
    setup.agent_id, setup.token = agent["id"], agent["token"]
    setup.start_agent(setup.ws.url)
    wait_status(setup.ws, setup.owner, setup.agent_id, "connected")
    wait_for(lambda: len(setup.service.worker_pids()) == WORKERS, f"{WORKERS} workers")
    yield setup
    setup.agent_process.stop()


def _serves_everything(platform, pid):
    """The app (a GET, a 3 MB upload, a 5 MB download) and the agent's status, on a
    connection that worker `pid` holds."""
    sock = connect_to_worker(platform.service, pid)
    try:
        assert http_on(sock, "GET", APP + "/hello", platform.headers()) == (200, b"hello from the app\n")
        body = os.urandom(3 << 20)
        status, answer = http_on(sock, "POST", APP + "/upload", platform.headers(), body)
        assert status == 200 and json.loads(answer) == {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        status, answer = http_on(sock, "GET", APP + f"/bytes?count={5 << 20}", platform.headers())
        assert status == 200 and len(answer) == 5 << 20
        status, answer = http_on(sock, "GET", f"/api/v2/workspaceagents/{platform.agent_id}", platform.headers())
        assert status == 200 and json.loads(answer)["status"] == "connected"
    finally:
        sock.close()


def test_every_worker_serves_the_agent_it_does_not_hold(platform):
    holder = platform.holder_pid()
    assert holder in platform.service.worker_pids(), platform.holder()
    for pid in platform.service.worker_pids():
        _serves_everything(platform, pid)


def test_a_token_revoked_on_one_worker_is_refused_by_every_worker_at_once(platform):
    """Each worker keeps the grant of a token it checked (app/workspace/access/grants.py);
    signing out through one worker drops it on all of them, through Redis."""
    token = platform.ws.login(OWNER["email"], OWNER["password"]).json()["session_token"]
    socks = [connect_to_worker(platform.service, pid) for pid in platform.service.worker_pids()]
    try:
        for sock in socks:
            assert http_on(sock, "GET", APP + "/hello", {TOKEN_HEADER: token})[0] == 200
        assert http_on(socks[0], "POST", "/api/v2/users/logout", {TOKEN_HEADER: token})[0] < 300
        for sock in socks:
            status, answer = http_on(sock, "GET", APP + "/hello", {TOKEN_HEADER: token})
            assert status == 401 and "revoked" in json.loads(answer)["detail"]
    finally:
        for sock in socks:
            sock.close()


def test_websockets_and_the_terminal_reach_the_agent_from_another_worker(platform):
    other = platform.others()[0]
    echo = websocket_on(connect_to_worker(platform.service, other), APP + "/ws", platform.headers())
    try:
        for message in ("across the workers", b"\x00\x01 binary too"):
            echo.send(message)
            received = echo.receive()
            assert (received if isinstance(received, str) else bytes(received)) == message
    finally:
        echo.close()
    terminal = websocket_on(
        connect_to_worker(platform.service, other),
        f"/api/v2/workspaceagents/{platform.agent_id}/pty?reconnect={uuid.uuid4()}",
        platform.headers(),
    )
    try:
        terminal.send(json.dumps({"height": 33, "width": 101}))  # a resize crosses the mesh too
        terminal.send(json.dumps({"data": "stty size; echo marker-$((6*7))\r"}))
        seen = b""
        while b"marker-42" not in seen:
            seen += bytes(terminal.receive())
        assert b"33 101" in seen, seen
    finally:
        terminal.close()


def _relay(platform, pid, role, session, token):
    return websocket_on(
        connect_to_worker(platform.service, pid),
        f"/relay?agent={platform.agent_id}&role={role}&session={session}",
        {TOKEN_HEADER: token},
    )


def test_a_relay_pairs_peers_that_reached_different_workers(platform):
    first, second, third = platform.service.worker_pids()[:3]
    session = uuid.uuid4()
    agent_side = _relay(platform, first, "agent", session, platform.token)  # waits: no invitation needed
    client = _relay(platform, second, "client", session, platform.owner)
    try:
        client.send(b"\x05 from the client")
        assert bytes(agent_side.receive()) == b"\x05 from the client"
        agent_side.send("from the agent side")
        assert client.receive() == "from the agent side"
        sock = connect_to_worker(platform.service, third)
        status, answer = http_on(
            sock,
            "GET",
            f"/relay?agent={platform.agent_id}&role=client&session={session}",
            {TOKEN_HEADER: platform.owner},
        )
        assert status == 409 and "already has its client" in json.loads(answer)["message"]
        sock.close()
    finally:
        client.close(1000, "done")
    with pytest.raises(ConnectionClosed):
        while True:
            agent_side.receive()


def test_the_relay_client_reaches_the_agent_whichever_workers_it_and_the_agent_reach(platform):
    # The client's worker invites the agent through its holder; the agent dials in
    # wherever the kernel puts it. Three sessions: most cross workers both ways.
    for _ in range(3):
        done = subprocess.run(
            [
                *agent_program(),
                "relay",
                "--url",
                platform.ws.url,
                "--agent",
                platform.agent_id,
                "app",
                "echo",
                "/hello",
            ],
            cwd=ROOT,
            env={**os.environ, "WORKSPACE_SESSION_TOKEN": platform.owner},
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0 and done.stdout == b"hello from the app\n", done.stderr.decode()


def test_a_killed_holder_s_agent_comes_back_on_a_live_worker(platform):
    holder = platform.holder_pid()
    watch, statuses = _watch_on_another_worker(platform, holder)
    try:
        wait_for(lambda: statuses == ["connected"], "the dashboard's snapshot")
        os.kill(holder, signal.SIGKILL)
        wait_for(
            lambda: (
                platform.holder_pid() not in (None, holder) and platform.holder_pid() in platform.service.worker_pids()
            ),
            "the agent's entry on a live worker",
            timeout=30,
        )
        # The dashboard, on a worker that neither held the agent nor holds it now,
        # hears the new holder say so.
        wait_for(lambda: statuses[1:] == ["connected"], "the reconnection on the dashboard", timeout=30)
    finally:
        # Shut down first: a close alone waits for the reader's next record (a keepalive, 25 s on).
        with contextlib.suppress(OSError, AttributeError):
            watch.raw.connection.sock.shutdown(socket.SHUT_RDWR)
        watch.close()
    wait_for(lambda: len(platform.service.worker_pids()) == WORKERS, f"{WORKERS} workers again")
    for pid in platform.service.worker_pids():
        _serves_everything(platform, pid)


def test_a_request_that_finds_a_dead_holder_s_entry_waits_for_the_agent_on_a_new_worker(platform):
    """A restart's stopped workers leave their agents' entries behind (a stopping worker
    writes nothing): a request reaching a new worker first finds the old holder's."""
    wait_for(lambda: platform.holder_pid() in platform.service.worker_pids(), "the agent on a live worker", timeout=30)
    holder, before = platform.holder_pid(), set(platform.service.worker_pids())
    agent = platform.agent_process.process.pid
    os.kill(agent, signal.SIGSTOP)  # it cannot come back before the request finds the entry
    answers = []
    try:
        os.kill(holder, signal.SIGKILL)
        wait_for(lambda: set(platform.service.worker_pids()) - before, "the killed worker's replacement", timeout=60)
        (young,) = set(platform.service.worker_pids()) - before
        assert platform.holder_pid() == holder  # the dead worker's entry is still there
        sock = connect_to_worker(platform.service, young)
        asking = threading.Thread(
            target=lambda: answers.append(http_on(sock, "GET", APP + "/hello", platform.headers()))
        )
        asking.start()
        wait_for(lambda: platform.holder() is None, "the dead holder's entry forgotten by the request", timeout=30)
    finally:
        os.kill(agent, signal.SIGCONT)  # it sees its connection ended, and comes back
    asking.join(60)
    sock.close()
    assert answers == [(200, b"hello from the app\n")]
    wait_for(lambda: len(platform.service.worker_pids()) == WORKERS, f"{WORKERS} workers again")
    for pid in platform.service.worker_pids():
        _serves_everything(platform, pid)


def _watch_on_another_worker(platform, holder):
    """The owner's dashboard watch (SSE) on a worker other than `holder`: the response,
    and the list its reader fills with the agent's statuses as they arrive."""
    while True:  # a connection of its own each time, until one lands elsewhere
        response = requests.get(
            platform.ws.api + "/users/me/workspaces/watch", headers=platform.headers(), stream=True, timeout=60
        )
        if serving_pid(platform.service, response) != holder:
            break
        response.close()
    statuses = []

    def read():
        with contextlib.suppress(requests.RequestException, AttributeError, ValueError):
            for line in response.iter_lines(chunk_size=None):  # each record as it arrives
                if line.startswith(b"data: ") and json.loads(line[6:])["agent_id"] == platform.agent_id:
                    statuses.append(json.loads(line[6:])["status"])

    threading.Thread(target=read, daemon=True).start()
    return response, statuses


def test_a_holder_that_stops_answering_loses_its_agent_to_a_live_worker(platform):
    # SIGSTOP: the worker's sockets stay open and say nothing, as a host powered off.
    holder = platform.holder_pid()
    others = [pid for pid in platform.service.worker_pids() if pid != holder]
    os.kill(holder, signal.SIGSTOP)
    try:
        wait_for(lambda: platform.holder_pid() in others, "the agent reconnected to a live worker", timeout=30)
        for pid in others:
            _serves_everything(platform, pid)
    finally:
        os.kill(holder, signal.SIGCONT)
    # The old holder, back, lets its stale connection go without marking the agent
    # disconnected. Its record of the connection went with it (released before the
    # socket closes), so no later refresh of its can take the entry back.
    wait_for(
        lambda: not _accepted_connections(platform.service, holder),
        "the old holder's stale connection closed",
        timeout=30,
    )
    assert platform.holder_pid() in others
    for pid in platform.service.worker_pids():
        _serves_everything(platform, pid)


def _accepted_connections(service, pid):
    """The client ports of the connections to the service that worker `pid` holds."""
    inodes = socket_inodes(pid)
    return [
        sock.remote_port
        for sock in tcp_sockets()
        if sock.local_port == service.port and sock.remote_port and sock.inode in inodes
    ]


def test_an_agent_on_another_host_is_reached_there_and_a_wrong_secret_is_refused(platform, start_service):
    # Another "host": a platform of its own on the same database and Redis, its mesh on TCP.
    other_host = start_service("workspace", env={**platform.service.env, "WORKSPACE_MESH_ADDRESS": "127.0.0.1"})
    platform.agent_process.stop()
    platform.start_agent(other_host.base_url)
    wait_for(lambda: (platform.holder() or "").startswith("tcp:127.0.0.1:"), "the agent's entry on the other host")
    for pid in platform.service.worker_pids():
        sock = connect_to_worker(platform.service, pid)
        assert http_on(sock, "GET", APP + "/hello", platform.headers()) == (200, b"hello from the app\n")
        sock.close()
    stranger = start_service("workspace", env={**platform.service.env, "WORKSPACE_MESH_SECRET": "not the same secret"})
    response = requests.get(stranger.base_url + APP + "/hello", headers=platform.headers(), timeout=30)
    assert response.status_code == 502, response.text
    assert "WORKSPACE_MESH_SECRET" in response.json()["detail"]
