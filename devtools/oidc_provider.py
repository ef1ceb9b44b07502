"""An OpenID Connect provider shaped like Authelia, for the tests and the staging box.

It stands in for the real identity provider, which is outside this machine. It is
built on authlib's server components and speaks the real protocol: discovery, the
authorization-code flow with PKCE, signed id_tokens, userinfo. Not app code: it
imports nothing from app/.

    with OidcProvider(config) as idp:         # 127.0.0.1, a free port, a thread
        idp.issuer                            # http://127.0.0.1:PORT
        sign_in(http, authorization_url, "alice", "password")  # -> the redirect URI

    python -m devtools.oidc_provider --config idp.yml --port 9091
    python -m devtools.oidc_provider digest < secret.txt   # prints $pbkdf2-sha512$...

Paths as Authelia serves them: /.well-known/openid-configuration,
/api/oidc/authorization, /api/oidc/token, /api/oidc/userinfo, /jwks.json; and for
forward auth (nginx auth_request) /api/firstfactor (portal sign-in, JSON) and
/api/authz/auth-request (200 with Remote-User/-Groups/-Name/-Email, or 401).

What a client registration (spec 000 A, "Identity-provider-side client registration")
promises, and so what this provider enforces:
- confidential client, the secret stored only as a `$pbkdf2-sha512$` digest;
- `client_secret_basic` only at the token endpoint (client_secret_post: invalid_client);
- exactly one redirect URI, compared exactly; `redirect_uri` is required;
- PKCE required, S256 only; the code is single-use and lives 60 s;
- implicit consent behind a one-factor login form (username + password);
- a minimal id_token (no email, no groups): those are only in userinfo, as Authelia does.

Config (a dict, or a YAML/JSON file for the command line); omitted client keys take
the values of the spec's registration table, other values are refused:

    issuer: optional; default: the address the provider is served on
    clients:
      - client_id: workspace
        client_secret_digest: "$pbkdf2-sha512$310000$<salt ab64>$<checksum ab64>"
        redirect_uris: ["https://workspace.example/api/v2/users/oidc/callback"]
        public: false, authorization_policy: one_factor, consent_mode: implicit,
        token_endpoint_auth_method: client_secret_basic, pkce_challenge_method: S256,
        scopes: [openid, profile, email, groups], grant_types: [authorization_code],
        response_types: [code], client_name: optional
    users:
      - username: alice, password: "...", email: alice@example.com,
        email_verified: true (default), name: Alice (default: username),
        groups: [admins] (default []), sub: optional (default: a UUID derived from username)
"""

import argparse
import base64
import getpass
import hashlib
import hmac
import json
import os
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import requests
from authlib.integrations.flask_oauth2 import AuthorizationServer, ResourceProtector
from authlib.oauth2 import OAuth2Error
from authlib.oauth2.rfc6749 import ClientMixin, InvalidRequestError, TokenMixin, grants
from authlib.oauth2.rfc6749.util import list_to_scope, scope_to_list
from authlib.oauth2.rfc6750 import BearerTokenValidator
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oidc.core import OpenIDCode, UserInfo, UserInfoEndpoint
from authlib.oidc.core.models import AuthorizationCodeMixin
from flask import Flask, jsonify, render_template_string, request, session
from joserfc.jwk import KeySet, RSAKey
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.serving import WSGIRequestHandler, make_server

SUPPORTED_SCOPES = ["openid", "profile", "email", "groups"]
CODE_LIFETIME = 60  # Authelia's default authorize_code lifespan: 1 minute
ACCESS_TOKEN_LIFETIME = 3600
ID_TOKEN_LIFETIME = 3600
DEFAULT_ROUNDS = 310000  # Authelia's default for pbkdf2-sha512
SESSION_COOKIE = "authelia_session"
# A client registration takes these values when the key is omitted; no other value is accepted.
CLIENT_FIXED = {
    "public": False,
    "authorization_policy": "one_factor",
    "consent_mode": "implicit",
    "token_endpoint_auth_method": "client_secret_basic",
    "grant_types": ["authorization_code"],
    "response_types": ["code"],
    "pkce_challenge_method": "S256",
}
CLIENT_KEYS = {"client_id", "client_name", "client_secret_digest", "redirect_uris", "scopes", *CLIENT_FIXED}
USER_KEYS = {"username", "password", "email", "email_verified", "name", "groups", "sub"}
SUB_NAMESPACE = uuid.UUID("6d1b1c1e-52b5-4c3e-9a47-0e8e4e2f7a10")


# --- Client secret digests: passlib's / Authelia's modular-crypt pbkdf2-sha512 -------------


def _ab64_encode(raw):
    """passlib's "adapted base64": standard base64 with '.' for '+' and no padding."""
    return base64.b64encode(raw).decode("ascii").rstrip("=").replace("+", ".")


def _ab64_decode(text):
    text = text.replace(".", "+")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def pbkdf2_sha512_digest(secret, salt=None, rounds=DEFAULT_ROUNDS):
    """`$pbkdf2-sha512$<rounds>$<salt>$<checksum>`, as `authelia crypto hash generate
    pbkdf2 --variant sha512` and passlib's pbkdf2_sha512 write it (16-byte salt)."""
    secret = secret.encode() if isinstance(secret, str) else secret
    salt = os.urandom(16) if salt is None else salt
    checksum = hashlib.pbkdf2_hmac("sha512", secret, salt, rounds)
    return f"$pbkdf2-sha512${rounds}${_ab64_encode(salt)}${_ab64_encode(checksum)}"


def parse_pbkdf2_sha512(digest):
    """(rounds, salt, checksum) of a digest; ValueError when it is not one."""
    parts = digest.split("$") if isinstance(digest, str) else []
    if len(parts) != 5 or parts[0] or parts[1] != "pbkdf2-sha512" or not parts[2].isdigit():
        raise ValueError("not a $pbkdf2-sha512$<rounds>$<salt>$<checksum> digest")
    try:
        salt, checksum = _ab64_decode(parts[3]), _ab64_decode(parts[4])
    except ValueError:
        raise ValueError("the salt or checksum of the digest is not adapted base64") from None
    if int(parts[2]) < 1 or not salt or len(checksum) != 64:
        raise ValueError("a pbkdf2-sha512 digest needs rounds, a salt and a 64-byte checksum")
    return int(parts[2]), salt, checksum


def verify_pbkdf2_sha512(secret, digest):
    """True when `secret` matches `digest`; compared in constant time."""
    rounds, salt, checksum = parse_pbkdf2_sha512(digest)
    secret = secret.encode() if isinstance(secret, str) else secret
    return hmac.compare_digest(hashlib.pbkdf2_hmac("sha512", secret, salt, rounds), checksum)


# --- Configuration and the objects authlib works on ----------------------------------------


@dataclass
class Client(ClientMixin):
    client_id: str
    secret_digest: str
    redirect_uri: str
    scopes: list
    client_metadata: dict = field(default_factory=dict)  # read by authlib's UserInfoEndpoint

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return None  # OpenID Connect requires redirect_uri in every authorization request

    def get_allowed_scope(self, scope):
        requested = scope_to_list(scope) or []
        if not set(requested) <= set(self.scopes):
            return None  # authlib answers invalid_scope, as Authelia does for unregistered scopes
        return list_to_scope(requested)

    def check_redirect_uri(self, redirect_uri):
        return redirect_uri == self.redirect_uri  # exact string match, no prefix or pattern

    def check_client_secret(self, client_secret):
        return verify_pbkdf2_sha512(client_secret, self.secret_digest)

    def check_endpoint_auth_method(self, method, endpoint):
        return endpoint == "token" and method == "client_secret_basic"

    def check_response_type(self, response_type):
        return response_type == "code"

    def check_grant_type(self, grant_type):
        return grant_type == "authorization_code"


@dataclass
class User:
    username: str
    password: str
    email: str
    email_verified: bool
    name: str
    groups: list
    sub: str


@dataclass
class AuthorizationCode(AuthorizationCodeMixin):
    code: str
    client_id: str
    redirect_uri: str
    scope: str
    username: str
    auth_time: int
    nonce: str | None
    code_challenge: str
    code_challenge_method: str
    expires_at: float

    def get_redirect_uri(self):
        return self.redirect_uri

    def get_scope(self):
        return self.scope

    def get_nonce(self):
        return self.nonce

    def get_auth_time(self):
        return self.auth_time

    def get_acr(self):
        return None

    def get_amr(self):
        return ["pwd"]  # one factor: a password


@dataclass
class Token(TokenMixin):
    access_token: str
    client: Client
    user: User
    scope: str
    issued_at: float
    expires_in: int

    def check_client(self, client):
        return client.client_id == self.client.client_id

    def get_scope(self):
        return self.scope

    def get_expires_in(self):
        return self.expires_in

    def is_expired(self):
        return time.time() >= self.issued_at + self.expires_in

    def is_revoked(self):
        return False

    def get_user(self):
        return self.user

    def get_client(self):
        return self.client


def _client_from_config(entry):
    if not isinstance(entry, dict):
        raise ValueError("each client is a mapping")
    if "client_secret" in entry:
        raise ValueError("store only the digest of the client secret, as client_secret_digest")
    unknown = set(entry) - CLIENT_KEYS
    if unknown:
        raise ValueError(f"unknown client keys: {', '.join(sorted(unknown))}")
    client_id = entry.get("client_id")
    if not isinstance(client_id, str) or not client_id:
        raise ValueError("a client needs a client_id")
    for key, expected in CLIENT_FIXED.items():
        if entry.get(key, expected) != expected:
            raise ValueError(f"client {client_id}: {key} must be {expected!r}")
    parse_pbkdf2_sha512(entry.get("client_secret_digest"))
    uris = entry.get("redirect_uris")
    if not isinstance(uris, list) or len(uris) != 1 or not isinstance(uris[0], str):
        raise ValueError(f"client {client_id}: exactly one redirect URI is allowed")
    if urlsplit(uris[0]).scheme not in ("http", "https") or urlsplit(uris[0]).fragment:
        raise ValueError(f"client {client_id}: the redirect URI must be an http(s) URL without fragment")
    scopes = entry.get("scopes", SUPPORTED_SCOPES)
    if not isinstance(scopes, list) or "openid" not in scopes or not set(scopes) <= set(SUPPORTED_SCOPES):
        raise ValueError(f"client {client_id}: scopes must include openid, within {SUPPORTED_SCOPES}")
    return Client(client_id, entry["client_secret_digest"], uris[0], list(scopes))


def _user_from_config(entry):
    if not isinstance(entry, dict):
        raise ValueError("each user is a mapping")
    unknown = set(entry) - USER_KEYS
    if unknown:
        raise ValueError(f"unknown user keys: {', '.join(sorted(unknown))}")
    username, password, email = entry.get("username"), entry.get("password"), entry.get("email")
    if not all(isinstance(v, str) and v for v in (username, password, email)):
        raise ValueError("a user needs username, password and email")
    groups = entry.get("groups", [])
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ValueError(f"user {username}: groups is a list of names")
    # Authelia's subject is an opaque UUID; derived from the username so it survives restarts.
    sub = entry.get("sub") or str(uuid.uuid5(SUB_NAMESPACE, username))
    return User(
        username,
        password,
        email,
        bool(entry.get("email_verified", True)),
        entry.get("name") or username,
        list(groups),
        str(sub),
    )


def _index(items, key, what):
    result = {}
    for item in items:
        if getattr(item, key) in result:
            raise ValueError(f"duplicate {what}: {getattr(item, key)}")
        result[getattr(item, key)] = item
    return result


class ProviderState:
    """Everything the provider holds in memory: clients, users, the signing key, issued
    codes and tokens, and the test knobs (down, counts)."""

    def __init__(self, config):
        if not isinstance(config, dict):
            raise ValueError("the provider's config is a mapping")
        unknown = set(config) - {"issuer", "clients", "users"}
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(sorted(unknown))}")
        for key in ("clients", "users"):
            if not isinstance(config.get(key, []), list):
                raise ValueError(f"{key} is a list")
        self.issuer = (config.get("issuer") or "").rstrip("/") or None
        self.clients = _index([_client_from_config(c) for c in config.get("clients") or []], "client_id", "client_id")
        self.users = _index([_user_from_config(u) for u in config.get("users") or []], "username", "username")
        self.key = RSAKey.generate_key(2048, parameters={"use": "sig", "alg": "RS256"}, auto_kid=True)
        # Tests set this to sign id_tokens with a key the JWKS does not publish (a forgery).
        self.signing_key = None
        self.codes = {}
        self.tokens = {}
        self.lock = threading.Lock()
        self.token_lock = threading.Lock()
        self.counts = Counter()
        # False: serve. True or an HTTP status: answer every request with it (True = 503).
        # "close": drop every connection without an answer (see _Handler).
        self.down = False

    def current_issuer(self):
        return self.issuer or request.url_root.rstrip("/")

    def check_password(self, username, password):
        """The user, or None. The same work for an unknown user and a wrong password."""
        user = self.users.get(username)
        expected = user.password if user else "\0 no such user"
        matches = hmac.compare_digest(password.encode(), expected.encode())
        return user if user and matches else None

    def save_token(self, token, oauth_request):
        with self.lock:
            self.tokens[token["access_token"]] = Token(
                token["access_token"],
                oauth_request.client,
                oauth_request.user,
                token.get("scope", ""),
                time.time(),
                token["expires_in"],
            )


# --- authlib server parts ---------------------------------------------------------------


class InvalidStateError(OAuth2Error):
    # Authelia (fosite) refuses a missing or short state with this error.
    error = "invalid_state"
    description = "The state is missing or does not have enough characters."


class AuthorizationCodeGrant(grants.AuthorizationCodeGrant):
    # client_secret_post (and none) are not accepted: the registration says basic only.
    TOKEN_ENDPOINT_AUTH_METHODS = ["client_secret_basic"]

    @property
    def provider(self):
        return self.server.provider_state

    @staticmethod
    def validate_authorization_redirect_uri(request, client):
        # Fixed descriptions: authlib's own quotes the URI, and a quote in it would
        # make the error description invalid (a 500 instead of an error page).
        uri = request.payload.redirect_uri
        if not uri:
            raise InvalidRequestError("Missing 'redirect_uri' in request.")
        if not client.check_redirect_uri(uri):
            raise InvalidRequestError("The 'redirect_uri' is not the one registered for the client.")
        return uri

    def validate_authorization_request(self):
        redirect_uri = super().validate_authorization_request()
        if len(self.request.payload.state or "") < 8:
            raise InvalidStateError(redirect_uri=redirect_uri)
        return redirect_uri

    def save_authorization_code(self, code, request):
        data = request.payload.data
        item = AuthorizationCode(
            code,
            request.client.client_id,
            request.payload.redirect_uri,
            request.scope,
            request.user.username,
            session.get("auth_time") or int(time.time()),
            data.get("nonce"),
            data["code_challenge"],
            data["code_challenge_method"],
            time.time() + CODE_LIFETIME,
        )
        with self.provider.lock:
            self.provider.codes[code] = item

    def query_authorization_code(self, code, client):
        item = self.provider.codes.get(code)
        if item and item.client_id == client.client_id and time.time() < item.expires_at:
            return item
        return None

    def delete_authorization_code(self, authorization_code):
        with self.provider.lock:
            self.provider.codes.pop(authorization_code.code, None)

    def authenticate_user(self, authorization_code):
        return self.provider.users.get(authorization_code.username)


class RequireS256(CodeChallenge):
    """PKCE as registered: a challenge is required and S256 is the only method
    (authlib's default lets a confidential client omit PKCE and accepts 'plain')."""

    SUPPORTED_CODE_CHALLENGE_METHOD = ["S256"]

    def validate_code_challenge(self, grant, redirect_uri):
        data = grant.request.payload.data
        if not data.get("code_challenge"):
            raise InvalidRequestError("Clients must include a 'code_challenge' (PKCE is required).")
        if data.get("code_challenge_method") != "S256":
            raise InvalidRequestError("The 'code_challenge_method' must be S256.")
        super().validate_code_challenge(grant, redirect_uri)


class MinimalOpenIDCode(OpenIDCode):
    """The id_token as Authelia makes it: iss, sub, aud, azp, exp, iat, auth_time, amr,
    at_hash, jti and the nonce when one was sent. No profile, email or groups claims:
    a client must fetch those from userinfo."""

    DEFAULT_EXPIRES_IN = ID_TOKEN_LIFETIME

    def __init__(self, state):
        super().__init__(require_nonce=False)
        self.state = state

    def exists_nonce(self, nonce, request):
        # Authelia keeps no record of nonces: it is the client that matches the id_token's
        # nonce against the one it sent. So no nonce is refused as a replay here.
        return False

    def resolve_client_private_key(self, client):
        return self.state.signing_key or self.state.key

    def get_encode_header(self, client):
        return {"alg": "RS256", "kid": (self.state.signing_key or self.state.key).kid}

    def get_client_claims(self, client):
        return {
            "iss": self.state.current_issuer(),
            "aud": [client.client_id],
            "azp": client.client_id,
            "jti": str(uuid.uuid4()),
        }

    def generate_user_info(self, user, scope):
        return UserInfo(sub=user.sub)


class AutheliaUserInfo(UserInfoEndpoint):
    def get_issuer(self):
        return self.server.provider_state.current_issuer()

    def generate_user_info(self, user, scope):
        scopes = scope_to_list(scope)
        claims = {"sub": user.sub}
        if "profile" in scopes:
            claims.update(name=user.name, preferred_username=user.username)
        if "email" in scopes:
            claims.update(email=user.email, email_verified=user.email_verified)
        if "groups" in scopes:
            claims["groups"] = list(user.groups)
        return UserInfo(claims)


class AccessTokenValidator(BearerTokenValidator):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def authenticate_token(self, token_string):
        return self.state.tokens.get(token_string)


# --- Pages ------------------------------------------------------------------------------

LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in</title></head>
<body>
<h1>Sign in</h1>
{% if message %}<p role="alert">{{ message }}</p>{% endif %}
<form method="post" action="{{ action }}">
  <label for="username">Username</label> <input id="username" name="username" autocomplete="username" required>
  <label for="password">Password</label>
  <input id="password" name="password" type="password" autocomplete="current-password" required>
  <button type="submit">Sign in</button>
</form>
</body></html>
"""

ERROR_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Authorization error</title></head>
<body>
<h1>Authorization error</h1>
<p><code>{{ error }}</code>: {{ description }}</p>
</body></html>
"""

ENDPOINTS = {
    "discovery": "/.well-known/openid-configuration",
    "authorization": "/api/oidc/authorization",
    "token": "/api/oidc/token",
    "userinfo": "/api/oidc/userinfo",
    "jwks": "/jwks.json",
    "firstfactor": "/api/firstfactor",
    "authz": "/api/authz/auth-request",
}


def create_provider(config):
    """The provider as a Flask app; its state is `app.extensions["oidc_provider"]`.
    Raises ValueError for a config it cannot honour."""
    state = ProviderState(config)
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=os.urandom(32),
        SESSION_COOKIE_NAME=SESSION_COOKIE,
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=(state.issuer or "").startswith("https://"),
        OAUTH2_SCOPES_SUPPORTED=SUPPORTED_SCOPES,
        OAUTH2_TOKEN_EXPIRES_IN={"authorization_code": ACCESS_TOKEN_LIFETIME},
    )
    app.extensions["oidc_provider"] = state
    if (state.issuer or "").startswith("https://"):
        # An https issuer means TLS ends at a proxy (nginx) in front of this plain-http
        # server: trust its X-Forwarded-Proto/Host, or authlib refuses every request as
        # insecure transport.
        app.wsgi_app = ProxyFix(app.wsgi_app, x_proto=1, x_host=1)

    server = AuthorizationServer(app, query_client=state.clients.get, save_token=state.save_token)
    server.provider_state = state
    server.register_grant(AuthorizationCodeGrant, [RequireS256(), MinimalOpenIDCode(state)])
    protector = ResourceProtector()
    protector.register_token_validator(AccessTokenValidator(state))
    server.register_endpoint(AutheliaUserInfo(resource_protector=protector))

    @app.before_request
    def count_and_maybe_fail():
        with state.lock:
            state.counts[request.endpoint or "unknown"] += 1
        if state.down:
            status = 503 if state.down is True else int(state.down)
            return "The identity provider is unavailable.\n", status, {"Content-Type": "text/plain"}
        return None

    @app.get(ENDPOINTS["discovery"], endpoint="discovery")
    def discovery():
        issuer = state.current_issuer()
        return jsonify(
            {
                "issuer": issuer,
                "authorization_endpoint": issuer + ENDPOINTS["authorization"],
                "token_endpoint": issuer + ENDPOINTS["token"],
                "userinfo_endpoint": issuer + ENDPOINTS["userinfo"],
                "jwks_uri": issuer + ENDPOINTS["jwks"],
                "response_types_supported": ["code"],
                "response_modes_supported": ["query"],
                "grant_types_supported": ["authorization_code"],
                "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["client_secret_basic"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "scopes_supported": SUPPORTED_SCOPES,
                "subject_types_supported": ["public"],
                "claims_supported": [
                    "iss",
                    "sub",
                    "aud",
                    "azp",
                    "exp",
                    "iat",
                    "auth_time",
                    "amr",
                    "nonce",
                    "at_hash",
                    "jti",
                    "name",
                    "preferred_username",
                    "email",
                    "email_verified",
                    "groups",
                ],
            }
        )

    @app.get(ENDPOINTS["jwks"], endpoint="jwks")
    def jwks():
        return jsonify(KeySet([state.key]).as_dict(private=False))

    def signed_in_user():
        return state.users.get(session.get("username") or "")

    def error_page(error, description, status=400):
        return render_template_string(ERROR_PAGE, error=error, description=description), status

    def login_page(message=None, status=200):
        return render_template_string(LOGIN_PAGE, action=request.full_path, message=message), status

    @app.route(ENDPOINTS["authorization"], methods=["GET", "POST"], endpoint="authorization")
    def authorization():
        try:
            grant = server.get_consent_grant(end_user=signed_in_user())
        except OAuth2Error as error:
            if error.redirect_uri:  # the client and its redirect URI are known: tell the client
                return server.handle_error_response(None, error)
            # Unknown client or a redirect URI that is not the registered one: never redirect.
            return error_page(error.error, error.description, error.status_code or 400)
        except ValueError:  # a parameter authlib cannot even quote in an error description
            return error_page("invalid_request", "The request has malformed parameters.")

        user = signed_in_user()
        if request.method == "POST":
            user = state.check_password(request.form.get("username", ""), request.form.get("password", ""))
            if user is None:
                return login_page("Incorrect username or password.", 401)
            session.clear()
            session.update(username=user.username, auth_time=int(time.time()))
        elif user is None or grant.prompt == "login":
            return login_page()
        # Consent is implicit: a signed-in user goes straight back to the client with a code.
        return server.create_authorization_response(grant_user=user, grant=grant)

    @app.post(ENDPOINTS["token"], endpoint="token")
    def token():
        # One exchange at a time, so two requests racing with one code still use it once.
        with state.token_lock:
            return server.create_token_response()

    @app.route(ENDPOINTS["userinfo"], methods=["GET", "POST"], endpoint="userinfo")
    def userinfo():
        return server.create_endpoint_response("userinfo")

    @app.post(ENDPOINTS["firstfactor"], endpoint="firstfactor")
    def firstfactor():
        """Authelia's portal sign-in (JSON {username, password}): opens a session
        without any OIDC client, as for the forward-auth sites."""
        body = request.get_json(silent=True) or {}
        user = state.check_password(str(body.get("username", "")), str(body.get("password", "")))
        if user is None:
            return jsonify({"status": "KO", "message": "Authentication failed."}), 401
        session.clear()
        session.update(username=user.username, auth_time=int(time.time()))
        return jsonify({"status": "OK"})

    @app.route(ENDPOINTS["authz"], methods=["GET", "HEAD", "POST"], endpoint="authz")
    def authz():
        """Forward auth for nginx's auth_request, as Authelia's /api/authz/auth-request:
        200 with the Remote-* headers for a signed-in session, 401 otherwise."""
        user = signed_in_user()
        if user is None:
            return "", 401
        return (
            "",
            200,
            {
                "Remote-User": user.username,
                "Remote-Groups": ",".join(user.groups),
                "Remote-Name": user.name,
                "Remote-Email": user.email,
            },
        )

    @app.route("/logout", methods=["GET", "POST"], endpoint="logout")
    def logout():
        session.clear()
        return "Signed out.\n", 200, {"Content-Type": "text/plain"}

    return app


# --- Running it ---------------------------------------------------------------------------


class _Handler(WSGIRequestHandler):
    def handle(self):
        # down == "close": hang up without an answer, like a provider that crashed mid-request.
        if self.server.app.extensions["oidc_provider"].down == "close":
            return
        super().handle()


class OidcProvider:
    """The provider served on `host` (127.0.0.1) and a free port, in a background thread.

    Knobs and read-outs:
    - issuer: its base URL once started (http://127.0.0.1:PORT, or the config's issuer);
      discovery_url: issuer + /.well-known/openid-configuration; port.
    - down: False; True or an HTTP status answers every request with it (True = 503);
      "close" drops every connection without an answer. stop() makes it refuse
      connections; start() again serves on the same port with the same key, codes and
      tokens.
    - counts: requests per endpoint ("discovery", "authorization", "token", "userinfo",
      "jwks", "logout", "unknown"), a Counter; counts.clear() resets it.
    - state: the ProviderState (clients, users, codes, tokens, key), for inspection.
    """

    def __init__(self, config, host="127.0.0.1", port=0):
        self.app = create_provider(config)
        self.state = self.app.extensions["oidc_provider"]
        self.host, self.port = host, port
        self._server = self._thread = None

    @property
    def issuer(self):
        return self.state.issuer  # None until started, unless the config names one

    @property
    def discovery_url(self):
        return self.issuer + ENDPOINTS["discovery"]

    @property
    def down(self):
        return self.state.down

    @down.setter
    def down(self, value):
        self.state.down = value

    @property
    def counts(self):
        return self.state.counts

    def start(self):
        if self._server is not None:
            return self
        self._server = make_server(self.host, self.port, self.app, threaded=True, request_handler=_Handler)
        self.port = self._server.port
        if not self.state.issuer:  # kept on restart: start() reuses the port
            self.state.issuer = f"http://{self.host}:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="oidc-provider", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def sign_in(http, authorization_url, username, password):
    """Drive the provider's side of a sign-in with a requests.Session `http`, as a browser
    would: open the authorization URL, post the login form (skipped when `http` already
    holds a provider session), and return the Location of the redirect back to the
    client (its redirect URI with code and state, or with error), without following it.
    Raises AssertionError when the provider answers otherwise (error page, bad login)."""
    response = http.get(authorization_url, allow_redirects=False, timeout=10)
    if response.status_code == 200:  # the login form; it posts back to the same URL
        response = http.post(
            authorization_url, data={"username": username, "password": password}, allow_redirects=False, timeout=10
        )
    if response.status_code != 302:
        raise AssertionError(f"the provider answered {response.status_code}: {response.text[:300]}")
    return response.headers["Location"]


def portal_session(issuer, username, password):
    """The provider's session cookie value after a portal sign-in (/api/firstfactor): what
    a browser then sends to the forward-auth sites (Authelia's cookie covers the parent
    domain). Raises AssertionError when the sign-in is refused."""
    http = requests.Session()
    answer = http.post(issuer + ENDPOINTS["firstfactor"], json={"username": username, "password": password}, timeout=10)
    if answer.status_code != 200:
        raise AssertionError(f"the provider refused the sign-in: {answer.status_code} {answer.text[:200]}")
    return http.cookies[SESSION_COOKIE]


def load_config_file(path):
    """A config from a .json file, or YAML from any other name (systemd's credentials
    have none); ValueError when unreadable."""
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".json":
        config = json.loads(text)
    else:
        import yaml

        try:
            config = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ValueError(f"not valid YAML: {error}") from None
    if not isinstance(config, dict):
        raise ValueError("the config is a mapping with clients and users")
    return config


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m devtools.oidc_provider",
        description="An Authelia-shaped OpenID Connect provider (serve), or the "
        "$pbkdf2-sha512$ digest of a client secret read from stdin (digest).",
    )
    parser.add_argument("command", nargs="?", choices=["serve", "digest"], default="serve")
    parser.add_argument("--config", help="YAML or JSON file: issuer?, clients, users")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9091)
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="digest: PBKDF2 rounds")
    args = parser.parse_args(argv)

    if args.command == "digest":
        secret = getpass.getpass("Client secret: ") if sys.stdin.isatty() else sys.stdin.read()
        secret = secret.rstrip("\r\n")
        if not secret:
            parser.error("no secret on stdin")
        print(pbkdf2_sha512_digest(secret, rounds=args.rounds))
        return 0

    if not args.config:
        parser.error("serve needs --config FILE")
    try:
        config = load_config_file(args.config)
        config = {**config, "issuer": config.get("issuer") or f"http://{args.host}:{args.port}"}
        app = create_provider(config)
    except (OSError, ValueError) as error:
        parser.exit(2, f"{parser.prog}: {args.config}: {error}\n")
    server = make_server(args.host, args.port, app, threaded=True, request_handler=_Handler)
    print(f"OIDC provider: issuer {config['issuer']}, serving on {args.host}:{args.port}", file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
