"""Session credentials: where they are read, their shape, lifetime, login and logout."""
import time
from datetime import datetime, timedelta

import pytest
import requests

from tests.support.workspace import OWNER

pytestmark = pytest.mark.in_process


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
    for token, detail in [("nope", "malformed"), (owner + "x", "malformed"), ("a" * 10 + "-" + "b" * 21, "malformed"),
                          ("AAAAAAAAAA-BBBBBBBBBBBBBBBBBBBBBB", "not valid"),
                          (owner[:11] + "B" * 22, "not valid")]:
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
    requests.post(ws.api + "/users", json={"email": "sso@example.com", "username": "ssouser", "login_type": "oidc"},
                  headers=ws.as_user(owner), timeout=10)
    sso = ws.login("sso@example.com", "whatever it is")
    unknown = ws.login("nobody-at-all@example.com", "whatever it is")
    assert sso.status_code == unknown.status_code == 401
    assert sso.json() == unknown.json() == {"message": "Incorrect email or password."}


def _login_from(ws, address, email, password):
    # The platform believes X-Real-IP from a loopback peer: nginx on the same host.
    return requests.post(ws.api + "/users/login", json={"email": email, "password": password},
                         headers={"X-Real-IP": address}, timeout=30)


# Long enough that no test waits it out however slow the machine: nothing here is timed.
SLOW = {"WORKSPACE_LOGIN_DELAY_SECONDS": "3600"}


def test_failures_for_an_account_from_one_address_never_lock_it_out_from_another(workspace):
    ws = workspace({**SLOW, "WORKSPACE_LOGIN_RATE_PER_ACCOUNT": "10", "WORKSPACE_LOGIN_RATE_PER_ADDRESS": "1000"})
    ws.first_user()
    statuses = [_login_from(ws, "203.0.113.7", OWNER["email"], "wrong password").status_code for _ in range(50)]
    assert statuses == [401] * 10 + [429] * 40
    # Her right password, from anywhere else, at once:
    assert _login_from(ws, "198.51.100.2", OWNER["email"], OWNER["password"]).status_code == 201
    # From the guessing address it waits, without its password being tried:
    limited = _login_from(ws, "203.0.113.7", OWNER["email"], OWNER["password"])
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) > 60
    assert "try again later" in limited.json()["message"]
    # The guessing address may still sign in to an account it has not guessed at.
    second = {"email": "second@example.com", "username": "second", "password": "another good passphrase"}
    owner = _login_from(ws, "198.51.100.2", OWNER["email"], OWNER["password"]).json()["session_token"]
    requests.post(ws.api + "/users", json=second, headers=ws.as_user(owner), timeout=10).raise_for_status()
    assert _login_from(ws, "203.0.113.7", second["email"], second["password"]).status_code == 201


def test_the_addresses_of_one_ipv6_network_count_as_one_guesser(workspace):
    ws = workspace({**SLOW, "WORKSPACE_LOGIN_RATE_PER_ACCOUNT": "3", "WORKSPACE_LOGIN_RATE_PER_ADDRESS": "1000"})
    ws.first_user()
    statuses = [_login_from(ws, f"2001:db8:1:2::{n:x}", OWNER["email"], "wrong password").status_code
                for n in range(1, 6)]
    assert statuses == [401] * 3 + [429] * 2  # five addresses of one /64: one allowance
    assert _login_from(ws, "2001:db8:1:3::1", OWNER["email"], OWNER["password"]).status_code == 201


def test_failures_slow_down_with_a_delay_that_doubles(workspace):
    ws = workspace({"WORKSPACE_LOGIN_RATE_PER_ACCOUNT": "2", "WORKSPACE_LOGIN_MAX_DELAY_SECONDS": "7200",
                    "WORKSPACE_LOGIN_DELAY_SECONDS": "1800"})
    ws.first_user()
    statuses = [_login_from(ws, "203.0.113.8", OWNER["email"], "wrong password").status_code for _ in range(3)]
    assert statuses == [401, 401, 429]
    wait = int(_login_from(ws, "203.0.113.8", OWNER["email"], "wrong password").headers["Retry-After"])
    assert 1700 < wait <= 1800  # the first delay; each attempt allowed after it doubles the next


def test_an_address_that_fails_across_many_accounts_slows_down(workspace):
    ws = workspace({**SLOW, "WORKSPACE_LOGIN_RATE_PER_ACCOUNT": "3", "WORKSPACE_LOGIN_RATE_PER_ADDRESS": "6"})
    ws.first_user()
    sprayed = [_login_from(ws, "203.0.113.9", f"x{n}@example.com", "wrong password").status_code for n in range(8)]
    assert sprayed == [401] * 6 + [429] * 2
    # The owner, from another address, is not slowed by that.
    assert _login_from(ws, "198.51.100.3", OWNER["email"], OWNER["password"]).status_code == 201


def test_a_right_password_forgets_the_failures_before_it(workspace):
    ws = workspace({**SLOW, "WORKSPACE_LOGIN_RATE_PER_ACCOUNT": "3", "WORKSPACE_LOGIN_RATE_PER_ADDRESS": "1000"})
    ws.first_user()
    for _ in range(2):
        assert _login_from(ws, "203.0.113.10", OWNER["email"], "typo typo").status_code == 401
    assert _login_from(ws, "203.0.113.10", OWNER["email"], OWNER["password"]).status_code == 201
    for _ in range(2):  # two more typos later: within the allowance again, counted afresh
        assert _login_from(ws, "203.0.113.10", OWNER["email"], "typo typo").status_code == 401
    assert _login_from(ws, "203.0.113.10", OWNER["email"], OWNER["password"]).status_code == 201


def test_the_login_pages_form_has_the_same_limits(workspace):
    ws = workspace({**SLOW, "WORKSPACE_LOGIN_RATE_PER_ACCOUNT": "2", "WORKSPACE_LOGIN_RATE_PER_ADDRESS": "1000"})
    ws.first_user()

    def form(address, password):
        return requests.post(ws.url + "/login", data={"email": OWNER["email"], "password": password},
                             headers={"X-Real-IP": address}, allow_redirects=False, timeout=30)

    assert [form("203.0.113.11", "wrong password").status_code for _ in range(3)] == [401, 401, 429]
    limited = form("203.0.113.11", OWNER["password"])
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) > 60
    assert "Too many failed sign-in attempts" in limited.text
    assert form("198.51.100.4", OWNER["password"]).status_code == 303


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


def test_password_sign_in_can_be_disabled(workspace):
    ws = workspace({"WORKSPACE_DISABLE_PASSWORD_AUTH": "true"})
    ws.first_user()
    assert ws.login(OWNER["email"], OWNER["password"]).status_code == 403
    assert requests.get(ws.api + "/users/authmethods", timeout=10).json()["password"] == {"enabled": False}


def test_behind_https_the_cookie_is_the_platform_host_s_alone(workspace):
    """With https the session cookie is `__Host-workspace_session_token`: a browser takes
    it only from the platform's own host, so a page of a sibling host (an app host under
    the same parent domain) cannot plant its own session for the platform under the
    bare name, which is then no credential at all."""
    ws = workspace(env={"WORKSPACE_ACCESS_URL": "https://workspace.example.org"})
    owner = ws.first_user()
    signed_in = ws.login(OWNER["email"], OWNER["password"])
    name, _, rest = signed_in.headers["Set-Cookie"].partition("=")
    attributes = {part.strip().split("=")[0].lower() for part in rest.split(";")[1:]}
    assert name == "__Host-workspace_session_token"
    assert {"secure", "path", "httponly"} <= attributes and "domain" not in attributes
    me = ws.api + "/users/me"
    assert requests.get(me, cookies={"__Host-workspace_session_token": owner}, timeout=10).status_code == 200
    planted = requests.get(me, cookies={"workspace_session_token": owner}, timeout=10)
    assert planted.status_code == 401 and planted.json()["detail"] == "no session token was given"
    out = requests.post(ws.api + "/users/logout", cookies={"__Host-workspace_session_token": owner}, timeout=10)
    assert out.status_code == 200 and out.headers["Set-Cookie"].startswith("__Host-workspace_session_token=;")
