"""What the single sign-on tests (test_oidc.py) stand on: an Authelia-shaped OIDC provider
(devtools.oidc_provider, authlib's server components) and the workspace service under
gunicorn configured against it, with a browser-like HTTP client to drive the chain.

The provider registers one confidential client whose secret it knows only as a
`$pbkdf2-sha512$` digest, with exactly one redirect URI: the service's callback. The
service's port is chosen first, so that the redirect URI and WORKSPACE_ACCESS_URL name it.

Platform accounts made at set-up: the Owner (owner@example.com, POST /users/first) and
bob (bob@example.com, a password account made by the Owner). Provider users:

| provider user | email                  | verified | meant to                                   |
|---------------|------------------------|----------|--------------------------------------------|
| olivia        | Owner@Example.COM      | yes      | link to the Owner (case-insensitive email) |
| mallory       | bob@example.com        | no       | be refused: unverified, matches bob        |
| dave          | dave@example.net       | yes      | get a new account                          |
| Bob           | robert@example.net     | yes      | get a new account named Bob-2 (bob taken)  |
| Erin O'Neil   | erin@example.net       | yes      | get a new account named Erin-O-Neil        |
| frank         | frank@example.net      | no       | get a new account (no email to link to)    |
"""

import html
import re
import secrets
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urljoin, urlsplit

import requests

from devtools import services
from devtools.database_peek import peek
from devtools.oidc_provider import OidcProvider, pbkdf2_sha512_digest, sign_in

CLIENT_ID = "workspace"
SIGN_IN_TEXT = "Sign in with Example SSO"
CALLBACK = "/api/v2/users/oidc/callback"
OWNER = {"email": "owner@example.com", "username": "owner", "password": "Tr1cky-horse-battery"}
BOB = {"email": "bob@example.com", "username": "bob", "password": "Bl4ck-cat-on-piano", "login_type": "password"}
PASSWORD = "idp-pass-9ZqW"  # every provider user's password
PROVIDER_USERS = [
    {"username": "olivia", "email": "Owner@Example.COM", "email_verified": True, "name": "Olivia Owner"},
    {"username": "mallory", "email": "bob@example.com", "email_verified": False},
    {"username": "dave", "email": "dave@example.net", "email_verified": True, "name": "Dave", "groups": ["developers"]},
    {"username": "Bob", "email": "robert@example.net", "email_verified": True},
    {"username": "Erin O'Neil", "email": "erin@example.net", "email_verified": True},
    {"username": "frank", "email": "frank@example.net", "email_verified": False},
]
TIMEOUT = 15


@dataclass
class Stack:
    """A provider and a workspace service configured against it."""

    idp: OidcProvider
    service: object
    client_secret: str
    owner_token: str = ""
    owner_id: str = ""
    bob_id: str = ""
    browsers: list = field(default_factory=list)

    @property
    def base_url(self):
        return self.service.base_url

    @property
    def data_dir(self):
        return Path(self.service.data_dir)

    def url(self, path):
        return self.base_url + path

    def callback_url(self, **params):
        return self.url(CALLBACK) + ("?" + urlencode(params) if params else "")

    def db(self):
        """The service's database (either engine), as the tests check what it stored."""
        return peek(self.service)

    def rows(self, sql, *params):
        with self.db() as connection:
            return [dict(row) for row in connection.execute(sql, params)]

    def user_count(self):
        return self.rows('SELECT count(*) AS n FROM "user"')[0]["n"]

    def api(self, method, path, token=None, **kwargs):
        headers = {"Workspace-Session-Token": token} if token else {}
        return requests.request(
            method, self.url(path), headers=headers, timeout=TIMEOUT, allow_redirects=False, **kwargs
        )

    # --- the browser's side of the chain -------------------------------------------

    def browser(self):
        """A cookie-keeping HTTP client, closed at the end of the test (an idle
        keep-alive connection would hold the stopping worker)."""
        http = requests.Session()
        self.browsers.append(http)
        return http

    def button_href(self, http, redirect=None):
        """GET /login (with ?redirect=) and the href of the single-sign-on button."""
        page = http.get(
            self.url("/login"),
            params={"redirect": redirect} if redirect else None,
            timeout=TIMEOUT,
            allow_redirects=False,
        )
        assert page.status_code == 200, page.text
        match = re.search(r'<a class="button sso" id="sso" href="([^"]+)">\s*(.*?)\s*</a>', page.text, re.S)
        assert match, "the login page has no single-sign-on button"
        assert html.unescape(match.group(2)) == SIGN_IN_TEXT
        return urljoin(self.base_url, html.unescape(match.group(1)))

    def start(self, http, url):
        """GET the callback without code: the redirect to the provider (its Location)."""
        response = http.get(url, timeout=TIMEOUT, allow_redirects=False)
        assert response.status_code in (302, 303), (response.status_code, response.text)
        location = response.headers["Location"]
        assert location.startswith(self.idp.issuer + "/api/oidc/authorization?"), location
        return location

    def to_callback(self, http, username, redirect=None, url=None):
        """Button (or `url`) → provider → its login form: the callback URL it sends us to."""
        authorization = self.start(http, url or self.button_href(http, redirect))
        location = sign_in(http, authorization, username, PASSWORD)
        assert location.startswith(self.callback_url()), location
        return location

    def finish(self, http, callback):
        """GET the callback with the provider's code: the platform's answer."""
        return http.get(callback, timeout=TIMEOUT, allow_redirects=False)

    def sso(self, username, redirect=None, http=None):
        """The whole chain as a browser does it: (http session, the callback's answer)."""
        http = http or self.browser()
        return http, self.finish(http, self.to_callback(http, username, redirect))

    def me(self, http):
        return http.get(self.url("/api/v2/users/me"), timeout=TIMEOUT, allow_redirects=False)


def assert_error_page(response, status, *phrases):
    """A readable HTML page (not JSON, not a 500) with a way back to /login."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    assert response.headers["Content-Type"].startswith("text/html")
    assert 'href="/login"' in response.text
    assert "workspace_session_token" not in response.headers.get("Set-Cookie", "")
    for phrase in phrases:
        assert phrase in response.text, response.text


def flow_cookies(http):
    return {c.name: c for c in http.cookies if c.name.startswith("oidc_")}


def query_of(url):
    return {k: v[0] for k, v in parse_qs(urlsplit(url).query, keep_blank_values=True).items()}


def set_cookie_headers(response):
    return response.raw.headers.getlist("Set-Cookie")


def as_uuid(value):
    return uuid.UUID(str(value))


@contextmanager
def stack_factory(start_service, db_backend=None):
    """The body of test_oidc.py's `oidc_stack` fixture (`start_service` and
    `db_backend`: the fixtures of tests/conftest.py). Yields
    make(env=None, users=PROVIDER_USERS, secret_at_platform=None, oidc=True) -> Stack:
    a provider (started) and a workspace service with the Owner and bob created.
    `env`: more environment for the service, or a function of the provider that
    returns it."""
    stacks, providers = [], []

    def make(env=None, users=PROVIDER_USERS, secret_at_platform=None, oidc=True):
        secret = secrets.token_urlsafe(32)
        with services.held_port() as port:  # until the provider has a port of its own
            base_url = f"http://127.0.0.1:{port}"
            idp = OidcProvider(
                {
                    "clients": [
                        {
                            "client_id": CLIENT_ID,
                            "client_name": "Workspace",
                            "client_secret_digest": pbkdf2_sha512_digest(secret),
                            "redirect_uris": [base_url + CALLBACK],
                        }
                    ],
                    "users": [{**user, "password": PASSWORD} for user in users],
                }
            ).start()
        providers.append(idp)
        environment = {"WORKSPACE_ACCESS_URL": base_url, **(db_backend.env() if db_backend else {})}
        if oidc:
            environment.update(
                {
                    "WORKSPACE_OIDC_ISSUER_URL": idp.issuer,
                    "WORKSPACE_OIDC_CLIENT_ID": CLIENT_ID,
                    "WORKSPACE_OIDC_CLIENT_SECRET": secret if secret_at_platform is None else secret_at_platform,
                    "WORKSPACE_OIDC_SIGN_IN_TEXT": SIGN_IN_TEXT,
                }
            )
        environment.update((env(idp) if callable(env) else env) or {})
        service = start_service("workspace", env=environment, port=port)
        stack = Stack(idp, service, secret)
        stacks.append(stack)
        first = stack.api("POST", "/api/v2/users/first", json=OWNER)
        assert first.status_code == 201, first.text
        stack.owner_token, stack.owner_id = first.json()["session_token"], first.json()["user_id"]
        bob = stack.api("POST", "/api/v2/users", token=stack.owner_token, json=BOB)
        assert bob.status_code == 201, bob.text
        stack.bob_id = bob.json()["id"]
        return stack

    try:
        yield make
    finally:
        for stack in stacks:
            for http in stack.browsers:
                http.close()
        for idp in providers:
            idp.stop()
