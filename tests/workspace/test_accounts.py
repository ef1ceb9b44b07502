"""Accounts, in process: the first Owner, later accounts, and bad input."""
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from app.workspace import VERSION
from tests.support.workspace import OWNER

pytestmark = pytest.mark.in_process


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
    again = requests.post(ws.api + "/users/first", json={**OWNER, "username": "other", "email": "o@example.com"},
                          timeout=30)
    assert again.status_code == 409
    assert ws.count("user") == 1


def test_concurrent_first_user_requests_create_exactly_one_owner(workspace):
    ws = workspace()
    barrier = threading.Barrier(20)

    def claim(n):
        barrier.wait()
        return requests.post(ws.api + "/users/first", json={"email": f"u{n}@example.com", "username": f"user{n}",
                                                            "password": "correct horse battery"}, timeout=60)

    with ThreadPoolExecutor(20) as pool:
        statuses = sorted(r.status_code for r in pool.map(claim, range(20)))
    assert statuses == [201] + [409] * 19
    assert ws.count("user") == 1 and ws.count("membership") == 1


def test_secure_cookie_when_the_access_url_is_https(workspace):
    ws = workspace({"WORKSPACE_ACCESS_URL": "https://workspace.example.org"})
    created = requests.post(ws.api + "/users/first", json=OWNER, timeout=30)
    assert "Secure" in created.headers["Set-Cookie"]
    assert requests.get(ws.api + "/buildinfo", timeout=10).json()["dashboard_url"] == "https://workspace.example.org/"


def test_administrators_create_accounts(owned):
    ws, owner = owned
    body = {"email": "ana@example.com", "username": "ana", "password": "a long passphrase", "name": "Ana"}
    assert requests.post(ws.api + "/users", json=body, timeout=10).status_code == 401
    created = requests.post(ws.api + "/users", json=body, headers=ws.as_user(owner), timeout=30)
    assert created.status_code == 201, created.text
    assert created.json()["username"] == "ana" and created.json()["roles"] == []
    member = ws.login("ana@example.com", "a long passphrase").json()["session_token"]
    forbidden = requests.post(ws.api + "/users", json={**body, "username": "x", "email": "x@example.com"},
                              headers=ws.as_user(member), timeout=10)
    assert forbidden.status_code == 403 and forbidden.json()["message"] == "Only an administrator can create accounts."
    sso = requests.post(ws.api + "/users", json={"email": "sso@example.com", "username": "sso", "login_type": "oidc"},
                        headers=ws.as_user(owner), timeout=10)
    assert sso.status_code == 201 and sso.json()["login_type"] == "oidc"


@pytest.mark.parametrize("body,status,field", [
    ({"email": "ANA@example.com", "username": "other", "password": "a long passphrase"}, 409, "email"),
    ({"email": "new@example.com", "username": "ANA", "password": "a long passphrase"}, 409, "username"),
    ({"email": "new@example.com", "username": "new", "password": "short"}, 400, "password"),
    ({"email": "new@example.com", "username": "new", "password": "1234567890"}, 400, "password"),
    ({"email": "new@example.com", "username": "new", "password": "aaaabbbbaaaa"}, 400, "password"),
    ({"email": "new@example.com", "username": "new", "password": "Password1"}, 400, "password"),
    ({"email": "new@example.com", "username": "new", "password": "my-new-secret"}, 400, "password"),
    ({"email": "new@example.com", "username": "new", "password": "x" * 257}, 400, "password"),
    ({"email": "new@example.com", "username": "new"}, 400, "password"),
    ({"email": "new@example.com", "username": "new", "password": "a long passphrase", "login_type": "x"}, 400,
     "login_type"),
    ({"email": "new@example.com", "username": "new", "login_type": "oidc", "password": "a long passphrase"}, 400,
     "password"),
    ({"email": "not-an-email", "username": "new", "password": "a long passphrase"}, 400, "email"),
    ({"email": "a@b.co" + "m" * 260, "username": "new", "password": "a long passphrase"}, 400, "email"),
    ({"email": "new@example.com", "username": "-bad", "password": "a long passphrase"}, 400, "username"),
    ({"email": "new@example.com", "username": "x" * 33, "password": "a long passphrase"}, 400, "username"),
    ({"email": "new@example.com", "username": "has space", "password": "a long passphrase"}, 400, "username"),
    ({"email": "new@example.com", "username": 5, "password": "a long passphrase"}, 400, "username"),
    ({"email": "new@example.com", "username": "new", "password": "a long passphrase", "name": "n" * 129}, 400, "name"),
    ({"email": "new@example.com", "username": "new", "password": "a long passphrase", "admin": True}, 400, "admin"),
])
def test_bad_accounts_are_refused_and_change_nothing(owned, body, status, field):
    ws, owner = owned
    requests.post(ws.api + "/users", json={"email": "ana@example.com", "username": "ana",
                                           "password": "a long passphrase"}, headers=ws.as_user(owner), timeout=30)
    users = ws.count("user")
    response = requests.post(ws.api + "/users", json=body, headers=ws.as_user(owner), timeout=30)
    assert response.status_code == status, response.text
    fields = [v["field"] for v in response.json().get("validations", [])]
    assert field in fields, response.json()
    assert ws.count("user") == users


def test_malformed_bodies(owned):
    ws, owner = owned
    headers = {**ws.as_user(owner), "Content-Type": "application/json"}
    for data in (b"{", b"[]", b"\xff", b'"x"'):
        response = requests.post(ws.api + "/users", data=data, headers=headers, timeout=10)
        assert response.status_code == 400 and "message" in response.json()
    assert requests.post(ws.api + "/users", data="x", headers=ws.as_user(owner), timeout=10).status_code == 415
    big = requests.post(ws.api + "/users", data=b'{"name": "' + b"x" * 70000 + b'"}', headers=headers, timeout=10)
    assert big.status_code == 413
    missing = requests.post(ws.api + "/users/first", json={}, timeout=10)
    assert missing.status_code in (400, 409)


def test_public_routes(owned):
    ws, _ = owned
    info = requests.get(ws.api + "/buildinfo", timeout=10).json()
    assert info["version"] == VERSION and info["dashboard_url"].endswith("/")
    assert requests.get(ws.api + "/users/authmethods", timeout=10).json() == {
        "password": {"enabled": True}, "oidc": {"enabled": False, "signInText": "OpenID Connect", "iconUrl": ""}}
    missing = requests.get(ws.api + "/nope", timeout=10)
    assert missing.status_code == 404 and missing.json() == {"message": "not found: /api/v2/nope"}
