"""The workspace platform's test helpers: the running platform with its calls
(`Workspace`), workspaces and their agents (`create_workspace`, `wait_status`,
`AgentProcess`), and the setting the `connected` fixture builds (`Connected`)."""

import base64
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from devtools.database_peek import peek
from devtools.worker_sockets import worker_holding
from tests.support.shared import ROOT

OWNER = {"email": "owner@example.com", "username": "owner", "password": "correct horse battery"}
TOKEN_HEADER = "Workspace-Session-Token"
# With REDIS_URL the platform's workers sign their mesh with this (WORKSPACE_MESH_SECRET).
MESH_ENV = {"WORKSPACE_MESH_SECRET": "the workers' test mesh secret"}


class Workspace:
    def __init__(self, service):
        self.service = service
        self.url = service.base_url
        self.api = service.base_url + "/api/v2"

    def db(self):
        """The service's database, on either engine (devtools.database_peek)."""
        return peek(self.service)

    def count(self, table):
        with self.db() as db:
            return db.execute(f'select count(*) from "{table}"').fetchone()[0]

    def first_user(self, **overrides):
        response = requests.post(self.api + "/users/first", json={**OWNER, **overrides}, timeout=30)
        assert response.status_code == 201, response.text
        return response.json()["session_token"]

    def as_user(self, token):
        return {TOKEN_HEADER: token}

    def login(self, email, password):
        return requests.post(self.api + "/users/login", json={"email": email, "password": password}, timeout=30)


# --------------------------------------------------------------------------- workspaces and agents

AGENT_ENV = {"WORKSPACE_AGENT_PING_SECONDS": "1"}  # fast pings: a lost agent shows within seconds
# The platform's host behind the tests' nginx, and the suffix of its workspace apps' hosts.
PLATFORM_HOST = "workspace.localhost"
APPS_SUFFIX = ".apps.localhost"


def platform_behind_nginx(start_service, nginx_folder, env=None, wildcard=True):
    """(Workspace, nginx, port): the platform behind a real nginx at
    http://workspace.localhost:port, and the app hosts *.apps.localhost:port when
    `wildcard`; `start_service` is the tests' start_service or start_module_service."""
    from devtools import nginx, services

    with services.held_port() as port:  # until nginx takes it: the platform's settings name it
        settings = {**AGENT_ENV, "WORKSPACE_ACCESS_URL": f"http://{PLATFORM_HOST}:{port}", **(env or {})}
        if wildcard:
            settings["WORKSPACE_WILDCARD_ACCESS_URL"] = f"*{APPS_SUFFIX}:{port}"
        ws = Workspace(start_service("workspace", env=settings))
    proxy = nginx.start(
        nginx_folder,
        port,
        upstreams={"workspace": f"127.0.0.1:{ws.service.port}"},
        hosts={"workspace": PLATFORM_HOST},
        variables={"workspace_apps_host": f"*{APPS_SUFFIX}"} if wildcard else {},
    )
    return ws, proxy, port


def create_workspace(ws, token, name, agents, user="me"):
    """POST a workspace; returns its JSON (with each agent's token)."""
    response = requests.post(
        f"{ws.api}/users/{user}/workspaces",
        json={"name": name, "agents": agents},
        headers=ws.as_user(token),
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return response.json()


def agent_status(ws, token, agent_id):
    response = requests.get(f"{ws.api}/workspaceagents/{agent_id}", headers=ws.as_user(token), timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["status"]


def wait_status(ws, token, agent_id, wanted, timeout=30.0):
    """Poll the agent's status until it is `wanted` (a deadline, not a bare sleep)."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = agent_status(ws, token, agent_id)
        if seen == wanted:
            return
        time.sleep(0.1)
    raise AssertionError(f"agent {agent_id} is {seen!r}, not {wanted!r}, after {timeout} s")


# What a workspace has: Debian's python3 and nothing installed into it (this
# machine's, else the one running the tests).
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def agent_program():
    """The agent's zipapp, as the platform hands it out (app/workspace/routes/agent_files.py),
    written once to a file named by its digest: [python, -I, file]."""
    from app.workspace.routes.agent_files import agent_file

    built = agent_file()
    path = Path(tempfile.gettempdir()) / f"workspace-agent-{built.sha256[:16]}.pyz"
    if not path.exists():
        partial = path.with_suffix(f".{os.getpid()}")
        partial.write_bytes(built.data)
        partial.replace(path)
    return [SYSTEM_PYTHON, "-I", str(path)]


class AgentProcess:
    """The agent program (the platform's zipapp on the system python) as a subprocess,
    its log in a file."""

    def __init__(self, tmp_path, url, token, apps=(), extra=()):
        self.log_path = tmp_path / f"agent-{time.monotonic_ns()}.log"
        env = {**os.environ, "WORKSPACE_AGENT_TOKEN": token, "SHELL": "/bin/sh"}
        command = [*agent_program(), "agent", "--url", url, *extra]
        for slug, app_url in apps:
            command += ["--app", f"{slug}={app_url}"]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)

    def log(self):
        return self.log_path.read_text(errors="replace")

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Connected:
    """A platform with an owner, a second user, a workspace `dev` with agent `main`
    (apps: `echo` for the owner, `shared` for anyone signed in) and its agent running."""


# --------------------------------------------------------------------------- one chosen worker


def connect_to_worker(service, pid, timeout=30.0):
    """A keep-alive connection to `service` that its worker `pid` holds: connections
    are opened (each answering one GET /healthz) until the kernel hands one to it."""
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.create_connection(("127.0.0.1", service.port), timeout=30)
        status, _ = http_on(sock, "GET", "/healthz")
        if status == 200 and worker_holding(service, sock.getsockname()[1]) == pid:
            return sock
        sock.close()
        assert time.monotonic() < deadline, f"no connection reached worker {pid} in {timeout} s"


def http_on(sock, method, path, headers=None, body=b"", host="127.0.0.1"):
    """One HTTP/1.1 request on a kept-alive connection: (status, body)."""
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {host}",
        f"Content-Length: {len(body)}",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    response = http.client.HTTPResponse(sock, method=method)
    response.begin()
    return response.status, response.read()


def websocket_on(sock, path, headers=None, host="127.0.0.1"):
    """Upgrade a kept-alive connection (a TLS one too) to a websocket: a client FrameTransport."""
    from app.workspace.transport.websocket import FrameTransport
    from workspace_protocol.websocket import accept_value

    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *(f"{name}: {value}" for name, value in (headers or {}).items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = sock.recv(65536)
        assert data, f"the connection closed during the upgrade: {answer!r}"
        answer += data
    head, rest = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 101 ") and accept_value(key).encode() in head, head
    sock.settimeout(30)  # a receive that waits longer fails the test rather than hanging it
    return FrameTransport(sock, client=True, buffered=rest)


def run_cli(ws, *args, stdin=""):
    """`python -m app.workspace <args>` on the host of `ws` (its data folder and environment)."""
    return subprocess.run(
        [sys.executable, "-m", "app.workspace", *args],
        cwd=ROOT,
        input=stdin,
        text=True,
        capture_output=True,
        timeout=60,
        env={"DATA_DIR": str(ws.service.data_dir), "PATH": "/usr/bin:/bin", **getattr(ws.service, "env", {})},
    )


# Cross-site request tests: the platform's public address behind https, its session
# cookie's name there, and what browsers send from another site or from its own pages.
CSRF_ACCESS_URL = "https://workspace.example.org"
CSRF_COOKIE = "__Host-workspace_session_token"  # the session cookie's name behind https
CSRF_CROSS_SITE = [
    {"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"},
    {"Sec-Fetch-Site": "same-site", "Origin": "https://app.example.org"},  # a sibling host
    {"Origin": "https://evil.example"},  # a browser without Fetch Metadata
    {"Origin": "null"},
]  # a sandboxed page
CSRF_SAME_ORIGIN = [
    {"Sec-Fetch-Site": "same-origin", "Origin": CSRF_ACCESS_URL},
    {"Origin": CSRF_ACCESS_URL},
    {"Origin": CSRF_ACCESS_URL + ":443"},
    {},
]
