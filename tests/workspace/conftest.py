"""Fixtures of the workspace platform's tests: the service under gunicorn on a
fresh database; the helpers that call it live in tests.support.workspace."""

import pytest
import requests

from tests.support.workspace import AGENT_ENV, AgentProcess, Connected, Workspace, create_workspace, wait_status


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


@pytest.fixture(scope="module")
def connected(start_module_service, local_app, tmp_path_factory, db_backend):
    setup = Connected()
    setup.ws = ws = Workspace(start_module_service("workspace", env={**AGENT_ENV, **db_backend.env()}))
    setup.owner = ws.first_user()
    requests.post(
        ws.api + "/users",
        json={"email": "other@example.com", "username": "other", "password": "second good passphrase"},
        headers=ws.as_user(setup.owner),
        timeout=10,
    ).raise_for_status()
    setup.other = ws.login("other@example.com", "second good passphrase").json()["session_token"]
    setup.workspace = create_workspace(
        ws,
        setup.owner,
        "dev",
        [
            {
                "name": "main",
                "apps": [
                    {"slug": "echo", "url": local_app.url},
                    {"slug": "shared", "url": local_app.url, "sharing_level": "authenticated"},
                ],
            }
        ],
    )
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
