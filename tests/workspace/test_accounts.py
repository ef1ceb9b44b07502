"""The first user of a platform of the test's own under gunicorn: created once, even when
requested at once, with a secure cookie behind https. The accounts' route logic in
process is tests/unit/workspace/test_accounts.py."""

import threading
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.support.workspace import OWNER


def test_first_user_once_with_a_session_and_its_cookie(workspace):
    ws = workspace()
    before = requests.get(ws.api + "/users/first", timeout=10)
    assert before.status_code == 404 and before.json() == {"message": "The initial user has not been created."}
    created = requests.post(ws.api + "/users/first", json={**OWNER, "name": "The Owner"}, timeout=30)
    assert created.status_code == 201
    body = created.json()
    assert set(body) == {"user_id", "organization_id", "session_token"}
    cookie = created.headers["Set-Cookie"]
    assert cookie.startswith(f"workspace_session_token={body['session_token']};")
    assert "HttpOnly" in cookie and "Path=/" in cookie and "SameSite=Lax" in cookie
    assert "Domain" not in cookie and "Secure" not in cookie  # host-scoped; http access URL
    assert requests.get(ws.api + "/users/first", timeout=10).status_code == 200
    me = requests.get(ws.api + "/users/me", headers=ws.as_user(body["session_token"]), timeout=10).json()
    assert me["roles"] == ["owner"] and me["organization_ids"] == [body["organization_id"]]
    assert me["name"] == "The Owner" and me["login_type"] == "password" and me["status"] == "active"
    again = requests.post(
        ws.api + "/users/first", json={**OWNER, "username": "other", "email": "o@example.com"}, timeout=30
    )
    assert again.status_code == 409
    assert ws.count("user") == 1


def test_concurrent_first_user_requests_create_exactly_one_owner(workspace):
    ws = workspace()
    barrier = threading.Barrier(20)

    def claim(n):
        barrier.wait()
        return requests.post(
            ws.api + "/users/first",
            json={"email": f"u{n}@example.com", "username": f"user{n}", "password": "correct horse battery"},
            timeout=60,
        )

    with ThreadPoolExecutor(20) as pool:
        statuses = sorted(r.status_code for r in pool.map(claim, range(20)))
    assert statuses == [201] + [409] * 19
    assert ws.count("user") == 1 and ws.count("membership") == 1


def test_secure_cookie_when_the_access_url_is_https(workspace):
    ws = workspace({"WORKSPACE_ACCESS_URL": "https://workspace.example.org"})
    created = requests.post(ws.api + "/users/first", json=OWNER, timeout=30)
    assert "Secure" in created.headers["Set-Cookie"]
    assert requests.get(ws.api + "/buildinfo", timeout=10).json()["dashboard_url"] == "https://workspace.example.org/"
