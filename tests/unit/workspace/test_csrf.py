"""Requests that another site's page makes in a signed-in browser's name: the sign-in,
sign-out and set-up forms, and whatever the cookie signs in that changes something,
are refused (403, nothing changed) unless the browser says they come from the
platform's own pages (Sec-Fetch-Site, else Origin against WORKSPACE_ACCESS_URL).
Clients that send neither header (curl, the agent, the command-line client) pass.
The real browser's side of it is tests/browser/test_workspace_csrf.py."""

import pytest
import requests

from tests.support.workspace import CSRF_ACCESS_URL as ACCESS_URL
from tests.support.workspace import CSRF_COOKIE as COOKIE
from tests.support.workspace import CSRF_CROSS_SITE as CROSS_SITE
from tests.support.workspace import CSRF_SAME_ORIGIN as SAME_ORIGIN
from tests.support.workspace import OWNER


@pytest.fixture(scope="module")
def platform(start_module_service, db_backend):
    from tests.support.workspace import Workspace

    ws = Workspace(start_module_service("workspace", env={**db_backend.env(), "WORKSPACE_ACCESS_URL": ACCESS_URL}))
    return ws, ws.first_user()


def _session_cookie(response):
    return response.cookies.get(COOKIE)


@pytest.mark.parametrize("headers", CROSS_SITE)
def test_another_sites_login_form_cannot_sign_a_browser_in(platform, headers):
    ws, _ = platform
    response = requests.post(
        ws.url + "/login",
        data={"email": OWNER["email"], "password": OWNER["password"]},
        headers=headers,
        allow_redirects=False,
        timeout=30,
    )
    assert response.status_code == 403 and "Set-Cookie" not in response.headers
    assert "came from another site" in response.text and 'role="alert"' in response.text


@pytest.mark.parametrize("headers", SAME_ORIGIN)
def test_the_platforms_own_login_form_signs_in(platform, headers):
    ws, _ = platform
    response = requests.post(
        ws.url + "/login",
        data={"email": OWNER["email"], "password": OWNER["password"]},
        headers=headers,
        allow_redirects=False,
        timeout=30,
    )
    assert response.status_code == 303 and _session_cookie(response)


def test_another_sites_logout_form_neither_signs_out_nor_revokes(platform):
    ws, _ = platform
    token = ws.login(OWNER["email"], OWNER["password"]).json()["session_token"]
    for headers in CROSS_SITE:
        response = requests.post(
            ws.url + "/logout", cookies={COOKIE: token}, headers=headers, allow_redirects=False, timeout=10
        )
        assert response.status_code == 403 and "Set-Cookie" not in response.headers
        api = requests.post(ws.api + "/users/logout", cookies={COOKIE: token}, headers=headers, timeout=10)
        assert api.status_code == 403
        assert api.json()["message"] == "This request came from another site and was refused."
    assert requests.get(ws.api + "/users/me", headers=ws.as_user(token), timeout=10).status_code == 200


@pytest.mark.parametrize("form", [True, False])
def test_a_logout_revokes_the_token_on_the_server(platform, form):
    ws, _ = platform
    token = ws.login(OWNER["email"], OWNER["password"]).json()["session_token"]
    url = ws.url + "/logout" if form else ws.api + "/users/logout"
    out = requests.post(url, cookies={COOKIE: token}, headers={"Origin": ACCESS_URL}, allow_redirects=False, timeout=10)
    assert out.status_code in (200, 303) and "workspace_session_token=;" in out.headers["Set-Cookie"]
    after = requests.get(ws.api + "/users/me", headers=ws.as_user(token), timeout=10)
    assert after.status_code == 401 and after.json()["detail"] == "the session token was revoked"


def test_cookie_signed_changes_through_the_api_must_come_from_the_platform(platform):
    ws, owner = platform
    created = requests.post(
        ws.api + "/users/me/workspaces",
        json={"name": "csrf", "agents": [{"name": "main"}]},
        headers=ws.as_user(owner),
        timeout=10,
    ).json()
    agent_id = created["agents"][0]["id"]
    rotate = ws.api + f"/workspaceagents/{agent_id}/token"
    cookie = {COOKIE: owner}
    # A form can POST without a body: the agent's token would be replaced (its agent cut off).
    refused = requests.post(rotate, cookies=cookie, headers=CROSS_SITE[1], timeout=10)
    assert refused.status_code == 403
    with ws.db() as db:
        assert (
            db.execute("select count(*) from auditlog where action = 'workspace_agent.token_rotated'").fetchone()[0]
            == 0
        )
    # Reading is not refused (CORS keeps the answer from the other site); the header token is not a cookie.
    assert requests.get(ws.api + "/users/me", cookies=cookie, headers=CROSS_SITE[0], timeout=10).status_code == 200
    assert requests.post(rotate, headers={**ws.as_user(owner), **CROSS_SITE[0]}, timeout=10).status_code == 201
    assert requests.post(rotate, cookies=cookie, headers=SAME_ORIGIN[0], timeout=10).status_code == 201


@pytest.mark.parametrize("path", ["/users/login", "/users/first"])
@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"])
def test_the_json_sign_in_routes_refuse_what_a_form_can_send(platform, path, content_type):
    ws, _ = platform
    body = '{"email": "owner@example.com", "password": "correct horse battery"}'
    response = requests.post(ws.api + path, data=body, headers={"Content-Type": content_type}, timeout=10)
    assert response.status_code == 415 and "Set-Cookie" not in response.headers
    assert "application/json" in response.json()["message"]
