"""Session tokens: `<10-char id>-<22-char secret>`, of which only a SHA-256 of the
secret is stored and compared in constant time. Read from the header
`Workspace-Session-Token`, the cookie `workspace_session_token`, or, on a websocket
upgrade only (browsers cannot set headers on websockets), the query parameter
`workspace_session_token`, in that order: anywhere else a token in a URL would end
up in access logs, histories and Referer headers. Lifetime WORKSPACE_SESSION_DURATION,
sliding: a token used when less than half its lifetime is left is extended.

Cross-site requests: a browser sends the cookie with requests that other pages make
(a form posted from a sibling host of the same site; a websocket, to which neither
CORS nor SameSite applies). `same_origin` tells a request that the platform's own
pages made from one that another origin made; `current_user` refuses (403) a
cookie-authenticated request that can change something (any method but GET, HEAD
and OPTIONS, and every websocket upgrade) when it came from another origin."""

import hashlib
import hmac
import re
import secrets
import string
from datetime import timedelta
from urllib.parse import parse_qsl, urlsplit

from flask import current_app, g, request
from peewee import JOIN
from werkzeug.http import parse_cookie

from app.common.db import BuiltOnce
from app.common.failures import Forbidden, Unauthenticated
from app.workspace.access import grants
from app.workspace.core.models import ApiKey, Membership, Organization, User, database, now
from app.workspace.transport.websocket import is_upgrade

HEADER = "Workspace-Session-Token"
COOKIE = "workspace_session_token"
# With https, cookies of the platform carry this prefix: a browser then takes them only
# from the platform's own host (Secure, Path=/, no Domain), so a page of a sibling host
# (an app host under the same parent domain) cannot plant one for it ("cookie tossing",
# a login CSRF). Over plain http (make run) browsers refuse the prefix: the bare name.
HOST_PREFIX = "__Host-"
TOKEN_SHAPE = re.compile(r"^([A-Za-z0-9]{10})-([A-Za-z0-9]{22})$")
_ALPHABET = string.ascii_letters + string.digits


def _random(length):
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def _digest(secret):
    return hashlib.sha256(secret.encode()).hexdigest()


def new_token():
    """(id, stored digest, the token `<id>-<secret>`): the token exists only in the
    answer that shows it. Session tokens and agent tokens are made alike."""
    key_id, secret = _random(10), _random(22)
    return key_id, _digest(secret), f"{key_id}-{secret}"


def secret_matches(stored_digest, secret):
    """Constant-time check of a token's secret against its stored digest."""
    return hmac.compare_digest(stored_digest, _digest(secret))


def mint(user, login_type):
    """A new session token for `user`; the secret exists only in the answer."""
    settings = current_app.config["WORKSPACE"]
    key_id, digest, token = new_token()
    ApiKey.create(
        id=key_id,
        user=user,
        secret_hash=digest,
        login_type=login_type,
        expires_at=now() + timedelta(seconds=settings.session_seconds),
    )
    return token


def presented_token():
    """The token this request carries, from the first place that has one."""
    return token_in(request.environ)


def token_in(environ):
    """The token a WSGI environ carries (also for a path that runs without Flask's
    request): the header, else the cookie, else (a websocket upgrade only) the query
    parameter."""
    return (
        environ.get("HTTP_WORKSPACE_SESSION_TOKEN")
        or _cookie_token(environ)
        or (query_value(environ, COOKIE) if is_upgrade(environ) else None)
        or None
    )


def cookie_name(settings) -> str:
    """The session cookie's name under these settings (HOST_PREFIX with https)."""
    return HOST_PREFIX + COOKIE if settings.secure_cookies else COOKIE


def _cookie_token(environ):
    return parse_cookie(environ).get(cookie_name(current_app.config["WORKSPACE"]))


def query_value(environ, name: str) -> str | None:
    """The first value of the query parameter `name`, or None."""
    return next((value for key, value in parse_qsl(environ.get("QUERY_STRING", "")) if key == name), None)


def cookie_authenticated(environ) -> bool:
    """The request's token is the one its cookie carries (no header overrides it)."""
    return not environ.get("HTTP_WORKSPACE_SESSION_TOKEN") and bool(_cookie_token(environ))


# --------------------------------------------------------------------------- cross-site requests

# A redirect target after sign-in (the pages' and the OIDC flow's `redirect`).
_UNSAFE_TARGET = re.compile(r"[\x00-\x1f\x7f\\]")


def safe_redirect(value):
    """A same-site relative path, or "/": no scheme, no host, no `//` or `/\\`, no
    control characters (an open redirect must not be possible)."""
    if not value or not value.startswith("/") or value.startswith("//") or _UNSAFE_TARGET.search(value):
        return "/"
    return value


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_of(url):
    parts = urlsplit(url)
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:
        return None
    return f"{scheme}://{host}" + (f":{port}" if port and port != _DEFAULT_PORTS.get(scheme) else "")


def came_from(environ, own_url: str) -> bool:
    """Whether a browser made this request from the pages of `own_url`'s origin. Browsers
    say where a request comes from in `Sec-Fetch-Site` (same-origin, or none: typed or
    bookmarked), and older ones in `Origin`, which must then be that origin. Neither
    header: not a browser's cross-site request (a browser sends one of them on every
    cross-site POST and websocket), e.g. curl or the agent: allowed."""
    site = environ.get("HTTP_SEC_FETCH_SITE")
    if site:
        return site.strip().lower() in ("same-origin", "none")
    origin = environ.get("HTTP_ORIGIN")
    if origin is None:
        return True
    return _origin_of(origin.strip()) == _origin_of(own_url)


def same_origin(environ) -> bool:
    """Whether a browser made this request from the platform's own pages (came_from
    WORKSPACE_ACCESS_URL)."""
    return came_from(environ, current_app.config["WORKSPACE"].access_url)


def require_same_origin():
    """403 unless this request came from the platform's own pages (same_origin)."""
    if not same_origin(request.environ):
        origin = request.headers.get("Origin", "")[:200] or request.headers.get("Sec-Fetch-Site", "")[:40]
        raise Forbidden(
            "This request came from another site and was refused.",
            detail=f"cross-origin request from {origin!r}: only the platform's own pages may send it",
        )


def _unauthorized(detail):
    return Unauthenticated("You must be signed in to do this.", detail=detail)


def authenticate(token):
    """(user, api key) of a valid token; else a 401 whose detail says why."""
    if token is None:
        raise _unauthorized("no session token was given")
    match = TOKEN_SHAPE.match(token)
    if not match:
        raise _unauthorized("the session token is malformed")
    found = _key_and_user(match.group(1))
    if found is None or not secret_matches(found[0].secret_hash, match.group(2)):
        raise _unauthorized("the session token is not valid")
    key, user = found
    if key.revoked_at is not None:
        raise _unauthorized("the session token was revoked")
    current = now()
    if key.expires_at <= current:
        raise _unauthorized("the session token has expired")
    _slide(key, current)
    if user.status != "active":
        raise Forbidden("This account is not active.")
    return user, key


_KEY_FIELDS = (ApiKey.id, ApiKey.secret_hash, ApiKey.revoked_at, ApiKey.expires_at)
_USER_FIELDS = (
    User.id,
    User.username,
    User.name,
    User.email,
    User.status,
    User.login_type,
    User.roles,
    User.created_at,
)
# It runs on every authenticated request.
_lookup = BuiltOnce(
    lambda: (
        ApiKey.select(*_KEY_FIELDS, *_USER_FIELDS, Membership.organization)
        .join(User, on=(ApiKey.user == User.id))
        .join(Membership, JOIN.LEFT_OUTER, on=(Membership.user == User.id))
        .where(ApiKey.id == "?key?")
    )
)


def _key_and_user(key_id):
    """(ApiKey, User) of a key id in one statement, or None; the user carries its
    organization ids (one row per membership)."""
    rows = _lookup.run(database, [key_id]).fetchall()
    if not rows:
        return None
    key_values, user_values = rows[0][: len(_KEY_FIELDS)], rows[0][len(_KEY_FIELDS) : -1]
    key = ApiKey(**{f.name: f.python_value(v) for f, v in zip(_KEY_FIELDS, key_values)})
    user = User(**{f.name: f.python_value(v) for f, v in zip(_USER_FIELDS, user_values)})
    user.organization_ids = [str(Organization.id.python_value(row[-1])) for row in rows if row[-1] is not None]
    return key, user


def _lifetime():
    return timedelta(seconds=current_app.config["WORKSPACE"].session_seconds)


def _slide(key, current):
    lifetime = _lifetime()
    if key.expires_at - current < lifetime / 2:
        ApiKey.update(expires_at=current + lifetime, last_used=current).where(ApiKey.id == key.id).execute()


def current_user():
    """The signed-in user of this request (401 otherwise), cached on `g`. A request
    that its cookie signs in and that can change something (a method other than GET,
    HEAD or OPTIONS, or a websocket upgrade) must come from the platform's own pages
    (403 otherwise): another site's form or websocket carries the cookie too."""
    if "user" not in g:
        environ = request.environ
        if (request.method not in SAFE_METHODS or is_upgrade(environ)) and cookie_authenticated(environ):
            require_same_origin()
        g.user, g.api_key = authenticate(presented_token())
    return g.user


def seconds_before_slide(key):
    """How long `key` is used as it is: until it would be extended (or expire)."""
    return (key.expires_at - now() - _lifetime() / 2).total_seconds()


def revoke(key_id):
    ApiKey.update(revoked_at=now()).where((ApiKey.id == key_id) & ApiKey.revoked_at.is_null()).execute()
    grants.changed()


def revoke_all(user):
    ApiKey.update(revoked_at=now()).where((ApiKey.user == user) & ApiKey.revoked_at.is_null()).execute()
    grants.changed()


def set_cookie(response, token):
    settings = current_app.config["WORKSPACE"]
    # Host-scoped: no Domain attribute, so the cookie never reaches sibling hosts.
    response.set_cookie(
        cookie_name(settings),
        token,
        max_age=settings.session_seconds,
        path="/",
        httponly=True,
        samesite="Lax",
        secure=settings.secure_cookies,
    )
    return response


def clear_cookie(response):
    settings = current_app.config["WORKSPACE"]
    response.delete_cookie(
        cookie_name(settings), path="/", httponly=True, samesite="Lax", secure=settings.secure_cookies
    )
    return response
