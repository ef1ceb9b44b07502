"""Fixtures of the workspace platform's tests: the service under gunicorn on a
fresh database, and helpers to call it."""
import sqlite3

import pytest
import requests

OWNER = {"email": "owner@example.com", "username": "owner", "password": "correct horse battery"}
TOKEN_HEADER = "Workspace-Session-Token"


class Workspace:
    def __init__(self, service):
        self.service = service
        self.url = service.base_url
        self.api = service.base_url + "/api/v2"

    def db(self):
        return sqlite3.connect(self.service.data_dir / "workspace.db")

    def count(self, table):
        with self.db() as db:
            return db.execute(f"select count(*) from {table}").fetchone()[0]

    def first_user(self, **overrides):
        response = requests.post(self.api + "/users/first", json={**OWNER, **overrides}, timeout=30)
        assert response.status_code == 201, response.text
        return response.json()["session_token"]

    def as_user(self, token):
        return {TOKEN_HEADER: token}

    def login(self, email, password):
        return requests.post(self.api + "/users/login", json={"email": email, "password": password}, timeout=30)


@pytest.fixture
def workspace(start_service):
    """start(env=None) -> Workspace: a platform of the test's own."""
    def start(env=None, **kwargs):
        return Workspace(start_service("workspace", env=env, **kwargs))
    return start


@pytest.fixture(scope="module")
def owned(start_module_service):
    """One platform per module with its Owner created: (workspace, owner token)."""
    ws = Workspace(start_module_service("workspace"))
    return ws, ws.first_user()
