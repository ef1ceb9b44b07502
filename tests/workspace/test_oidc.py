"""OIDC single sign-on, end to end: a real HTTP client drives the login page's button,
the Authelia-shaped provider's login form and the platform's callback, against the
workspace service running under gunicorn (gevent worker) and the provider built on
authlib's server components (devtools.oidc_provider)."""

import base64
import hashlib
import json

import pytest
import requests
from joserfc.jwk import RSAKey

from tests.support.oidc import (
    BOB,
    CALLBACK,
    CLIENT_ID,
    OWNER,
    PASSWORD,
    SIGN_IN_TEXT,
    TIMEOUT,
    as_uuid,
    assert_error_page,
    flow_cookies,
    query_of,
    set_cookie_headers,
    stack_factory,
)


@pytest.fixture
def oidc_stack(start_service, db_backend):
    """make(env=None, users=..., secret_at_platform=None, oidc=True) -> Stack: a started
    provider and the workspace service configured against it (see tests/support/oidc.py), on
    each database backend in turn."""
    with stack_factory(start_service, db_backend) as make:
        yield make


def assert_flow_cookies_cleared(response):
    cleared = {
        h.split("=", 1)[0]
        for h in set_cookie_headers(response)
        if h.startswith("oidc_") and ("Max-Age=0" in h or "1970" in h)
    }
    assert cleared == {"oidc_state", "oidc_nonce", "oidc_verifier", "oidc_redirect"}


# --- the whole chain ----------------------------------------------------------------------------


def test_first_sso_login_creates_an_account_and_lands_on_the_stored_path(oidc_stack):
    stack = oidc_stack()
    methods = stack.api("GET", "/api/v2/users/authmethods").json()
    assert methods["oidc"] == {"enabled": True, "signInText": SIGN_IN_TEXT, "iconUrl": ""}
    assert methods["password"] == {"enabled": True}

    http = stack.browser()
    href = stack.button_href(http, redirect="/workspaces?tab=mine")
    assert href.split("?")[0] == stack.callback_url() and query_of(href) == {"redirect": "/workspaces?tab=mine"}
    authorization = stack.start(http, href)
    login_form = http.get(authorization, timeout=TIMEOUT, allow_redirects=False)
    assert login_form.status_code == 200 and 'name="password"' in login_form.text  # the provider's form
    posted = http.post(
        authorization, data={"username": "dave", "password": PASSWORD}, timeout=TIMEOUT, allow_redirects=False
    )
    assert posted.status_code == 302 and posted.headers["Location"].startswith(stack.callback_url())

    answer = stack.finish(http, posted.headers["Location"])
    assert answer.status_code == 303
    assert answer.headers["Location"] in ("/workspaces?tab=mine", stack.url("/workspaces?tab=mine"))
    assert answer.headers["Cache-Control"] == "no-store"
    session_cookie = [h for h in set_cookie_headers(answer) if h.startswith("workspace_session_token=")]
    assert len(session_cookie) == 1
    assert "HttpOnly" in session_cookie[0] and "Path=/" in session_cookie[0]
    assert "SameSite=Lax" in session_cookie[0] and "Domain" not in session_cookie[0]
    assert_flow_cookies_cleared(answer)
    assert flow_cookies(http) == {}

    me = stack.me(http)
    assert me.status_code == 200, me.text
    user = me.json()
    assert (user["username"], user["email"], user["login_type"], user["name"]) == (
        "dave",
        "dave@example.net",
        "oidc",
        "Dave",
    )
    assert user["roles"] == [] and user["status"] == "active" and len(user["organization_ids"]) == 1
    links = stack.rows("SELECT user_id, issuer, subject FROM oidclink")
    assert len(links) == 1
    assert as_uuid(links[0]["user_id"]) == as_uuid(user["id"]) and links[0]["issuer"] == stack.idp.issuer
    assert links[0]["subject"] == stack.idp.state.users["dave"].sub
    key = stack.rows("SELECT login_type FROM apikey WHERE user_id = ?", as_uuid(user["id"]).hex)
    assert [k["login_type"] for k in key] == ["oidc"]
    # The dashboard page shows the signed-in user.
    assert '<dd id="username">dave</dd>' in http.get(stack.url("/"), timeout=TIMEOUT).text


def test_the_redirect_to_the_provider_carries_the_spec_parameters_and_short_lived_cookies(oidc_stack):
    stack = oidc_stack(env={"WORKSPACE_OIDC_SCOPES": "openid,profile,email,groups"})
    http = stack.browser()
    response = http.get(stack.callback_url(redirect="/x"), timeout=TIMEOUT, allow_redirects=False)
    assert response.status_code in (302, 303)
    location = response.headers["Location"]
    assert location.startswith(stack.idp.issuer + "/api/oidc/authorization?")
    params = query_of(location)
    assert params["client_id"] == CLIENT_ID
    assert params["redirect_uri"] == stack.base_url + CALLBACK
    assert params["response_type"] == "code"
    assert params["scope"] == "openid profile email groups"
    assert params["code_challenge_method"] == "S256"
    cookies = flow_cookies(http)
    assert set(cookies) == {"oidc_state", "oidc_nonce", "oidc_verifier", "oidc_redirect"}
    assert params["state"] == cookies["oidc_state"].value and len(params["state"]) >= 32
    assert params["nonce"] == cookies["oidc_nonce"].value and len(params["nonce"]) >= 32
    verifier = cookies["oidc_verifier"].value
    assert 43 <= len(verifier) <= 128
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    assert params["code_challenge"] == challenge
    assert "code_verifier" not in location and verifier not in location
    for header in set_cookie_headers(response):
        assert "HttpOnly" in header and "SameSite=Lax" in header and "Path=/api/v2/users/oidc" in header
        assert "Max-Age=600" in header and "Secure" not in header and "Domain" not in header
    # A fresh attempt gets fresh values.
    again = query_of(requests.get(stack.callback_url(), timeout=TIMEOUT, allow_redirects=False).headers["Location"])
    assert again["state"] != params["state"] and again["code_challenge"] != params["code_challenge"]


def test_a_verified_email_of_an_existing_account_links_to_it_with_an_audit_row(oidc_stack):
    stack = oidc_stack()
    users_before = stack.user_count()
    http, answer = stack.sso("olivia")  # Owner@Example.COM, verified: the Owner's email in other case
    assert answer.status_code == 303
    me = stack.me(http).json()
    assert me["id"] == stack.owner_id and me["username"] == "owner" and me["roles"] == ["owner"]
    assert me["login_type"] == "password"  # still has a password: it stays a fallback
    assert stack.user_count() == users_before
    audit = stack.rows("SELECT user_id, actor, detail FROM auditlog WHERE action = 'user.oidc_link'")
    assert len(audit) == 1
    assert as_uuid(audit[0]["user_id"]) == as_uuid(stack.owner_id)
    detail = json.loads(audit[0]["detail"])
    assert detail["matched_by"] == "verified_email" and detail["issuer"] == stack.idp.issuer
    assert detail["subject"] == stack.idp.state.users["olivia"].sub
    # Password sign-in of the Owner still works.
    login = stack.api("POST", "/api/v2/users/login", json={"email": OWNER["email"], "password": OWNER["password"]})
    assert login.status_code == 201


def test_a_second_login_reuses_the_link(oidc_stack):
    stack = oidc_stack()
    first_http, first = stack.sso("dave")
    first_id = stack.me(first_http).json()["id"]
    users = stack.user_count()
    # A new browser: new provider session, new flow, same person.
    second_http, second = stack.sso("dave", redirect="/again")
    assert second.status_code == 303 and second.headers["Location"].endswith("/again")
    assert stack.me(second_http).json()["id"] == first_id
    assert stack.user_count() == users
    assert len(stack.rows("SELECT id FROM oidclink")) == 1
    # The linked Owner too, by its link, not by email again.
    stack.sso("olivia")
    stack.sso("olivia")
    assert len(stack.rows("SELECT id FROM auditlog WHERE action = 'user.oidc_link'")) == 2  # dave's, olivia's
    # Both sessions are separate tokens.
    assert first_http.cookies["workspace_session_token"] != second_http.cookies["workspace_session_token"]


def test_new_accounts_get_an_allowed_unique_username(oidc_stack):
    stack = oidc_stack()
    http, _ = stack.sso("Bob")  # "bob" is taken (case-insensitively): Bob-2
    assert stack.me(http).json()["username"] == "Bob-2"
    http, _ = stack.sso("Erin O'Neil")
    assert stack.me(http).json()["username"] == "Erin-O-Neil"
    # An unverified email that matches no account is not a reason to refuse: nothing to take over.
    http, answer = stack.sso("frank")
    assert answer.status_code == 303
    assert stack.me(http).json()["email"] == "frank@example.net"


# --- refusals -------------------------------------------------------------------------------------


def test_an_unverified_email_matching_an_existing_account_is_refused(oidc_stack):
    stack = oidc_stack()
    users = stack.user_count()
    http, answer = stack.sso("mallory")  # bob@example.com, email_verified false
    assert_error_page(answer, 403, "already exists", "not verified")
    assert_flow_cookies_cleared(answer)
    assert stack.me(http).status_code == 401
    assert stack.user_count() == users
    assert stack.rows("SELECT id FROM \"user\" WHERE email_key = 'bob@example.com'") == [
        {"id": as_uuid(stack.bob_id).hex}
    ]
    assert stack.rows("SELECT id FROM oidclink") == []
    # Bob's own password sign-in is untouched.
    login = stack.api("POST", "/api/v2/users/login", json={"email": BOB["email"], "password": BOB["password"]})
    assert login.status_code == 201


def test_a_wrong_or_absent_state_is_refused(oidc_stack):
    stack = oidc_stack()
    for tamper in ("wrong", "missing-param", "missing-cookie", "both-missing"):
        http = stack.browser()
        callback = stack.to_callback(http, "dave")
        params = query_of(callback)
        if tamper == "wrong":
            params["state"] = params["state"][:-4] + "AAAA"
        if tamper in ("missing-param", "both-missing"):
            del params["state"]
        if tamper in ("missing-cookie", "both-missing"):
            http.cookies.clear(domain="127.0.0.1", path="/api/v2/users/oidc", name="oidc_state")
        stack.idp.counts.clear()
        answer = stack.finish(http, stack.callback_url(**params))
        assert_error_page(answer, 401, "could not be matched")
        assert stack.idp.counts["token"] == 0, tamper  # the code was never exchanged
        assert stack.me(http).status_code == 401
    assert stack.rows("SELECT id FROM oidclink") == []
    assert stack.user_count() == 2


def test_an_attackers_callback_cannot_sign_another_browser_in(oidc_stack):
    """Login CSRF through the callback: the attacker signs in at the provider and, instead
    of finishing, has the victim's browser open the callback with the attacker's code and
    state. The state cookie binds the flow to the browser that started it: refused,
    whether the victim has a flow of her own under way or none. (A cross-site GET may start
    a flow: that only sends the victim to the provider as herself.)"""
    stack = oidc_stack()
    attacker = stack.browser()
    callback = stack.to_callback(attacker, "dave")
    for started_her_own in (False, True):
        victim = stack.browser()
        if started_her_own:
            stack.start(victim, stack.button_href(victim))
        stack.idp.counts.clear()
        answer = stack.finish(victim, callback)
        assert_error_page(answer, 401, "could not be matched")
        assert stack.idp.counts["token"] == 0  # the attacker's code was never exchanged
        assert stack.me(victim).status_code == 401
    assert stack.rows("SELECT id FROM oidclink") == []


def test_a_missing_verifier_is_refused(oidc_stack):
    stack = oidc_stack()
    http = stack.browser()
    callback = stack.to_callback(http, "dave")
    http.cookies.clear(domain="127.0.0.1", path="/api/v2/users/oidc", name="oidc_verifier")
    stack.idp.counts.clear()
    answer = stack.finish(http, callback)
    assert_error_page(answer, 401, "incomplete or expired")
    assert stack.idp.counts["token"] == 0
    assert stack.me(http).status_code == 401
    assert stack.user_count() == 2


def test_a_verifier_of_another_attempt_is_refused_by_the_provider(oidc_stack):
    """PKCE does its job: a code obtained in one attempt cannot be redeemed with the
    verifier of another (the provider answers invalid_grant): a 400 page, not a 500."""
    stack = oidc_stack()
    http = stack.browser()
    callback = stack.to_callback(http, "dave")
    other = stack.browser()
    stack.start(other, stack.callback_url())
    http.cookies.set("oidc_verifier", other.cookies["oidc_verifier"], domain="127.0.0.1", path="/api/v2/users/oidc")
    answer = stack.finish(http, callback)
    assert_error_page(answer, 400, "not accepted")
    assert stack.me(http).status_code == 401


def test_a_nonce_of_another_attempt_fails_the_id_token_check(oidc_stack):
    stack = oidc_stack()
    http = stack.browser()
    callback = stack.to_callback(http, "dave")
    other = stack.browser()
    stack.start(other, stack.callback_url())
    http.cookies.set("oidc_nonce", other.cookies["oidc_nonce"], domain="127.0.0.1", path="/api/v2/users/oidc")
    answer = stack.finish(http, callback)
    assert_error_page(answer, 502, "could not be verified")
    assert stack.me(http).status_code == 401
    assert stack.rows("SELECT id FROM oidclink") == []


def test_id_token_signatures_are_checked_against_the_jwks(oidc_stack):
    stack = oidc_stack()
    http, answer = stack.sso("dave")  # the platform now holds the provider's JWKS
    assert answer.status_code == 303
    # The provider rotates its key (a new key id): the platform fetches the keys again.
    stack.idp.state.key = RSAKey.generate_key(2048, parameters={"use": "sig", "alg": "RS256"}, auto_kid=True)
    http, answer = stack.sso("dave")
    assert answer.status_code == 303 and stack.me(http).status_code == 200
    # A new key under the same key id: the signature fails on the cached key, so the keys
    # are fetched again, and the new one verifies.
    known_kid = stack.idp.state.key.kid
    stack.idp.state.key = RSAKey.generate_key(2048, parameters={"use": "sig", "alg": "RS256", "kid": known_kid})
    http, answer = stack.sso("dave")
    assert answer.status_code == 303 and stack.me(http).status_code == 200
    # A token signed by a key the provider does not publish, under its key id, does not verify.
    stack.idp.state.signing_key = RSAKey.generate_key(2048, parameters={"use": "sig", "alg": "RS256", "kid": known_kid})
    http, answer = stack.sso("dave")
    assert_error_page(answer, 502, "could not be verified")
    assert stack.me(http).status_code == 401


def test_a_used_or_made_up_code_is_a_readable_error(oidc_stack):
    stack = oidc_stack()
    http = stack.browser()
    callback = stack.to_callback(http, "dave")
    cookies = {c.name: c.value for c in http.cookies if c.name.startswith("oidc_")}
    assert stack.finish(http, callback).status_code == 303
    # The same callback again, with the flow cookies restored: the code is spent.
    replay = requests.get(callback, cookies=cookies, timeout=TIMEOUT, allow_redirects=False)
    assert_error_page(replay, 400, "not accepted")
    made_up = requests.get(
        stack.callback_url(code="made-up", state=cookies["oidc_state"]),
        cookies=cookies,
        timeout=TIMEOUT,
        allow_redirects=False,
    )
    assert_error_page(made_up, 400, "not accepted")


def test_a_wrong_client_secret_at_the_platform_is_a_readable_error(oidc_stack):
    wrong = "not-the-registered-secret-" + "x" * 20
    stack = oidc_stack(secret_at_platform=wrong)
    http, answer = stack.sso("dave")
    assert_error_page(answer, 502, "refused this deployment")
    assert "invalid_client" in answer.text
    assert wrong not in answer.text and stack.client_secret not in answer.text
    assert stack.me(http).status_code == 401
    assert stack.user_count() == 2


def test_an_error_from_the_provider_is_a_readable_page(oidc_stack):
    # A scope the client is not registered for: the provider sends the browser back
    # with error=invalid_scope (and the state).
    stack = oidc_stack(env={"WORKSPACE_OIDC_SCOPES": "openid,profile,email,offline_access"})
    http = stack.browser()
    authorization = stack.start(http, stack.button_href(http))
    back = http.get(authorization, timeout=TIMEOUT, allow_redirects=False)
    assert back.status_code == 302 and back.headers["Location"].startswith(stack.callback_url())
    assert query_of(back.headers["Location"])["error"] == "invalid_scope"
    answer = stack.finish(http, back.headers["Location"])
    assert_error_page(answer, 400, "could not complete", "invalid_scope")
    assert_flow_cookies_cleared(answer)
    # What the provider writes in error_description is not echoed (it is query-string text).
    state = requests.get(stack.callback_url(), timeout=TIMEOUT, allow_redirects=False)
    forged = requests.get(
        stack.callback_url(
            error="access_denied",
            error_description="Call +1 555 0100",
            state=query_of(state.headers["Location"])["state"],
        ),
        cookies=state.cookies,
        timeout=TIMEOUT,
        allow_redirects=False,
    )
    assert_error_page(forged, 403, "did not allow")
    assert "555 0100" not in forged.text


def test_an_email_domain_restriction_is_enforced(oidc_stack):
    stack = oidc_stack(env={"WORKSPACE_OIDC_EMAIL_DOMAIN": "example.org, Example.NET"})
    http, answer = stack.sso("dave")  # dave@example.net, verified: allowed
    assert answer.status_code == 303 and stack.me(http).status_code == 200
    http, answer = stack.sso("olivia")  # example.com: not allowed, even though it matches the Owner
    assert_error_page(answer, 403, "not allowed")
    assert stack.me(http).status_code == 401
    http, answer = stack.sso("frank")  # example.net but unverified: no domain claim without verification
    assert_error_page(answer, 403, "not allowed")


OPEN_REDIRECTS = [
    "https://evil.example",
    "//evil.example",
    "/\\evil.example",
    "\\\\evil.example",
    "/\r\nLocation: https://evil.example",
    "/\tevil",
    "/\x00/evil.example",
    "javascript:alert(1)",
    "evil.example/x",
    "///evil.example",
    "",
]


def test_open_redirect_attempts_end_at_the_root(oidc_stack):
    stack = oidc_stack()
    for target in OPEN_REDIRECTS:
        http = stack.browser()
        # Straight at the callback (not through /login, which reduces it too).
        callback = stack.to_callback(http, "dave", url=stack.callback_url(redirect=target))
        assert flow_cookies(http)["oidc_redirect"].value == "/", target
        answer = stack.finish(http, callback)
        assert answer.status_code == 303, target
        assert answer.headers["Location"] in ("/", stack.url("/")), target
        assert stack.me(http).status_code == 200
    # A raw %0d%0a in the query string (not an encoded percent sign) is a CR LF too.
    http = stack.browser()
    callback = stack.to_callback(http, "dave", url=stack.callback_url() + "?redirect=/%0d%0aSet-Cookie:x=y")
    answer = stack.finish(http, callback)
    assert answer.headers["Location"] in ("/", stack.url("/")) and "x=y" not in str(answer.headers)


def test_a_planted_redirect_cookie_is_reduced_too(oidc_stack):
    stack = oidc_stack()
    http = stack.browser()
    callback = stack.to_callback(http, "dave")
    http.cookies.set("oidc_redirect", "//evil.example/steal", domain="127.0.0.1", path="/api/v2/users/oidc")
    answer = stack.finish(http, callback)
    assert answer.status_code == 303 and answer.headers["Location"] in ("/", stack.url("/"))


def test_a_provider_that_is_down_is_a_readable_error_page(oidc_stack):
    stack = oidc_stack()
    stack.idp.stop()  # refuses connections
    http = stack.browser()
    answer = http.get(stack.button_href(http), timeout=TIMEOUT, allow_redirects=False)
    assert_error_page(answer, 502, "could not be reached", "password")
    assert flow_cookies(http) == {}
    # Password sign-in, the fallback, still works.
    login = stack.api("POST", "/api/v2/users/login", json={"email": OWNER["email"], "password": OWNER["password"]})
    assert login.status_code == 201
    # Back up: single sign-on works again without a restart of the platform.
    stack.idp.start()
    http, answer = stack.sso("dave")
    assert answer.status_code == 303 and stack.me(http).status_code == 200


def test_a_failing_provider_is_a_readable_error_page(oidc_stack):
    stack = oidc_stack()
    for failure in (503, 404, "close"):
        stack.idp.down = failure
        answer = requests.get(stack.callback_url(), timeout=TIMEOUT, allow_redirects=False)
        assert_error_page(answer, 502)


def test_a_provider_that_goes_down_during_the_sign_in_is_a_readable_error_page(oidc_stack):
    stack = oidc_stack()
    http = stack.browser()
    callback = stack.to_callback(http, "dave")  # the platform has its discovery document cached by now
    stack.idp.stop()
    answer = stack.finish(http, callback)
    assert_error_page(answer, 502, "could not be reached")
    assert stack.me(http).status_code == 401


def test_an_issuer_that_does_not_match_the_discovery_document_is_refused(oidc_stack):
    # The provider under another name: its document says 127.0.0.1, not localhost.
    stack = oidc_stack(env=lambda idp: {"WORKSPACE_OIDC_ISSUER_URL": idp.issuer.replace("127.0.0.1", "localhost")})
    answer = requests.get(stack.callback_url(), timeout=TIMEOUT, allow_redirects=False)
    assert_error_page(answer, 502, "does not match")
    assert stack.idp.counts["discovery"] == 1


def test_sso_is_404_when_oidc_is_not_configured(oidc_stack):
    stack = oidc_stack(oidc=False)
    for params in ({"redirect": "/"}, {"code": "x", "state": "y"}):
        answer = stack.api("GET", CALLBACK, params=params)
        assert answer.status_code == 404
        assert answer.headers["Content-Type"].startswith("application/json")
        assert set(answer.json()) == {"message"}
    assert 'id="sso"' not in requests.get(stack.url("/login"), timeout=TIMEOUT).text
    assert stack.api("GET", "/api/v2/users/authmethods").json()["oidc"]["enabled"] is False


# --- what single sign-on does not touch ----------------------------------------------------------------


def test_the_providers_session_cookie_grants_nothing_at_the_platform(oidc_stack):
    stack = oidc_stack()
    http = stack.browser()
    stack.to_callback(http, "olivia")  # signed in at the provider, not (yet) at the platform
    provider_cookie = http.cookies.get("authelia_session")
    assert provider_cookie
    for cookies in ({"authelia_session": provider_cookie}, {"authelia_session": stack.owner_token}):
        me = requests.get(stack.url("/api/v2/users/me"), cookies=cookies, timeout=TIMEOUT, allow_redirects=False)
        assert me.status_code == 401, me.text
        assert me.json()["detail"] == "no session token was given"
    # The browser itself (which sends the provider's cookie along) is not signed in either.
    assert stack.me(http).status_code == 401
    dashboard = http.get(stack.url("/"), timeout=TIMEOUT, allow_redirects=False)
    assert dashboard.status_code == 303 and dashboard.headers["Location"].startswith("/login")


def test_token_traffic_is_unaffected_by_oidc(oidc_stack):
    stack = oidc_stack()
    stack.idp.counts.clear()
    token = stack.owner_token
    me = stack.api("GET", "/api/v2/users/me", token=token)
    assert me.status_code == 200 and me.json()["username"] == "owner"
    created = stack.api(
        "POST", "/api/v2/users", token=token, json={"email": "cli@example.com", "username": "cli", "login_type": "none"}
    )
    assert created.status_code == 201, created.text
    # The query string carries a token on websocket upgrades only (test_sessions.py).
    assert stack.api("GET", "/api/v2/users/me", params={"workspace_session_token": token}).status_code == 401
    # No session: a JSON 401, never a redirect to the sign-in flow.
    anonymous = stack.api("GET", "/api/v2/users/me")
    assert anonymous.status_code == 401 and anonymous.json()["message"]
    assert stack.api("GET", "/api/v2/users/me", token="malformed").status_code == 401
    # Even with the provider down, token traffic goes on; the provider was never asked.
    stack.idp.stop()
    assert stack.api("GET", "/api/v2/users/me", token=token).status_code == 200
    assert stack.api("GET", "/api/v2/buildinfo", token=token).status_code == 200
    assert sum(stack.idp.counts.values()) == 0


# --- unit level (Flask test client) -------------------------------------------------------------------


def test_flow_cookies_are_secure_behind_an_https_address(monkeypatch, tmp_path):
    from app import create_app
    from devtools.oidc_provider import OidcProvider, pbkdf2_sha512_digest

    access_url = "https://workspace.example.org"
    with OidcProvider(
        {
            "clients": [
                {
                    "client_id": CLIENT_ID,
                    "client_secret_digest": pbkdf2_sha512_digest("s" * 32),
                    "redirect_uris": [access_url + CALLBACK],
                }
            ],
            "users": [],
        }
    ) as idp:
        for name, value in {
            "WORKSPACE_ACCESS_URL": access_url,
            "WORKSPACE_OIDC_ISSUER_URL": idp.issuer,
            "WORKSPACE_OIDC_CLIENT_ID": CLIENT_ID,
            "WORKSPACE_OIDC_CLIENT_SECRET": "s" * 32,
        }.items():
            monkeypatch.setenv(name, value)
        app = create_app("workspace", {"DATA_DIR": str(tmp_path), "TESTING": True})
        response = app.test_client().get(CALLBACK + "?redirect=/deep/link")
        # What a sibling host (an app host under the same parent domain) can plant: the
        # bare names. They are not the flow's cookies behind https, so its attempt is refused.
        planted = app.test_client()
        state = query_of(response.headers["Location"])["state"]
        for name in ("oidc_state", "oidc_nonce", "oidc_verifier", "oidc_redirect"):
            planted.set_cookie(name, state, domain="workspace.example.org")
        refused = planted.get(CALLBACK + f"?code=attackers-code&state={state}")
    assert response.status_code in (302, 303)
    assert query_of(response.headers["Location"])["redirect_uri"] == access_url + CALLBACK
    headers = response.headers.getlist("Set-Cookie")
    assert len(headers) == 4
    for header in headers:
        # Host-only by name (__Host- needs Path=/), so no other host can set them.
        assert header.startswith("__Host-oidc_") and "Secure" in header and "HttpOnly" in header
        assert "Path=/;" in header and "Domain" not in header
    assert refused.status_code in (400, 401, 403) and "workspace_session_token" not in str(refused.headers)
