"""Workspace apps on hosts of their own (WORKSPACE_WILDCARD_ACCESS_URL, as Coder's
CODER_WILDCARD_ACCESS_URL): with `*.apps.example.org`, the app `code` of agent `main`
of workspace `dev` of user `alice` is served at

    https://code--main--dev--alice.apps.example.org/<path>

a different origin from the platform's, so that the platform's cookie never reaches
the app's pages and their script cannot call the platform with the visitor's
credentials. Names holding `--` have no such host (the label would be ambiguous).

The handshake (the platform's session cookie is host-only: it never comes here):
1. An app host request without an app token: a browser's GET is sent to the
   platform, `/api/v2/applications/auth-redirect?redirect_uri=<this URL>` (apps.py).
2. The platform, signed in (else its login page first), checks that the visitor may
   open that app and sends the browser back to `redirect_uri` with a ticket in
   TICKET_PARAM: sealed (encrypted and authenticated), bound to that host and the
   session key, valid TICKET_SECONDS and spent at its first use.
3. The app host redeems it and sets COOKIE, its own host-only cookie: an app token
   valid on that host only (not on the API, not on another app) until the session's
   expiry or TOKEN_SECONDS, whichever comes first; then it redirects to the clean URL.
   Every use checks the session key it was minted from: signing out, a revoked
   session or a lost right to the app stop it (grants.py keeps the check meanwhile).
Machine clients may send the `Workspace-Session-Token` header instead.

The seal's key: WORKSPACE_APP_TOKEN_SECRET; else, with REDIS_URL (several workers or
hosts), derived from WORKSPACE_MESH_SECRET (which every host shares already); else a
secret made once in DATA_DIR/app-token-secret (0600).
"""

import base64
import functools
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, urlencode, urlsplit

import redis
from cryptography.fernet import Fernet, InvalidToken
from flask import current_app
from werkzeug.http import parse_cookie

from app.common import redis_client
from app.common.failures import Forbidden, Unauthenticated, Unavailable
from app.workspace.access import sessions
from app.workspace.core.models import ApiKey, User, now

COOKIE = "workspace_app_token"
TICKET_PARAM = "workspace_app_ticket"
TICKET_SECONDS = 60
TOKEN_SECONDS = 8 * 3600  # a working day; the handshake makes a new one
AUTH_REDIRECT = "/api/v2/applications/auth-redirect"
SEPARATOR = "--"
# Set by the front on a request that came to an app host: its AppHost (None: no such app).
ENVIRON_KEY = "bundle.workspace.app_host"
# Where an app host request that names no app is routed (it answers 404).
NO_APP_PATH = "/@-/-/apps/-"
SECRET_FILE = "app-token-secret"


@dataclass(frozen=True)
class AppHost:
    hostname: str  # lower case, without the port
    slug: str
    agent: str
    workspace: str
    user: str

    @property
    def label(self):
        """The host's first label."""
        return SEPARATOR.join((self.slug, self.agent, self.workspace, self.user))

    @property
    def target(self):
        return f"{self.workspace}.{self.agent}"

    @property
    def path_prefix(self):
        """The app's path form, under which the platform routes it."""
        return f"/@{self.user}/{self.target}/apps/{self.slug}"


def host_label(slug: str, agent: str, workspace: str, user: str) -> str | None:
    """The first label of an app's host, or None when a name holds the separator."""
    names = (slug, agent, workspace, user.lower())
    return None if any(SEPARATOR in name for name in names) else SEPARATOR.join(names)


def app_url(settings, slug: str, agent: str, workspace: str, user: str) -> str | None:
    """`http(s)://<app's host>/`, or None without app hosts or for a name holding `--`."""
    label = host_label(slug, agent, workspace, user)
    return settings.app_host_url(label) + "/" if settings.app_hosts_enabled and label else None


def app_host_of(environ: dict, settings) -> tuple[bool, AppHost | None]:
    """(whether the request's Host is an app host, the AppHost it names or None).

    Every name under the apps' suffix but the platform's own is an app host, however
    many labels it has: nginx's `*.apps.example.org` serves `a.b.apps.example.org` too,
    and such a host must get the 404 of an unknown app, never the platform's routes
    (its API, its `/metrics`). Only a one-label name of four parts names an app."""
    if not settings.app_hosts_enabled:
        return False, None
    hostname = environ.get("HTTP_HOST", "").partition(":")[0].lower().rstrip(".")  # app hosts are names
    suffix = settings.app_host_suffix
    if not hostname.endswith(suffix) or hostname == _platform_hostname(settings.access_url):
        return False, None
    label = hostname[: -len(suffix)]
    names = label.split(SEPARATOR)
    if "." in label or len(names) != 4 or not all(names):
        return True, None
    return True, AppHost(hostname, *names)


@functools.lru_cache(maxsize=4)
def _platform_hostname(access_url: str) -> str:
    """WORKSPACE_ACCESS_URL's host name: it may lie under the apps' suffix with more than
    one label (`ws.corp.example.org` beside `*.example.org`: the settings refuse one label)."""
    return (urlsplit(access_url).hostname or "").lower().rstrip(".")


def enter(environ: dict, app_host: AppHost | None):
    """Route an app host request as its app's path form (the request log names the
    app; the app still sees the path the client asked for: RAW_URI is kept)."""
    path = environ.get("PATH_INFO", "")
    environ["RAW_URI"] = raw_uri(environ)
    environ[ENVIRON_KEY] = app_host
    prefix = app_host.path_prefix if app_host else NO_APP_PATH
    environ["PATH_INFO"] = prefix + (path if path.startswith("/") else "/" + path)


def raw_uri(environ: dict) -> str:
    """`/<path>?<query>` as the client sent it, still percent-encoded: gunicorn's
    RAW_URI, or (the tests' in-process client) rebuilt from PATH_INFO and the query."""
    raw = environ.get("RAW_URI")
    if raw is None:
        query = environ.get("QUERY_STRING", "")
        raw = quote(environ.get("PATH_INFO", "").encode("latin-1"), safe="/:@!$&'()*+,;=~") + (
            f"?{query}" if query else ""
        )
    return raw


def without_parameters(raw_target: str, names) -> str:
    """A `/path?query` less the query parameters `names`."""
    path, _, query = raw_target.partition("?")
    kept = [item for item in query.split("&") if item and item.split("=", 1)[0] not in names]
    return path + ("?" + "&".join(kept) if kept else "")


def without_ticket(raw_target: str) -> str:
    return without_parameters(raw_target, {TICKET_PARAM})


# --------------------------------------------------------------------------- the handshake's URLs


def auth_redirect_url(settings, app_host: AppHost, raw_target: str) -> str:
    """Where an app host sends a browser without an app token."""
    back = settings.app_host_url(app_host.label) + without_ticket(raw_target)
    return settings.access_url + AUTH_REDIRECT + "?" + urlencode({"redirect_uri": back})


def redirect_target(settings, redirect_uri: str) -> AppHost | None:
    """The AppHost an auth-redirect's `redirect_uri` names, if it is an app host URL of
    this deployment (scheme and port included); else None."""
    parts = urlsplit(redirect_uri)
    if parts.scheme != urlsplit(settings.access_url).scheme or parts.username or parts.password:
        return None
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return None
    if port != settings.app_host_port:
        return None
    is_app_host, app_host = app_host_of({"HTTP_HOST": parts.hostname or ""}, settings)
    return app_host if is_app_host else None


def with_ticket(redirect_uri: str, ticket: str) -> str:
    parts = urlsplit(redirect_uri)
    query = "&".join(item for item in [parts.query, urlencode({TICKET_PARAM: ticket})] if item)
    return parts._replace(query=query, fragment="").geturl()


# --------------------------------------------------------------------------- sealed tickets and tokens

_fernets: dict[str, object] = {}  # secret -> Fernet


def _fernet():
    settings = current_app.config["WORKSPACE"]
    secret = settings.app_token_secret
    if not secret and redis_client.configured_url():
        secret = hmac.new(settings.mesh_secret.encode(), b"workspace app tokens", hashlib.sha256).hexdigest()
    if not secret:
        secret = _secret_file(current_app.config["DATA_DIR"])
    if secret not in _fernets:
        _fernets[secret] = sealer(secret)
    return _fernets[secret]


def sealer(secret: str) -> Fernet:
    """What tickets and app tokens are sealed with, from the secret."""
    return Fernet(base64.urlsafe_b64encode(hashlib.sha256(b"workspace app tokens\0" + secret.encode()).digest()))


def _secret_file(data_dir):
    """The secret in DATA_DIR, made once (0600); workers starting together agree on it."""
    path = os.path.join(data_dir, SECRET_FILE)
    if not os.path.exists(path):
        os.makedirs(data_dir, exist_ok=True)
        partial = f"{path}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_urlsafe(48))
        try:
            os.link(partial, path)  # fails if another worker was first: its secret is the one
        except FileExistsError:
            pass
        finally:
            os.unlink(partial)
    with open(path) as file:
        return file.read().strip()


def _seal(payload: dict) -> str:
    return _fernet().encrypt(json.dumps(payload, separators=(",", ":")).encode()).decode()


def _open(sealed: str, kind: str, hostname: str, ttl: int | None = None) -> dict:
    refused = Unauthenticated("You must be signed in to do this.", detail=f"the app {kind} is not valid")
    try:
        payload = json.loads(_fernet().decrypt(sealed.encode(), ttl=ttl))
    except (InvalidToken, ValueError, TypeError):
        raise refused from None
    if not isinstance(payload, dict) or payload.get("kind") != kind or payload.get("host") != hostname:
        raise refused
    return payload


def mint_ticket(hostname: str, key_id: str) -> str:
    return _seal({"kind": "ticket", "host": hostname, "key": key_id, "nonce": secrets.token_urlsafe(16)})


def redeem_ticket(ticket: str, hostname: str) -> str:
    """The session key id of a ticket for `hostname`, spent now; else a 401."""
    payload = _open(ticket, "ticket", hostname, ttl=TICKET_SECONDS)
    if not _spend(payload["nonce"]):
        raise Unauthenticated("You must be signed in to do this.", detail="the app ticket was used already")
    return payload["key"]


def mint_token(hostname: str, key: ApiKey) -> tuple[str, int]:
    """(an app token for `hostname` from session `key`, its lifetime in seconds)."""
    expires = min(_epoch(key.expires_at), time.time() + TOKEN_SECONDS)
    return _seal({"kind": "token", "host": hostname, "key": key.id, "exp": int(expires)}), int(expires - time.time())


def cookie_name(settings) -> str:
    """The app token cookie's name: with https host-only by its name (sessions.HOST_PREFIX)."""
    return sessions.HOST_PREFIX + COOKIE if settings.secure_cookies else COOKIE


def tokens_in(environ: dict, settings) -> list[str]:
    """Every app token cookie the request carries: a sibling app host may have planted
    more under the same name (Domain=<the apps domain>), and the browser sends them all."""
    return parse_cookie(environ).getlist(cookie_name(settings))


def read_any_token(tokens: list[str], hostname: str) -> tuple[str, float]:
    """read_token of the first of `tokens` that is good for `hostname`: a planted one
    never counts, and never hides the host's own."""
    refused = Unauthenticated("You must be signed in to do this.", detail="no app token was given")
    for token in tokens:
        try:
            return read_token(token, hostname)
        except Unauthenticated as exc:
            refused = exc
    raise refused


def read_token(token: str, hostname: str) -> tuple[str, float]:
    """(session key id, seconds left) of a valid app token for `hostname`; else a 401."""
    payload = _open(token, "token", hostname)
    left = payload.get("exp", 0) - time.time()
    if left <= 0:
        raise Unauthenticated("You must be signed in to do this.", detail="the app token has expired")
    return payload["key"], left


def _epoch(moment: datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


# --------------------------------------------------------------------------- single use

_spent: dict[str, float] = {}  # nonce -> time.monotonic() after which it may be forgotten


def _spend(nonce):
    """True the first time a ticket's nonce is seen (across workers and hosts with Redis)."""
    client = redis_client.client()
    if client is not None:
        try:
            key = f"{redis_client.PREFIX}:workspace:app-ticket:{nonce}"
            return bool(client.set(key, 1, nx=True, ex=TICKET_SECONDS * 2))
        except redis.RedisError:
            raise Unavailable("Opening apps needs Redis, which cannot be reached; try again.") from None
    current = time.monotonic()
    if len(_spent) > 10_000:
        for old in [n for n, until in _spent.items() if until < current]:
            del _spent[old]
    if nonce in _spent:
        return False
    _spent[nonce] = current + TICKET_SECONDS * 2
    return True


# --------------------------------------------------------------------------- the session behind a token


def session_of(key_id: str) -> tuple[User, ApiKey]:
    """(user, key) of a session that is still valid (an app token lives as long as
    its session does); else a 401 (403 for an inactive account)."""
    key = ApiKey.select(ApiKey, User).join(User).where(ApiKey.id == key_id).first()
    if key is None or key.revoked_at is not None:
        raise Unauthenticated("You must be signed in to do this.", detail="the session was revoked")
    if key.expires_at <= now():
        raise Unauthenticated("You must be signed in to do this.", detail="the session has expired")
    if key.user.status != "active":
        raise Forbidden("This account is not active.")
    return key.user, key
