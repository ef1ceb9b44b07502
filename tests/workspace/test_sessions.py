"""Sign-in limits and cookies of a platform of the test's own under gunicorn: failures
counted per account and address, delays that double, the https cookie. The session
logic in process is tests/unit/workspace/test_sessions.py."""

import requests

from tests.support.workspace import OWNER


def _login_from(ws, address, email, password):
    # The platform believes X-Real-IP from a loopback peer: nginx on the same host.
    return requests.post(
        ws.api + "/users/login", json={"email": email, "password": password}, headers={"X-Real-IP": address}, timeout=30
    )


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
    statuses = [
        _login_from(ws, f"2001:db8:1:2::{n:x}", OWNER["email"], "wrong password").status_code for n in range(1, 6)
    ]
    assert statuses == [401] * 3 + [429] * 2  # five addresses of one /64: one allowance
    assert _login_from(ws, "2001:db8:1:3::1", OWNER["email"], OWNER["password"]).status_code == 201


def test_failures_slow_down_with_a_delay_that_doubles(workspace):
    ws = workspace(
        {
            "WORKSPACE_LOGIN_RATE_PER_ACCOUNT": "2",
            "WORKSPACE_LOGIN_MAX_DELAY_SECONDS": "7200",
            "WORKSPACE_LOGIN_DELAY_SECONDS": "1800",
        }
    )
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
        return requests.post(
            ws.url + "/login",
            data={"email": OWNER["email"], "password": password},
            headers={"X-Real-IP": address},
            allow_redirects=False,
            timeout=30,
        )

    assert [form("203.0.113.11", "wrong password").status_code for _ in range(3)] == [401, 401, 429]
    limited = form("203.0.113.11", OWNER["password"])
    assert limited.status_code == 429 and int(limited.headers["Retry-After"]) > 60
    assert "Too many failed sign-in attempts" in limited.text
    assert form("198.51.100.4", OWNER["password"]).status_code == 303


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
