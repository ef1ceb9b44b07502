"""The agent connection: status transitions, pings, replacement, revocation, and an
agent that reconnects by itself after its own restart and the platform's."""

import json
import os
import signal
import socket
import threading
import time

import pytest
import requests
from simple_websocket import Client, ConnectionClosed
from simple_websocket import ConnectionError as HandshakeRefused

from devtools.services import free_port
from tests.support.workspace import AGENT_ENV, TOKEN_HEADER, Workspace, agent_status, create_workspace, wait_status
from workspace_protocol.mux import HEADER, HELLO, OUTDATED_EXIT, TRY_AGAIN_LATER, VERSION, VERSION_REFUSED
from workspace_protocol.websocket import OP_CLOSE, Close, FrameReader, accept_value, frame_head


def _rpc_url(ws):
    return ws.url.replace("http://", "ws://") + "/api/v2/workspaceagents/me/rpc"


def test_connecting_connected_disconnected_and_missed_pings(workspace, start_agent):
    ws = workspace(AGENT_ENV)
    owner = ws.first_user()
    agent = create_workspace(ws, owner, "dev", [{"name": "main"}])["agents"][0]
    assert agent_status(ws, owner, agent["id"]) == "connecting"
    process = start_agent(ws.url, agent["token"])
    wait_status(ws, owner, agent["id"], "connected")
    shown = requests.get(f"{ws.api}/workspaceagents/{agent['id']}", headers=ws.as_user(owner), timeout=10).json()
    assert shown["first_connected_at"] and shown["last_connected_at"]
    # A hung agent answers no pings: after two, the platform closes it.
    os.kill(process.process.pid, signal.SIGSTOP)
    try:
        wait_status(ws, owner, agent["id"], "disconnected", timeout=20)
    finally:
        os.kill(process.process.pid, signal.SIGCONT)
    wait_status(ws, owner, agent["id"], "connected")  # it notices and reconnects by itself
    process.stop()
    wait_status(ws, owner, agent["id"], "disconnected", timeout=10)


def test_answered_pings_are_written_for_all_agents_of_a_worker_at_once(workspace, start_agent):
    ws = workspace(AGENT_ENV)
    owner = ws.first_user()
    agents = create_workspace(ws, owner, "dev", [{"name": "one"}, {"name": "two"}])["agents"]
    for agent in agents:
        start_agent(ws.url, agent["token"])
        wait_status(ws, owner, agent["id"], "connected")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # polling with a deadline
        shown = [
            requests.get(f"{ws.api}/workspaceagents/{agent['id']}", headers=ws.as_user(owner), timeout=10).json()
            for agent in agents
        ]
        stamps = {agent["last_connected_at"] for agent in shown}
        # Connected apart, pinged apart: one stamp for both is one batch's (its earliest answer).
        if len(stamps) == 1 and all(agent["last_connected_at"] > agent["first_connected_at"] for agent in shown):
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"the agents' answered pings were not written in one batch: {shown}")
    assert all(agent["status"] == "connected" for agent in shown)


def _connected_agent_with_app(ws, start_agent, local_app):
    """The platform's owner, a workspace `dev` whose agent `main` serves app `app` (the local
    app), and that agent's process, started and seen `connected`."""
    owner = ws.first_user()
    workspace = create_workspace(ws, owner, "dev", [{"name": "main", "apps": [{"slug": "app", "url": local_app.url}]}])
    agent = workspace["agents"][0]
    process = start_agent(ws.url, agent["token"])
    wait_status(ws, owner, agent["id"], "connected")
    return owner, agent, process


def test_a_request_for_an_agent_that_just_lost_its_connection_waits_for_it_to_come_back(
    workspace, start_agent, local_app
):
    ws = workspace(AGENT_ENV)
    owner, agent, process = _connected_agent_with_app(ws, start_agent, local_app)
    os.kill(process.process.pid, signal.SIGSTOP)  # a hung agent: the platform closes it after two pings
    answers = []
    try:
        wait_status(ws, owner, agent["id"], "disconnected", timeout=20)
        asking = threading.Thread(
            target=lambda: answers.append(
                requests.get(f"{ws.url}/@owner/dev.main/apps/app/hello", headers=ws.as_user(owner), timeout=30)
            )
        )
        asking.start()
    finally:
        os.kill(process.process.pid, signal.SIGCONT)  # it notices and reconnects at once
    asking.join(30)
    assert answers and answers[0].status_code == 200 and answers[0].text == "hello from the app\n"


def test_an_agent_that_never_connects_times_out(workspace):
    ws = workspace({"WORKSPACE_AGENT_CONNECTION_TIMEOUT": "1"})
    owner = ws.first_user()
    agent = create_workspace(ws, owner, "dev", [{"name": "main"}])["agents"][0]
    wait_status(ws, owner, agent["id"], "timeout", timeout=10)


def test_agent_restart_and_platform_restart(start_service, start_agent, tmp_path, local_app):
    port, data_dir = free_port(), tmp_path / "platform"
    ws = Workspace(start_service("workspace", data_dir=data_dir, port=port, env=AGENT_ENV))
    owner, agent, first = _connected_agent_with_app(ws, start_agent, local_app)
    first.stop()
    wait_status(ws, owner, agent["id"], "disconnected")
    start_agent(ws.url, agent["token"])
    wait_status(ws, owner, agent["id"], "connected")
    left = requests.get(f"{ws.api}/workspaceagents/{agent['id']}", headers=ws.as_user(owner), timeout=10).json()

    took = ws.service.stop()
    assert took < 10, f"the platform took {took:.1f} s to stop with an agent connected"
    ws = Workspace(start_service("workspace", data_dir=data_dir, port=port, env=AGENT_ENV))
    wait_status(ws, owner, agent["id"], "connected", timeout=30)
    # A stopping platform writes no disconnection: its agents come back to the next one.
    back = requests.get(f"{ws.api}/workspaceagents/{agent['id']}", headers=ws.as_user(owner), timeout=10).json()
    assert back["disconnected_at"] == left["disconnected_at"] is not None  # the agent's own stop's, earlier
    response = requests.get(f"{ws.url}/@owner/dev.main/apps/app/hello", headers=ws.as_user(owner), timeout=10)
    assert response.status_code == 200 and response.text == "hello from the app\n"


def test_revoked_token_is_refused_before_the_upgrade_and_its_connection_closed(workspace, start_agent, local_app):
    ws = workspace(AGENT_ENV)
    owner, agent, process = _connected_agent_with_app(ws, start_agent, local_app)
    rotated = requests.post(f"{ws.api}/workspaceagents/{agent['id']}/token", headers=ws.as_user(owner), timeout=10)
    assert rotated.status_code == 201 and rotated.json()["token"] != agent["token"]
    wait_status(ws, owner, agent["id"], "disconnected", timeout=10)
    with pytest.raises(HandshakeRefused) as refused:
        Client.connect(_rpc_url(ws), headers={TOKEN_HEADER: agent["token"]})
    assert refused.value.status_code == 401
    plain = requests.get(
        ws.api + "/workspaceagents/me/rpc",
        headers={
            TOKEN_HEADER: agent["token"],
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        },
        timeout=10,
    )
    assert plain.status_code == 401 and plain.json() == {
        "message": "You must be signed in to do this.",
        "detail": "the agent token is not valid",
    }
    assert "HTTP 401" in process.log() or agent_status(ws, owner, agent["id"]) == "disconnected"
    assert agent["token"] not in process.log()

    machine = requests.get(f"{ws.url}/@owner/dev.main/apps/app/hello", headers=ws.as_user(owner), timeout=10)
    assert machine.status_code == 502 and machine.json()["message"] == "The workspace agent is not connected."
    browser = requests.get(
        f"{ws.url}/@owner/dev.main/apps/app/hello", timeout=10, headers={**ws.as_user(owner), "Accept": "text/html"}
    )
    assert browser.status_code == 502 and "The workspace agent is not connected." in browser.text
    assert browser.headers["Content-Type"].startswith("text/html")


def test_a_reconnecting_agent_replaces_its_old_connection(workspace):
    ws = workspace(AGENT_ENV)
    owner = ws.first_user()
    agent = create_workspace(ws, owner, "dev", [{"name": "main"}])["agents"][0]
    old = Client.connect(_rpc_url(ws), headers={TOKEN_HEADER: agent["token"]})
    new = Client.connect(_rpc_url(ws), headers={TOKEN_HEADER: agent["token"]})
    try:
        with pytest.raises(ConnectionClosed):
            while True:  # the old one may see pings first, then its close
                old.receive(timeout=10)
        assert isinstance(new.receive(timeout=10), bytes)  # still served: a ping
        assert agent_status(ws, owner, agent["id"]) == "connected"
    finally:
        new.close()


def test_past_its_most_agents_a_worker_refuses_new_ones_and_keeps_serving_those_it_holds(workspace):
    ws = workspace({**AGENT_ENV, "WORKSPACE_AGENTS_PER_WORKER": "1"})
    owner = ws.first_user()
    held, extra = create_workspace(ws, owner, "dev", [{"name": "one"}, {"name": "two"}])["agents"]
    first = Client.connect(_rpc_url(ws), headers={TOKEN_HEADER: held["token"]})
    try:
        assert isinstance(first.receive(timeout=10), bytes)  # a ping: the worker holds it
        assert _close_after_upgrade(ws, extra["token"]) == (
            TRY_AGAIN_LATER,
            "the platform holds its most agents (1 per worker); try again later",
        )
        assert isinstance(first.receive(timeout=10), bytes)  # still served
        assert agent_status(ws, owner, held["id"]) == "connected"
        assert agent_status(ws, owner, extra["id"]) == "connecting"
    finally:
        first.close()
    wait_status(ws, owner, held["id"], "disconnected")
    again = Client.connect(_rpc_url(ws), headers={TOKEN_HEADER: extra["token"]})  # room again: its retry is held
    try:
        assert isinstance(again.receive(timeout=10), bytes)
        wait_status(ws, owner, extra["id"], "connected")
    finally:
        again.close()


def _close_after_upgrade(ws, token):
    """The close frame's code and reason that the platform sends an agent right after its
    upgrade, read off a raw socket (simple-websocket's client drops frames that come in
    the same read as the 101)."""
    host, port = ws.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"GET /api/v2/workspaceagents/me/rpc HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n%s: %s\r\n\r\n" % (host.encode(), TOKEN_HEADER.encode(), token.encode())
        )
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    head, _, frames = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    reader = FrameReader(expects_mask=False)
    reader.feed(frames)
    while (event := reader.next_event()) is not None:
        if isinstance(event, Close):
            return event.code, event.reason
    raise AssertionError(f"no close frame in {frames!r}")


def test_dashboard_lists_agents_and_streams_their_status(workspace, start_agent):
    ws = workspace(AGENT_ENV)
    owner = ws.first_user()
    agent = create_workspace(ws, owner, "dev", [{"name": "main"}])["agents"][0]
    page = requests.get(ws.url + "/", cookies={"workspace_session_token": owner}, timeout=10)
    assert page.status_code == 200 and f'data-agent-id="{agent["id"]}"' in page.text and "connecting" in page.text
    with requests.get(
        ws.api + "/users/me/workspaces/watch", headers=ws.as_user(owner), stream=True, timeout=20
    ) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        lines = stream.iter_lines()
        statuses = []
        process = None
        for line in lines:
            if not line.startswith(b"data: "):
                continue
            statuses.append(json.loads(line[6:])["status"])
            if statuses == ["connecting"]:
                process = start_agent(ws.url, agent["token"])
            if statuses[-1] == "connected":
                break
        assert statuses == ["connecting", "connected"] and process is not None


def test_an_agent_of_another_protocol_version_is_refused_with_the_reason(workspace):
    ws = workspace(AGENT_ENV)
    owner = ws.first_user()
    agent = create_workspace(ws, owner, "dev", [{"name": "main"}])["agents"][0]
    client = Client.connect(_rpc_url(ws), headers={TOKEN_HEADER: agent["token"]})
    client.send(HEADER.pack(HELLO, 0) + json.dumps({"version": VERSION - 1, "apps": []}).encode())
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(20):  # a ping may come first
            client.receive(timeout=10)
    assert closed.value.reason == VERSION_REFUSED
    assert closed.value.message == (
        f"the agent speaks protocol version {VERSION - 1}, the platform version {VERSION}; update the agent"
    )


class RefusingPlatform:
    """A stand-in platform (a thread) that accepts the agent's websocket, reads its
    HELLO and closes with `code` and `reason` without answering it (as a platform of
    another protocol version does, or one whose Redis is down); it records when each
    connection came. `with_the_answer`: the close goes in the same write as the 101,
    before any HELLO (as the platform closes when it cannot record the agent)."""

    def __init__(self, code, reason, with_the_answer=False):
        self.code, self.reason, self.with_the_answer = code, reason, with_the_answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.arrivals = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with sock:
                self.arrivals.append(time.monotonic())
                self._refuse(sock)

    def _refuse(self, sock):
        sock.settimeout(10)
        if self.code < 1000:  # an HTTP status (not a close code): a busy platform's answer to the upgrade
            sock.recv(65536)
            sock.sendall(b"HTTP/1.1 %d Busy\r\nRetry-After: %s\r\nContent-Length: 0\r\n\r\n" % (self.code, self.reason))
            return
        try:
            head = b""
            while b"\r\n\r\n" not in head:
                data = sock.recv(65536)
                if not data:
                    return
                head += data
            key = next(
                line.split(b":", 1)[1].strip().decode()
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-key:")
            )
            answer = (
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Accept: " + accept_value(key).encode() + b"\r\n\r\n"
            )
            body = self.code.to_bytes(2, "big") + self.reason.encode()
            if self.with_the_answer:
                sock.sendall(answer + frame_head(OP_CLOSE, len(body)) + body)
                sock.recv(65536)
                return
            sock.sendall(answer)
            if sock.recv(65536):  # the HELLO (its frame's bytes are not looked at)
                sock.sendall(frame_head(OP_CLOSE, len(body)) + body)
        except OSError:
            return

    def stop(self):
        self.listener.close()

    def arrivals_of(self, start_agent, count):
        """The times of the first `count` connections of an agent started against it, and the agent."""
        try:
            process = start_agent(self.url, "token-of-a-refused-agent")
            deadline = time.monotonic() + 30
            while len(self.arrivals) < count and time.monotonic() < deadline:
                time.sleep(0.05)  # polling with a deadline
            assert len(self.arrivals) >= count, process.log()
        finally:
            self.stop()
        return self.arrivals[:count], process


@pytest.mark.parametrize("with_the_answer", [False, True])
def test_an_agent_the_platform_does_not_accept_logs_the_reason_and_retries_with_backoff(start_agent, with_the_answer):
    arrivals, process = RefusingPlatform(1013, "Redis is not answering", with_the_answer).arrivals_of(start_agent, 4)
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:])]
    # 0.25..0.5 s, 0.5..1 s, 1..2 s: a refusal does not reset the backoff.
    assert gaps[2] >= 0.9 and gaps[2] > gaps[0], gaps
    assert "the platform cannot hold this agent now (Redis is not answering); retrying" in process.log()


def test_an_agent_a_busy_platform_refuses_waits_at_least_its_retry_after(start_agent):
    # Retry-After: 2, far above the first backoff steps (0.25 to 1 s).
    arrivals, process = RefusingPlatform(503, b"2").arrivals_of(start_agent, 3)
    assert all(later - earlier >= 2 for earlier, later in zip(arrivals, arrivals[1:])), arrivals
    assert "the platform refused the connection (HTTP 503)" in process.log()


def test_an_agent_of_another_protocol_version_exits_for_its_init_script_to_replace_it(start_agent):
    reason = "the agent speaks protocol version 2, the platform version 99; update the agent"
    platform = RefusingPlatform(VERSION_REFUSED, reason)
    try:
        process = start_agent(platform.url, "token-of-an-outdated-agent")
        assert process.process.wait(30) == OUTDATED_EXIT, process.log()
    finally:
        platform.stop()
    assert len(platform.arrivals) == 1
    assert f"{reason}: this agent is out of date" in process.log()


def test_a_burst_of_status_streams_all_open_and_take_the_database_only_for_their_reads(start_service, redis_server):
    """A reconnect storm of dashboards on one worker whose streams subscribe through
    Redis: more status streams opened at once than the pool holds connections (SQLite:
    64) all open with their snapshot; each took a connection for its reads only, never
    while it waited on Redis (no checkout found the pool empty), and holds none while it
    streams; a request is served meanwhile."""
    from tests.support.metrics import scrape
    from tests.support.stream_burst import streams_opened_at_once
    from tests.support.workspace import MESH_ENV

    burst = 150
    ws = Workspace(start_service("workspace", env={**MESH_ENV, "REDIS_URL": redis_server.new_url()}))
    owner = ws.first_user()
    agent = create_workspace(ws, owner, "dev", [{"name": "main"}])["agents"][0]
    snapshot = json.dumps({"agent_id": agent["id"], "status": "connecting"}, separators=(",", ":")).encode()
    with streams_opened_at_once(
        ws.service.port, "/api/v2/users/me/workspaces/watch", lambda i: ws.as_user(owner), burst
    ) as streams:
        assert [stream.status_line() for stream in streams] == ["HTTP/1.1 200 OK"] * burst
        for stream in streams:
            stream.read_until(snapshot)
        assert agent_status(ws, owner, agent["id"]) == "connecting"
        samples = scrape(ws.service)
        assert samples.value("bundle_sse_streams_open") == burst
        assert samples.value("bundle_db_pool_connections_in_use") == 0
        assert not samples.value("bundle_db_pool_waits_total")
