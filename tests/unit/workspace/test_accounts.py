"""Accounts, in process: the first Owner, later accounts, and bad input."""

import pytest
import requests

from app.workspace.settings import VERSION


def test_administrators_create_accounts(owned):
    ws, owner = owned
    body = {"email": "ana@example.com", "username": "ana", "password": "a long passphrase", "name": "Ana"}
    assert requests.post(ws.api + "/users", json=body, timeout=10).status_code == 401
    created = requests.post(ws.api + "/users", json=body, headers=ws.as_user(owner), timeout=30)
    assert created.status_code == 201, created.text
    assert created.json()["username"] == "ana" and created.json()["roles"] == []
    member = ws.login("ana@example.com", "a long passphrase").json()["session_token"]
    forbidden = requests.post(
        ws.api + "/users",
        json={**body, "username": "x", "email": "x@example.com"},
        headers=ws.as_user(member),
        timeout=10,
    )
    assert forbidden.status_code == 403 and forbidden.json()["message"] == "Only an administrator can create accounts."
    sso = requests.post(
        ws.api + "/users",
        json={"email": "sso@example.com", "username": "sso", "login_type": "oidc"},
        headers=ws.as_user(owner),
        timeout=10,
    )
    assert sso.status_code == 201 and sso.json()["login_type"] == "oidc"


@pytest.mark.parametrize(
    "body,status,field",
    [
        ({"email": "ANA@example.com", "username": "other", "password": "a long passphrase"}, 409, "email"),
        ({"email": "new@example.com", "username": "ANA", "password": "a long passphrase"}, 409, "username"),
        ({"email": "new@example.com", "username": "new", "password": "short"}, 400, "password"),
        ({"email": "new@example.com", "username": "new", "password": "1234567890"}, 400, "password"),
        ({"email": "new@example.com", "username": "new", "password": "aaaabbbbaaaa"}, 400, "password"),
        ({"email": "new@example.com", "username": "new", "password": "Password1"}, 400, "password"),
        ({"email": "new@example.com", "username": "new", "password": "my-new-secret"}, 400, "password"),
        ({"email": "new@example.com", "username": "new", "password": "x" * 257}, 400, "password"),
        ({"email": "new@example.com", "username": "new"}, 400, "password"),
        (
            {"email": "new@example.com", "username": "new", "password": "a long passphrase", "login_type": "x"},
            400,
            "login_type",
        ),
        (
            {"email": "new@example.com", "username": "new", "login_type": "oidc", "password": "a long passphrase"},
            400,
            "password",
        ),
        ({"email": "not-an-email", "username": "new", "password": "a long passphrase"}, 400, "email"),
        ({"email": "a@b.co" + "m" * 260, "username": "new", "password": "a long passphrase"}, 400, "email"),
        ({"email": "new@example.com", "username": "-bad", "password": "a long passphrase"}, 400, "username"),
        ({"email": "new@example.com", "username": "x" * 33, "password": "a long passphrase"}, 400, "username"),
        ({"email": "new@example.com", "username": "has space", "password": "a long passphrase"}, 400, "username"),
        ({"email": "new@example.com", "username": 5, "password": "a long passphrase"}, 400, "username"),
        (
            {"email": "new@example.com", "username": "new", "password": "a long passphrase", "name": "n" * 129},
            400,
            "name",
        ),
        ({"email": "new@example.com", "username": "new", "password": "a long passphrase", "admin": True}, 400, "admin"),
    ],
)
def test_bad_accounts_are_refused_and_change_nothing(owned, body, status, field):
    ws, owner = owned
    requests.post(
        ws.api + "/users",
        json={"email": "ana@example.com", "username": "ana", "password": "a long passphrase"},
        headers=ws.as_user(owner),
        timeout=30,
    )
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
        "password": {"enabled": True},
        "oidc": {"enabled": False, "signInText": "OpenID Connect", "iconUrl": ""},
    }
    missing = requests.get(ws.api + "/nope", timeout=10)
    assert missing.status_code == 404 and missing.json() == {"message": "not found: /api/v2/nope"}
