"""The platform's own metrics on `/metrics`, summed over two workers (REDIS_URL, the
mesh between them): connected agents, open websockets by kind, the tunnel's bytes by
direction, and the requests carried between the workers."""

import json
import os
import uuid

import pytest
import redis

from devtools.waiting import wait_for
from tests.support.metrics import scrape
from tests.support.workspace import (
    AGENT_ENV,
    MESH_ENV,
    TOKEN_HEADER,
    AgentProcess,
    Workspace,
    connect_to_worker,
    create_workspace,
    http_on,
    wait_status,
    websocket_on,
)

APP = "/@owner/dev.main/apps/echo"
OPEN = "bundle_websockets_open"
TUNNEL = "bundle_workspace_tunnel_bytes_total"
SENT = "bundle_workspace_mesh_requests_sent_total"
SERVED = "bundle_workspace_mesh_requests_served_total"
REQUESTS = "bundle_http_requests_total"
DURATION = "bundle_http_request_duration_seconds_count"
APP_PATH = "/@<user>/<target>/apps/<slug>/<path:path>"
PTY = "/api/v2/workspaceagents/<agent_id>/pty"


@pytest.fixture
def platform(start_service, redis_server, local_app, tmp_path):
    """Two workers on one SQLite file and Redis, an owner, workspace `dev` with agent
    `main` (app `echo`); the agent not started yet."""
    service = start_service("workspace", workers=2, env={"REDIS_URL": redis_server.new_url(), **MESH_ENV, **AGENT_ENV})
    ws = Workspace(service)
    ws.owner = ws.first_user()
    agent = create_workspace(ws, ws.owner, "dev", [{"name": "main", "apps": [{"slug": "echo", "url": local_app.url}]}])
    ws.agent_id, ws.agent_token = agent["agents"][0]["id"], agent["agents"][0]["token"]
    wait_for(lambda: len(service.worker_pids()) == 2, "two workers")
    return ws


def open_websockets(metrics):
    return {kind: metrics.value(OPEN, service="workspace", kind=kind) for kind in ("agent", "terminal", "relay", "app")}


def test_agents_websockets_tunnel_bytes_and_mesh_requests(platform, tmp_path):
    ws, service = platform, platform.service
    headers = {TOKEN_HEADER: ws.owner}
    idle = scrape(service)
    assert idle.value("bundle_workspace_agents_connected") == 0
    assert open_websockets(idle) == {"agent": 0, "terminal": 0, "relay": 0, "app": 0}

    agent = AgentProcess(tmp_path, ws.url, ws.agent_token)
    try:
        wait_status(ws, ws.owner, ws.agent_id, "connected")
        connected = scrape(service)
        assert connected.value("bundle_workspace_agents_connected") == 1
        assert open_websockets(connected)["agent"] == 1

        # Everything below goes through the worker that does not hold the agent: over the mesh.
        holder = wait_for(lambda: holder_pid(ws), "the agent's holder in Redis")
        other = next(pid for pid in service.worker_pids() if pid != holder)
        sock = connect_to_worker(service, other)
        try:
            upload = os.urandom(300_000)
            assert http_on(sock, "POST", APP + "/upload", headers, upload)[0] == 200
            status, body = http_on(sock, "GET", APP + "/bytes?count=500000", headers)
            assert status == 200 and len(body) == 500_000
        finally:
            sock.close()
        echo = websocket_on(connect_to_worker(service, other), APP + "/ws", headers)
        terminal = websocket_on(
            connect_to_worker(service, other),
            f"/api/v2/workspaceagents/{ws.agent_id}/pty?reconnect={uuid.uuid4()}",
            headers,
        )
        try:
            echo.send("through the mesh")
            assert echo.receive() == "through the mesh"
            terminal.send(json.dumps({"data": "echo marker-$((6*7))\r"}))
            seen = b""
            while b"marker-42" not in seen:
                seen += bytes(terminal.receive())
            busy = scrape(service)
            assert open_websockets(busy) == {"agent": 1, "terminal": 1, "relay": 0, "app": 1}
        finally:
            echo.close()
            terminal.close()
        wait_for(lambda: open_websockets(scrape(service)) == {"agent": 1, "terminal": 0, "relay": 0, "app": 0})
        # The app's GET (answered by the apps front, before Flask) is counted and timed;
        # each websocket is counted as a 101, never timed: its 101 ends when the socket does.
        counted = wait_for(lambda: ended_websockets(m := scrape(service), idle) == 2 and m, "two 101s")
        assert moved(counted, idle, REQUESTS, method="GET", route=APP_PATH, status="2xx") == 1
        assert moved(counted, idle, REQUESTS, method="GET", route=APP_PATH, status="1xx") == 1
        assert moved(counted, idle, DURATION, method="GET", route=APP_PATH) == 1
        assert moved(counted, idle, REQUESTS, route=PTY, status="1xx") == 1
        assert moved(counted, idle, DURATION, route=PTY) == 0

        after = scrape(service)
        assert after.value(TUNNEL, direction="to_agent") >= 300_000
        assert after.value(TUNNEL, direction="from_agent") >= 500_000
        # The upload, the download, the app's websocket and the terminal: four streams at least.
        assert after.value(SENT, kind="agent", outcome="ok") >= 4
        assert after.value(SENT, kind="agent", outcome="unreachable") == 0
        wait_for(lambda: scrape(service).value(SERVED, kind="agent", outcome="ok") >= 2, "ended streams served")
    finally:
        agent.stop()
    wait_status(ws, ws.owner, ws.agent_id, "disconnected")
    gone = wait_for(lambda: (m := scrape(service)).value("bundle_workspace_agents_connected") == 0 and m, "no agent")
    assert open_websockets(gone)["agent"] == 0


def ended_websockets(after, before):
    return moved(after, before, REQUESTS, route=PTY, status="1xx") + moved(
        after, before, REQUESTS, route=APP_PATH, status="1xx"
    )


def moved(after, before, name, **labels):
    return (after.value(name, **labels) or 0) - (before.value(name, **labels) or 0)


def holder_pid(ws):
    """The pid of the worker holding the agent's connection (its unix mesh address names it)."""
    value = redis.Redis.from_url(ws.service.env["REDIS_URL"]).get(f"bundle:workspace:agent:{ws.agent_id}")
    return int(value.decode().split(" ")[0].split("-")[3]) if value else None
