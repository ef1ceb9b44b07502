"""The workspace platform behind real nginx: no login gate, websocket upgrades on
every path, identity headers cleared."""
import socket

import requests

from tests.proxy.conftest import EchoServer
from tests.workspace.conftest import Workspace


def test_no_gate_json_clients_get_json_not_a_redirect(start_service, nginx_for):
    ws = Workspace(start_service("workspace"))
    proxy = nginx_for(ws.service)
    for path in ("/api/v2/users/me", "/api/v2/workspaceagents/me/rpc", "/@owner/ws.main/apps/code/"):
        response = requests.get(proxy.url + path, headers=proxy.headers("workspace"), allow_redirects=False,
                                timeout=10)
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
                client.sendall((f"GET {path} HTTP/1.1\r\nHost: {proxy.host('workspace')}\r\nUpgrade: websocket\r\n"
                                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                                "Sec-WebSocket-Version: 13\r\nRemote-User: admin\r\n\r\n").encode())
                client.recv(65536)
        for request in backend.seen:
            headers = {k.lower(): v for k, v in request["headers"]}
            assert headers["upgrade"] == "websocket" and headers["connection"].lower() == "upgrade"
            assert "remote-user" not in headers
        assert [r["path"] for r in backend.seen] == ["/api/v2/workspaceagents/me/rpc", "/@owner/ws.main/terminal",
                                                      "/anything"]
        plain = requests.get(proxy.url + "/api/v2/users/me", headers=proxy.headers("workspace"), timeout=10)
        assert plain.status_code == 200
        headers = {k.lower(): v for k, v in backend.seen[-1]["headers"]}
        assert "upgrade" not in headers and "connection" not in headers  # keepalive to the backend
    finally:
        backend.stop()
