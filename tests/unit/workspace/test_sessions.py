"""Session credentials: where they are read, their shape, lifetime, login and logout."""

import time
from datetime import datetime, timedelta

import requests

from tests.support.workspace import OWNER


def test_token_from_header_or_cookie_in_that_order_and_never_the_query_string(owned):
    ws, owner = owned
    me = ws.api + "/users/me"
    assert requests.get(me, headers=ws.as_user(owner), timeout=10).status_code == 200
    assert requests.get(me, cookies={"workspace_session_token": owner}, timeout=10).status_code == 200
    # Only a websocket upgrade may carry it in the URL (test_terminal.py): elsewhere a
    # token in a URL ends up in access logs, histories and Referer headers.
    in_query = requests.get(me, params={"workspace_session_token": owner}, timeout=10)
    assert in_query.status_code == 401 and in_query.json()["detail"] == "no session token was given"
    bad = "AAAAAAAAAA-BBBBBBBBBBBBBBBBBBBBBB"
    header_wins = requests.get(me, headers=ws.as_user(bad), cookies={"workspace_session_token": owner}, timeout=10)
    assert header_wins.status_code == 401


def test_the_identity_providers_cookie_grants_nothing(owned):
    ws, owner = owned
    response = requests.get(ws.api + "/users/me", cookies={"authelia_session": owner, "session": owner}, timeout=10)
    assert response.status_code == 401 and response.json()["detail"] == "no session token was given"


def test_bad_tokens_say_why(owned):
    ws, owner = owned
    for token, detail in [
        ("nope", "malformed"),
        (owner + "x", "malformed"),
        ("a" * 10 + "-" + "b" * 21, "malformed"),
        ("AAAAAAAAAA-BBBBBBBBBBBBBBBBBBBBBB", "not valid"),
        (owner[:11] + "B" * 22, "not valid"),
    ]:
        response = requests.get(ws.api + "/users/me", headers=ws.as_user(token), timeout=10)
        assert response.status_code == 401 and detail in response.json()["detail"], token
        assert response.json()["message"] == "You must be signed in to do this."


def test_login_logout_and_revocation(owned):
    ws, _ = owned
    login = ws.login(OWNER["email"].upper(), OWNER["password"])
    assert login.status_code == 201
    token = login.json()["session_token"]
    assert "HttpOnly" in login.headers["Set-Cookie"]
    with ws.db() as db:
        key_id, stored = db.execute("select id, secret_hash from apikey where id = ?", (token[:10],)).fetchone()
    assert len(stored) == 64 and token[11:] not in stored  # only a SHA-256 of the secret
    out = requests.post(ws.api + "/users/logout", headers=ws.as_user(token), timeout=10)
    assert out.status_code == 200 and "workspace_session_token=;" in out.headers["Set-Cookie"]
    after = requests.get(ws.api + "/users/me", headers=ws.as_user(token), timeout=10)
    assert after.status_code == 401 and after.json()["detail"] == "the session token was revoked"


def test_wrong_password_and_unknown_account_look_the_same(owned):
    ws, _ = owned

    def timed(email, password):
        started = time.monotonic()
        response = ws.login(email, password)
        return response, time.monotonic() - started

    wrong, wrong_s = timed(OWNER["email"], "not the password")
    unknown, unknown_s = timed("nobody@example.com", "not the password")
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.json() == unknown.json() == {"message": "Incorrect email or password."}
    assert unknown_s > wrong_s / 3, (wrong_s, unknown_s)  # both pay for a password hash


def test_sso_accounts_cannot_use_a_password_and_the_answer_does_not_say_so(owned):
    ws, owner = owned
    requests.post(
        ws.api + "/users",
        json={"email": "sso@example.com", "username": "ssouser", "login_type": "oidc"},
        headers=ws.as_user(owner),
        timeout=10,
    )
    sso = ws.login("sso@example.com", "whatever it is")
    unknown = ws.login("nobody-at-all@example.com", "whatever it is")
    assert sso.status_code == unknown.status_code == 401
    assert sso.json() == unknown.json() == {"message": "Incorrect email or password."}


def test_expired_tokens_and_the_sliding_lifetime(owned):
    ws, _ = owned
    token = ws.login(OWNER["email"], OWNER["password"]).json()["session_token"]
    soon = (datetime.utcnow() + timedelta(minutes=10)).isoformat(sep=" ")
    with ws.db() as db:
        db.execute("update apikey set expires_at = ? where id = ?", (soon, token[:10]))
    assert requests.get(ws.api + "/users/me", headers=ws.as_user(token), timeout=10).status_code == 200
    with ws.db() as db:
        (expires,) = db.execute("select expires_at from apikey where id = ?", (token[:10],)).fetchone()
    assert datetime.fromisoformat(expires) > datetime.utcnow() + timedelta(hours=23)  # used near its end: extended
    past = (datetime.utcnow() - timedelta(seconds=1)).isoformat(sep=" ")
    with ws.db() as db:
        db.execute("update apikey set expires_at = ? where id = ?", (past, token[:10]))
    expired = requests.get(ws.api + "/users/me", headers=ws.as_user(token), timeout=10)
    assert expired.status_code == 401 and expired.json()["detail"] == "the session token has expired"
