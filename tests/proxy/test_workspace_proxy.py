"""The workspace platform behind real nginx: no login gate, websocket upgrades on
every path, identity headers cleared."""

import hashlib
import json
import os
import re
import shutil
import socket
import time
import uuid

import pytest
import requests
from simple_websocket import Client
from simple_websocket import ConnectionError as HandshakeRefused

from devtools import nginx as nginx_tool
from devtools.waiting import wait_for
from tests.support.proxy import EchoServer
from tests.support.workspace import AGENT_ENV, TOKEN_HEADER, Workspace, create_workspace, wait_status


def test_no_gate_json_clients_get_json_not_a_redirect(start_service, nginx_for):
    ws = Workspace(start_service("workspace"))
    proxy = nginx_for(ws.service)
    for path in ("/api/v2/users/me", "/api/v2/workspaceagents/me/rpc", "/@owner/ws.main/apps/code/"):
        response = requests.get(proxy.url + path, headers=proxy.headers("workspace"), allow_redirects=False, timeout=10)
        assert response.status_code in (401, 404), (path, response.status_code)
        assert "Location" not in response.headers
        assert response.headers["Content-Type"].startswith("application/json")
    info = requests.get(proxy.url + "/api/v2/buildinfo", headers=proxy.headers("workspace"), timeout=10)
    assert info.status_code == 200 and info.json()["version"]


def test_upgrades_pass_on_every_path_and_identity_headers_do_not(nginx_for):
    backend = EchoServer("workspace")
    try:
        proxy = nginx_for(backend)
        for path in ("/api/v2/workspaceagents/me/rpc", "/@owner/ws.main/terminal", "/anything"):
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
                client.sendall(
                    (
                        f"GET {path} HTTP/1.1\r\nHost: {proxy.host('workspace')}\r\nUpgrade: websocket\r\n"
                        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                        "Sec-WebSocket-Version: 13\r\nRemote-User: admin\r\n\r\n"
                    ).encode()
                )
                client.recv(65536)
        for request in backend.seen:
            headers = {k.lower(): v for k, v in request["headers"]}
            assert headers["upgrade"] == "websocket" and headers["connection"].lower() == "upgrade"
            assert "remote-user" not in headers
        assert [r["path"] for r in backend.seen] == [
            "/api/v2/workspaceagents/me/rpc",
            "/@owner/ws.main/terminal",
            "/anything",
        ]
        plain = requests.get(proxy.url + "/api/v2/users/me", headers=proxy.headers("workspace"), timeout=10)
        assert plain.status_code == 200
        headers = {k.lower(): v for k, v in backend.seen[-1]["headers"]}
        assert "upgrade" not in headers and "connection" not in headers  # keepalive to the backend
    finally:
        backend.stop()


# --------------------------------------------------------------------------- agents, apps and terminals through nginx


def _platform_with_agent_behind(nginx_for, start_service, start_agent, local_app):
    """A platform behind nginx (the site named 127.0.0.1, so that plain URLs reach it),
    a workspace with an app, and its agent connected through nginx."""
    ws = Workspace(start_service("workspace", env=AGENT_ENV))
    proxy = nginx_for(ws.service, hosts={"workspace": "127.0.0.1"})
    owner = ws.first_user()
    agent = create_workspace(ws, owner, "dev", [{"name": "main", "apps": [{"slug": "app", "url": local_app.url}]}])[
        "agents"
    ][0]
    start_agent(proxy.url, agent["token"])
    wait_status(ws, owner, agent["id"], "connected")
    return ws, proxy, owner, agent


def _echo_through(base_url, owner):
    client = Client.connect(
        base_url.replace("http://", "ws://") + "/@owner/dev.main/apps/app/ws", headers={TOKEN_HEADER: owner}
    )
    try:
        client.send("through nginx")
        return client.receive(timeout=10)
    finally:
        client.close()


def test_agent_app_websocket_terminal_and_upload_pass_through_nginx(nginx_for, start_service, start_agent, local_app):
    ws, proxy, owner, agent = _platform_with_agent_behind(nginx_for, start_service, start_agent, local_app)
    assert _echo_through(proxy.url, owner) == "through nginx"
    body = os.urandom(5 * 1024 * 1024)
    upload = requests.post(
        proxy.url + "/@owner/dev.main/apps/app/upload", data=body, headers={TOKEN_HEADER: owner}, timeout=30
    )
    assert upload.json() == {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    terminal = Client.connect(
        proxy.url.replace("http://", "ws://") + f"/api/v2/workspaceagents/{agent['id']}/pty?reconnect={uuid.uuid4()}",
        headers={TOKEN_HEADER: owner},
    )
    try:
        terminal.send(json.dumps({"data": "echo via-$((40+2))\r"}))
        seen, deadline = b"", time.monotonic() + 15
        while b"via-42" not in seen and time.monotonic() < deadline:
            seen += terminal.receive(timeout=1) or b""
        assert b"via-42" in seen
    finally:
        terminal.close()


def test_without_the_upgrade_headers_in_the_site_websockets_fail(
    nginx_for, start_service, start_agent, local_app, tmp_path, monkeypatch
):
    ws, proxy, owner, agent = _platform_with_agent_behind(nginx_for, start_service, start_agent, local_app)
    assert _echo_through(proxy.url, owner) == "through nginx"  # the real template passes upgrades

    broken = tmp_path / "nginx-templates"
    shutil.copytree(nginx_tool.TEMPLATES, broken)
    site = broken / "sites" / "workspace.conf.j2"
    lines = site.read_text().splitlines(keepends=True)
    kept = [line for line in lines if not re.match(r"\s*proxy_set_header (Upgrade|Connection) ", line)]
    assert len(lines) - len(kept) == 2, "the site template no longer sets Upgrade and Connection"
    site.write_text("".join(kept))
    monkeypatch.setattr(nginx_tool, "TEMPLATES", broken)
    without = nginx_for(ws.service, hosts={"workspace": "127.0.0.1"})

    with pytest.raises(HandshakeRefused):
        _echo_through(without.url, owner)
    with pytest.raises(HandshakeRefused) as refused:
        Client.connect(
            without.url.replace("http://", "ws://") + "/api/v2/workspaceagents/me/rpc",
            headers={TOKEN_HEADER: agent["token"]},
        )
    assert refused.value.status_code == 400  # the agent would never connect through this proxy


def test_the_access_log_holds_no_query_string(nginx_for):
    """A websocket upgrade may carry the session token in its query (browsers cannot set
    headers there), and the app-host handshake a one-time ticket: neither reaches the log."""
    backend = EchoServer("workspace")
    try:
        proxy = nginx_for(backend)
        secret = uuid.uuid4().hex
        for path in (f"/api/v2/users/me?workspace_session_token={secret}", f"/hello/?workspace_app_ticket={secret}"):
            requests.get(proxy.url + path, headers=proxy.headers("workspace"), timeout=10)
        wait_for(lambda: proxy.access_log.read_text().count('"GET /') >= 2, "both requests logged", timeout=30)
        logged = proxy.access_log.read_text()
        assert '"GET /api/v2/users/me HTTP/1.1" 200' in logged and '"GET /hello/ HTTP/1.1"' in logged, logged
        assert secret not in logged and "workspace_session_token" not in logged
    finally:
        backend.stop()
