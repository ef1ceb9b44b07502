"""Single sign-on against a real OpenID provider: LemonLDAP::NG (Debian's packages, its
portal behind an nginx of its own, devtools.lemonldap), with the workspace service on
gunicorn behind the bundle's nginx site, configured with its environment variables only.

What our stand-in (devtools.oidc_provider) never showed and LemonLDAP::NG does: the
id_token carries no email (only userinfo has it), `email_verified` and `groups` are
claims an administrator maps, the `groups` scope is an extra claim, the issuer may be
announced with a trailing slash, a new key can replace the old one under the same id,
and its 2.16 reads a client_secret_basic header only up to a `+` or `/` in its base64
(devtools.lemonldap.basic_safe_secret)."""

import base64
import hashlib
import html
import json
import re
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlencode, urljoin

import pytest
import requests

from devtools import nginx
from devtools.database_peek import peek
from devtools.lemonldap import CLIENT_ID, LemonLdap, sign_in
from devtools.services import held_port
from tests.support.oidc import CALLBACK, OWNER, TIMEOUT, as_uuid, assert_error_page, query_of

SIGN_IN_TEXT = "Sign in with LemonLDAP::NG"
SCOPES = "openid profile email groups"  # the spec's client registration table
DOCTOR = {"email": "dwho@badwolf.org", "username": "doctor", "password": "Tardis-blue-box-42", "login_type": "password"}
MICKEY = {"email": "msmith@badwolf.org", "username": "mickey", "password": "Tin-dog-k9-2005", "login_type": "password"}


@dataclass
class Site:
    """The provider, the workspace service and the nginx in front of it."""

    idp: LemonLdap
    service: object
    proxy: object
    base_url: str
    owner_token: str = ""
    accounts: dict = field(default_factory=dict)  # username -> id, made by the Owner
    browsers: list = field(default_factory=list)

    def url(self, path):
        return self.base_url + path

    def api(self, method, path, token=None, **kwargs):
        headers = {"Workspace-Session-Token": token} if token else {}
        return requests.request(
            method, self.url(path), headers=headers, timeout=TIMEOUT, allow_redirects=False, **kwargs
        )

    def rows(self, sql, *params):
        with peek(self.service) as connection:
            return [dict(row) for row in connection.execute(sql, params)]

    def browser(self):
        http = requests.Session()
        self.browsers.append(http)
        return http

    def start(self, http):
        """The login page's button, then the platform's redirect to the provider."""
        page = http.get(self.url("/login"), timeout=TIMEOUT)
        match = re.search(r'<a class="button sso" id="sso" href="([^"]+)">\s*(.*?)\s*</a>', page.text, re.S)
        assert match and html.unescape(match.group(2)) == SIGN_IN_TEXT, page.text
        answer = http.get(urljoin(self.base_url, html.unescape(match.group(1))), timeout=TIMEOUT, allow_redirects=False)
        assert answer.status_code == 303, answer.text
        return answer.headers["Location"]

    def to_callback(self, http, user):
        location = sign_in(http, self.start(http), user)
        assert location.startswith(self.url(CALLBACK) + "?"), location
        return location

    def sso(self, user, http=None):
        """The whole chain as a browser does it: (session, the callback's answer)."""
        http = http or self.browser()
        return http, http.get(self.to_callback(http, user), timeout=TIMEOUT, allow_redirects=False)

    def me(self, http):
        answer = http.get(self.url("/api/v2/users/me"), timeout=TIMEOUT, allow_redirects=False)
        assert answer.status_code == 200, answer.text
        return answer.json()


def make_site(start_module_service, tmp_path_factory, issuer_suffix="", configured_issuer=None):
    """A provider (issuer announced with `issuer_suffix`), the workspace service given the
    issuer as `configured_issuer(idp)` (default: as announced), and nginx in front, with
    the Owner and two password accounts whose emails the provider's users have."""
    with held_port() as port:  # nginx's, named in the provider's registration; bound below
        base_url = f"http://127.0.0.1:{port}"
        idp = LemonLdap(redirect_uris=[base_url + CALLBACK], issuer_suffix=issuer_suffix).start()
    service = start_module_service(
        "workspace",
        env={
            "WORKSPACE_ACCESS_URL": base_url,
            "WORKSPACE_OIDC_ISSUER_URL": configured_issuer(idp) if configured_issuer else idp.issuer,
            "WORKSPACE_OIDC_CLIENT_ID": CLIENT_ID,
            "WORKSPACE_OIDC_CLIENT_SECRET": idp.client_secret,
            "WORKSPACE_OIDC_SCOPES": SCOPES.replace(" ", ","),
            "WORKSPACE_OIDC_SIGN_IN_TEXT": SIGN_IN_TEXT,
        },
    )
    proxy = nginx.start(
        tmp_path_factory.mktemp("nginx-sso"),
        listen_port=port,
        upstreams={"workspace": f"127.0.0.1:{service.port}"},
        hosts={"workspace": "127.0.0.1"},
    )
    site = Site(idp, service, proxy, base_url)
    first = site.api("POST", "/api/v2/users/first", json=OWNER)
    assert first.status_code == 201, first.text
    site.owner_token = first.json()["session_token"]
    for account in (DOCTOR, MICKEY):
        made = site.api("POST", "/api/v2/users", token=site.owner_token, json=account)
        assert made.status_code == 201, made.text
        site.accounts[account["username"]] = made.json()["id"]
    return site


def stop_site(site):
    for http in site.browsers:
        http.close()
    site.proxy.stop()
    site.idp.stop()


@pytest.fixture(scope="module")
def site(start_module_service, tmp_path_factory):
    made = make_site(start_module_service, tmp_path_factory)
    yield made
    stop_site(made)


# --- the whole chain ------------------------------------------------------------------------------


def test_the_first_sign_in_creates_an_account_through_the_whole_chain(site):
    http = site.browser()
    authorization = site.start(http)
    assert authorization.startswith(site.idp.metadata()["authorization_endpoint"] + "?")
    asked = query_of(authorization)
    assert asked["client_id"] == CLIENT_ID and asked["scope"] == SCOPES
    assert asked["code_challenge_method"] == "S256" and asked["redirect_uri"] == site.url(CALLBACK)
    # The provider's login form, filled as a person would.
    form = http.get(authorization, timeout=TIMEOUT)
    assert form.status_code == 200 and 'name="password"' in form.text and 'id="lform"' in form.text
    callback = sign_in(http, authorization, "rtyler")

    answer = http.get(callback, timeout=TIMEOUT, allow_redirects=False)
    assert answer.status_code == 303, answer.text
    me = site.me(http)
    assert me["username"] == "rtyler" and me["email"] == "rtyler@badwolf.org"
    assert me["name"] == "Rose Tyler" and me["login_type"] == "oidc"
    links = site.rows("SELECT user_id, issuer, subject FROM oidclink")
    assert [(as_uuid(link["user_id"]), link["issuer"], link["subject"]) for link in links] == [
        (as_uuid(me["id"]), site.idp.issuer, "rtyler")
    ]

    # Again in a new browser that holds only the provider's session: no form, the same account.
    later = site.browser()
    for cookie in http.cookies:
        if cookie.name == "lemonldap":
            later.cookies.set_cookie(cookie)
    assert site.start(later) and "lemonldap" in later.cookies
    _, again = site.sso("rtyler", http=later)
    assert again.status_code == 303
    assert site.me(later)["id"] == me["id"]
    assert len(site.rows("SELECT id FROM oidclink")) == 1


def test_a_verified_email_signs_into_the_account_that_has_it(site):
    http, answer = site.sso("dwho")
    assert answer.status_code == 303, answer.text
    me = site.me(http)
    assert as_uuid(me["id"]) == as_uuid(site.accounts["doctor"]) and me["username"] == "doctor"
    audit = site.rows("SELECT action, detail FROM auditlog WHERE action = 'user.oidc_link'")
    assert any(
        json.loads(row["detail"]).get("matched_by") == "verified_email"
        and json.loads(row["detail"]).get("subject") == "dwho"
        for row in audit
    ), audit
    # The password still works beside the link.
    login = site.api("POST", "/api/v2/users/login", json={"email": DOCTOR["email"], "password": DOCTOR["password"]})
    assert login.status_code == 201, login.text


def test_an_unverified_email_matching_an_account_is_refused(site):
    # The provider says msmith's address is not verified (email_verified: false).
    _, answer = site.sso("msmith")
    assert_error_page(answer, 403, "has not verified")
    assert not site.rows("SELECT id FROM oidclink WHERE subject = 'msmith'")


# --- what the provider really sends --------------------------------------------------------------


def pkce_pair():
    verifier = secrets.token_urlsafe(64)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


def jwt_part(token, index):
    part = token.split(".")[index]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def test_what_the_provider_sends_is_what_the_platform_reads(site):
    """The code flow done by hand, as the platform's client does it: what comes back."""
    metadata = site.idp.metadata()
    verifier, challenge = pkce_pair()
    http = site.browser()
    location = sign_in(
        http,
        metadata["authorization_endpoint"]
        + "?"
        + urlencode(
            {
                "response_type": "code",
                "client_id": CLIENT_ID,
                "redirect_uri": site.url(CALLBACK),
                "scope": SCOPES,
                "state": "st",
                "nonce": "nc",
                "code_challenge": challenge,
                "code_challenge_method": "S256",
            }
        ),
        "dwho",
    )
    code = query_of(location)["code"]
    token = requests.post(
        metadata["token_endpoint"],
        auth=(CLIENT_ID, site.idp.client_secret),
        timeout=TIMEOUT,
        data={
            "grant_type": "authorization_code",
            "code": code,
            "code_verifier": verifier,
            "redirect_uri": site.url(CALLBACK),
        },
    )
    assert token.status_code == 200, token.text
    answer = token.json()
    assert answer["token_type"].lower() == "bearer"

    header, claims = jwt_part(answer["id_token"], 0), jwt_part(answer["id_token"], 1)
    assert header["alg"] == "RS256" and header["kid"] in [key["kid"] for key in site.idp.jwks()["keys"]]
    assert claims["iss"] == site.idp.issuer and claims["aud"] in (CLIENT_ID, [CLIENT_ID])
    assert claims["sub"] == "dwho" and claims["nonce"] == "nc"
    digest = hashlib.sha256(answer["access_token"].encode()).digest()
    assert claims["at_hash"] == base64.urlsafe_b64encode(digest[:16]).rstrip(b"=").decode()
    assert "email" not in claims  # only userinfo says who the person is

    info = requests.get(
        metadata["userinfo_endpoint"], timeout=TIMEOUT, headers={"Authorization": f"Bearer {answer['access_token']}"}
    ).json()
    assert info["sub"] == "dwho" and info["email"] == "dwho@badwolf.org" and info["email_verified"] is True
    assert info["preferred_username"] == "dwho" and info["name"] == "Doctor Who"
    assert {"timelords", "users", "wiz-admins"} <= set(info["groups"])

    # The code is spent: brought to the platform (with a flow of its own), a readable refusal.
    replay = site.browser()
    state = query_of(site.start(replay))["state"]
    refused = replay.get(
        site.url(CALLBACK) + "?" + urlencode({"code": code, "state": state}), timeout=TIMEOUT, allow_redirects=False
    )
    assert_error_page(refused, 400, "not accepted")


def test_the_client_is_registered_as_the_spec_says(site):
    """PKCE required and exactly one redirect URI, at the provider's side."""
    http = site.browser()
    asked = {
        "response_type": "code",
        "client_id": CLIENT_ID,
        "redirect_uri": site.url(CALLBACK),
        "scope": SCOPES,
        "state": "st",
        "nonce": "nc",
    }
    authorize = site.idp.metadata()["authorization_endpoint"] + "?"
    without_pkce = sign_in(http, authorize + urlencode(asked), "rtyler")
    assert query_of(without_pkce)["error"] == "invalid_request" and "code" not in query_of(without_pkce)
    elsewhere = http.get(
        authorize
        + urlencode(
            {
                **asked,
                "redirect_uri": site.url(CALLBACK) + "x",
                "code_challenge": pkce_pair()[1],
                "code_challenge_method": "S256",
            }
        ),
        timeout=TIMEOUT,
        allow_redirects=False,
    )
    # The portal's error page, PE_UNAUTHORIZEDURL (108), and no redirect anywhere.
    assert elsewhere.status_code == 200 and "Location" not in elsewhere.headers
    assert 'class="message message-negative alert"' in elsewhere.text and 'trmsg="108"' in elsewhere.text


def test_a_wrong_state_is_a_readable_refusal(site):
    http = site.browser()
    callback = site.to_callback(http, "rtyler")
    forged = site.url(CALLBACK) + "?" + urlencode({**query_of(callback), "state": "x" + query_of(callback)["state"]})
    assert_error_page(http.get(forged, timeout=TIMEOUT, allow_redirects=False), 401, "could not be matched")


def test_an_expired_id_token_is_a_readable_refusal(site):
    try:
        site.idp.reconfigure(IDTokenExpiration=-3600)  # every id_token expired an hour ago
        http, answer = site.sso("rtyler")
        assert_error_page(answer, 502, "could not be verified")
        assert http.get(site.url("/api/v2/users/me"), timeout=TIMEOUT).status_code == 401
    finally:
        site.idp.reconfigure(IDTokenExpiration=3600)
    _, answer = site.sso("rtyler")
    assert answer.status_code == 303


def test_a_rotated_signing_key_is_fetched_again(site):
    http, answer = site.sso("rtyler")  # the platform holds the current keys
    assert answer.status_code == 303
    site.idp.rotate_key()  # a new key under a new id
    http, answer = site.sso("rtyler")
    assert answer.status_code == 303, answer.text
    site.idp.rotate_key(same_id=True)  # a new key under the same id
    http, answer = site.sso("rtyler")
    assert answer.status_code == 303, answer.text
    assert site.me(http)["username"] == "rtyler"


# --- an issuer announced with a trailing slash ---------------------------------------------------


@pytest.mark.parametrize("configured", ["as announced", "without the slash"])
def test_an_issuer_with_a_trailing_slash(configured, start_module_service, tmp_path_factory):
    made = make_site(
        start_module_service,
        tmp_path_factory,
        issuer_suffix="/",
        configured_issuer=None if configured == "as announced" else (lambda idp: idp.issuer[:-1]),
    )
    try:
        assert made.idp.metadata()["issuer"].endswith("/")
        http, answer = made.sso("rtyler")
        assert answer.status_code == 303, answer.text
        assert made.me(http)["username"] == "rtyler"
        assert [link["issuer"] for link in made.rows("SELECT issuer FROM oidclink")] == [made.idp.issuer]
    finally:
        stop_site(made)
