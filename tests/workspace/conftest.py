"""Fixtures of the workspace platform's tests: the service under gunicorn on a
fresh database, and helpers to call it."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from devtools.database_peek import peek

ROOT = Path(__file__).resolve().parents[2]
OWNER = {"email": "owner@example.com", "username": "owner", "password": "correct horse battery"}
TOKEN_HEADER = "Workspace-Session-Token"


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


@pytest.fixture
def workspace(start_service, db_backend):
    """start(env=None) -> Workspace: a platform of the test's own, on each database
    backend in turn."""
    def start(env=None, **kwargs):
        return Workspace(start_service("workspace", env={**db_backend.env(), **(env or {})}, **kwargs))
    return start


@pytest.fixture(scope="module")
def owned(start_module_service, db_backend):
    """One platform per module with its Owner created: (workspace, owner token)."""
    ws = Workspace(start_module_service("workspace", env=db_backend.env()))
    return ws, ws.first_user()


# --------------------------------------------------------------------------- workspaces and agents

AGENT_ENV = {"WORKSPACE_AGENT_PING_SECONDS": "1"}  # fast pings: a lost agent shows within seconds


def create_workspace(ws, token, name, agents, user="me"):
    """POST a workspace; returns its JSON (with each agent's token)."""
    response = requests.post(f"{ws.api}/users/{user}/workspaces", json={"name": name, "agents": agents},
                             headers=ws.as_user(token), timeout=10)
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


class AgentProcess:
    """`python -m app.workspace.agent` as a subprocess (its log in a file)."""

    def __init__(self, tmp_path, url, token, apps=(), extra=()):
        self.log_path = tmp_path / f"agent-{time.monotonic_ns()}.log"
        env = {**os.environ, "WORKSPACE_AGENT_TOKEN": token, "SHELL": "/bin/sh"}
        command = [sys.executable, "-m", "app.workspace.agent", "--url", url, *extra]
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


@pytest.fixture
def start_agent(tmp_path):
    """start_agent(url, token, apps=()) -> AgentProcess; all stopped at teardown."""
    started = []

    def start(url, token, apps=(), extra=()):
        agent = AgentProcess(tmp_path, url, token, apps, extra)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()


@pytest.fixture(scope="module")
def local_app():
    from tests.workspace.local_app import LocalApp
    app = LocalApp()
    yield app
    app.stop()


class Connected:
    """A platform with an owner, a second user, a workspace `dev` with agent `main`
    (apps: `echo` for the owner, `shared` for anyone signed in) and its agent running."""


@pytest.fixture(scope="module")
def connected(start_module_service, local_app, tmp_path_factory, db_backend):
    setup = Connected()
    setup.ws = ws = Workspace(start_module_service("workspace", env={**AGENT_ENV, **db_backend.env()}))
    setup.owner = ws.first_user()
    requests.post(ws.api + "/users", json={"email": "other@example.com", "username": "other",
                                           "password": "second good passphrase"},
                  headers=ws.as_user(setup.owner), timeout=10).raise_for_status()
    setup.other = ws.login("other@example.com", "second good passphrase").json()["session_token"]
    setup.workspace = create_workspace(ws, setup.owner, "dev", [
        {"name": "main", "apps": [{"slug": "echo", "url": local_app.url},
                                  {"slug": "shared", "url": local_app.url, "sharing_level": "authenticated"}]}])
    setup.agent = setup.workspace["agents"][0]
    setup.agent_process = AgentProcess(tmp_path_factory.mktemp("agent"), ws.url, setup.agent["token"])
    try:
        wait_status(ws, setup.owner, setup.agent["id"], "connected")
    except AssertionError as exc:
        setup.agent_process.stop()
        raise AssertionError(setup.agent_process.log()) from exc
    setup.app_url = f"{ws.url}/@owner/dev.main/apps/echo"
    yield setup
    setup.agent_process.stop()
