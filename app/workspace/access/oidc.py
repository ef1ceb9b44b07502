"""OIDC single sign-on against an external provider (Authelia-shaped), with authlib
as the client: authorization code flow, client_secret_basic, PKCE (S256), a nonce,
and an id_token verified against the provider's JWKS.

One route, `GET /api/v2/users/oidc/callback`, plays both legs, as in Coder:

- without `code` (and without `error`): the start. `redirect` is reduced to a
  same-site path; it, a random `state`, a `nonce` and a PKCE verifier go into
  short-lived HttpOnly cookies scoped to /api/v2/users/oidc, and the browser is sent
  to the provider's authorization endpoint (from its discovery document).
- with `code` (or `error`): the return. `state` must equal its cookie; the code is
  exchanged with the verifier; the id_token is verified (signature from the JWKS,
  issuer, audience, expiry, nonce); userinfo is fetched (Authelia puts email,
  email_verified, groups and preferred_username only there); then the account is
  found by its link (issuer + subject), else by a verified email equal to an
  existing account's, else created; a session is minted and the browser goes to the
  stored path.

Anything that goes wrong on the way is an HTML error page with a 4xx or 502 status
(never a 500), and never says more than it must: no secret, no token, no
provider-side stack trace. Session-token traffic (agents, the command-line client)
never passes here.
"""

import hmac
import logging
import re
import secrets
import time

import requests
from authlib.integrations.base_client import OAuthError
from authlib.integrations.requests_client import OAuth2Session
from authlib.oidc.core import CodeIDToken
from flask import Blueprint, current_app, make_response, redirect, render_template, request
from joserfc import jwt
from joserfc.errors import BadSignatureError, InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet
from joserfc.jws import JWSRegistry
from peewee import IntegrityError

from app.common.clientaddr import client_address
from app.common.failures import Failure, NotFound
from app.workspace.access import accounts, sessions
from app.workspace.access.sessions import safe_redirect
from app.workspace.core.models import OidcLink, User, audit, database
from app.workspace.core.payloads import EMAIL, USERNAME

bp = Blueprint("oidc", __name__)

log = logging.getLogger("bundle.workspace.oidc")

CALLBACK_PATH = "/api/v2/users/oidc/callback"
COOKIE_PATH = "/api/v2/users/oidc"
FLOW_SECONDS = 10 * 60
STATE_COOKIE, NONCE_COOKIE, VERIFIER_COOKIE, REDIRECT_COOKIE = (
    "oidc_state",
    "oidc_nonce",
    "oidc_verifier",
    "oidc_redirect",
)
FLOW_COOKIES = (STATE_COOKIE, NONCE_COOKIE, VERIFIER_COOKIE, REDIRECT_COOKIE)

HTTP_TIMEOUT = (5, 10)  # connect, read (seconds) for every request to the provider
DOCUMENT_SECONDS = 3600  # discovery document and JWKS are cached this long per process
CLOCK_LEEWAY = 60  # seconds of clock skew tolerated on exp/iat
# Only asymmetric signatures: "none" is never acceptable, and HMAC would make the
# client secret the verification key.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")

_cache: dict[str, tuple[float, dict]] = {}  # url -> (fetched_at monotonic, JSON document)


class SignInFailed(Exception):
    """Ends the flow with the error page: `status` and a message for the person."""

    def __init__(self, status, message, hint=None):
        super().__init__(message)
        self.status, self.message, self.hint = status, message, hint


def _settings():
    return current_app.config["WORKSPACE"]


# --- the provider's documents -------------------------------------------------------


def _get_json(url, what):
    """GET `url` and return its JSON object; SignInFailed(502) on any failure."""
    try:
        response = requests.get(
            url, timeout=HTTP_TIMEOUT, headers={"Accept": "application/json"}, allow_redirects=False
        )
    except requests.RequestException as exc:
        log.warning("oidc: %s unreachable: %s", what, type(exc).__name__)
        raise SignInFailed(
            502, "The identity provider could not be reached. Try again later, or sign in with your password."
        ) from None
    if response.status_code != 200:
        log.warning("oidc: %s answered %s", what, response.status_code)
        raise SignInFailed(502, "The identity provider answered with an error. Try again later.")
    try:
        document = response.json()
    except ValueError:
        document = None
    if not isinstance(document, dict):
        log.warning("oidc: %s is not a JSON object", what)
        raise SignInFailed(502, "The identity provider gave an answer that could not be read.")
    return document


def _cached(url, what, max_age=DOCUMENT_SECONDS, force=False):
    entry = _cache.get(url)
    if entry and not force and time.monotonic() - entry[0] < max_age:
        return entry[1]
    document = _get_json(url, what)  # failures are not cached: the next try asks again
    _cache[url] = (time.monotonic(), document)
    return document


def provider_metadata():
    """The provider's discovery document, checked for what the flow needs."""
    issuer = _settings().oidc_issuer
    metadata = _cached(issuer + "/.well-known/openid-configuration", "discovery document")
    # OIDC Discovery 4.3: the document's issuer is the configured one.
    if str(metadata.get("issuer", "")).rstrip("/") != issuer:
        log.warning("oidc: discovery issuer %r differs from WORKSPACE_OIDC_ISSUER_URL", metadata.get("issuer"))
        raise SignInFailed(502, "The identity provider's configuration does not match this deployment's.")
    for field in ("authorization_endpoint", "token_endpoint", "jwks_uri", "userinfo_endpoint"):
        if not isinstance(metadata.get(field), str) or not metadata[field].startswith(("https://", "http://")):
            log.warning("oidc: discovery document lacks %s", field)
            raise SignInFailed(502, "The identity provider's configuration is incomplete.")
    return metadata


def _key_set(metadata, refresh=False):
    """The provider's signing keys. `refresh`: a key id was unknown or a signature did not
    verify, so the keys were probably rotated: fetch them again. (id_tokens come only from the token endpoint,
    over the back channel, so no outsider can make us refetch at will.)"""
    document = _cached(metadata["jwks_uri"], "JWKS", force=refresh)
    try:
        return KeySet.import_key_set(document)
    except (JoseError, ValueError, TypeError, KeyError):
        log.warning("oidc: the JWKS could not be read")
        raise SignInFailed(502, "The identity provider's signing keys could not be read.") from None


# --- cookies of one sign-in attempt ----------------------------------------------------


def _flow_cookie(name):
    """(name, path) of a flow cookie: with https, host-only by its name
    (sessions.HOST_PREFIX, which requires Path=/), so that a sibling host cannot plant
    an attempt of its own in the browser (a login CSRF through the callback)."""
    if _settings().secure_cookies:
        return sessions.HOST_PREFIX + name, "/"
    return name, COOKIE_PATH


def _flow_value(name):
    return request.cookies.get(_flow_cookie(name)[0], "")


def _set_flow_cookie(response, name, value):
    name, path = _flow_cookie(name)
    response.set_cookie(
        name, value, max_age=FLOW_SECONDS, path=path, httponly=True, samesite="Lax", secure=_settings().secure_cookies
    )


def _clear_flow_cookies(response):
    for name in FLOW_COOKIES:
        name, path = _flow_cookie(name)
        response.delete_cookie(name, path=path, httponly=True, samesite="Lax", secure=_settings().secure_cookies)
    return response


def _no_store(response):
    response.headers["Cache-Control"] = "no-store"
    return response


def _client():
    settings = _settings()
    return OAuth2Session(
        client_id=settings.oidc_client_id,
        client_secret=settings.oidc_client_secret,
        token_endpoint_auth_method="client_secret_basic",
        code_challenge_method="S256",
        redirect_uri=settings.access_url + CALLBACK_PATH,
        scope=" ".join(settings.oidc_scopes),
        default_timeout=HTTP_TIMEOUT,
    )


# --- the route --------------------------------------------------------------------------


@bp.get(CALLBACK_PATH)
def oidc_callback():
    """Single sign-on through the OIDC provider: starts it, and completes it when the provider sends the user back."""
    if not _settings().oidc_enabled:
        raise NotFound("OIDC sign-in is not enabled on this deployment.")
    returning = "code" in request.args or "error" in request.args
    try:
        response = _finish() if returning else _start()
    except SignInFailed as failure:
        response = make_response(
            render_template("workspace/oidc_error.html", message=failure.message, hint=failure.hint), failure.status
        )
    if returning:
        _clear_flow_cookies(response)  # one attempt, one use, whatever its outcome
    return _no_store(response)


def _start():
    metadata = provider_metadata()
    state, nonce = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    verifier = secrets.token_urlsafe(64)  # 86 characters of [A-Za-z0-9_-], within RFC 7636's 43..128
    with _client() as client:
        url, _ = client.create_authorization_url(
            metadata["authorization_endpoint"], state=state, code_verifier=verifier, nonce=nonce
        )
    response = redirect(url, 303)
    _set_flow_cookie(response, STATE_COOKIE, state)
    _set_flow_cookie(response, NONCE_COOKIE, nonce)
    _set_flow_cookie(response, VERIFIER_COOKIE, verifier)
    _set_flow_cookie(response, REDIRECT_COOKIE, safe_redirect(request.args.get("redirect")))
    return response


def _finish():
    expected_state = _flow_value(STATE_COOKIE)
    given_state = request.args.get("state", "")
    if not expected_state or not given_state or not hmac.compare_digest(expected_state.encode(), given_state.encode()):
        raise SignInFailed(
            401,
            "This sign-in attempt could not be matched to this browser, or it expired.",
            hint="Start again from the sign-in page.",
        )
    if "error" in request.args:
        raise _provider_refusal(request.args.get("error", ""))
    code, verifier = request.args.get("code", ""), _flow_value(VERIFIER_COOKIE)
    nonce = _flow_value(NONCE_COOKIE)
    if not code or not verifier or not nonce:
        raise SignInFailed(
            401, "This sign-in attempt is incomplete or expired.", hint="Start again from the sign-in page."
        )
    claims = _identity(code, verifier, nonce)
    user = _sign_in(claims)
    token = sessions.mint(user, "oidc")
    audit("user.login", user, actor=client_address(), login_type="oidc")
    target = safe_redirect(_flow_value(REDIRECT_COOKIE) or None)
    return sessions.set_cookie(redirect(target, 303), token)


_ERROR_CODE = re.compile(r"^[a-z_]{1,64}$")


def _provider_refusal(error):
    # The text arrives in the query string: anyone can write it. Show a known code,
    # never the free-text description.
    code = error if _ERROR_CODE.match(error) else "unknown_error"
    log.info("oidc: the provider answered error=%s", code)
    if code in ("access_denied", "login_required", "consent_required", "interaction_required"):
        return SignInFailed(403, "The identity provider did not allow this sign-in.", hint=f"({code})")
    return SignInFailed(400, "The identity provider could not complete this sign-in.", hint=f"({code})")


# --- code exchange, id_token, userinfo ---------------------------------------------------


def _identity(code, verifier, nonce):
    """The verified claims of the person: id_token claims updated with userinfo."""
    metadata = provider_metadata()
    with _client() as client:
        try:
            token = client.fetch_token(
                metadata["token_endpoint"], grant_type="authorization_code", code=code, code_verifier=verifier
            )
        except OAuthError as exc:
            error = exc.error if isinstance(exc.error, str) and _ERROR_CODE.match(exc.error) else "unknown_error"
            log.warning("oidc: the token endpoint refused the code: %s", error)
            if error == "invalid_grant":
                raise SignInFailed(
                    400,
                    "The sign-in code was not accepted (it expired or was already used).",
                    hint="Start again from the sign-in page.",
                ) from None
            raise SignInFailed(
                502,
                "The identity provider refused this deployment's sign-in request. "
                "The administrator needs to check the OIDC client settings.",
                hint=f"({error})",
            ) from None
        except requests.RequestException as exc:
            log.warning("oidc: token endpoint unreachable or failing: %s", type(exc).__name__)
            raise SignInFailed(
                502, "The identity provider could not be reached. Try again later, or sign in with your password."
            ) from None
        except (ValueError, TypeError) as exc:
            log.warning("oidc: unreadable token answer: %s", type(exc).__name__)
            raise SignInFailed(502, "The identity provider gave an answer that could not be read.") from None
        access_token, id_token = token.get("access_token"), token.get("id_token")
        if not isinstance(access_token, str) or not isinstance(id_token, str) or not access_token:
            log.warning("oidc: the token answer lacks an access_token or id_token")
            raise SignInFailed(502, "The identity provider's answer was incomplete.")
        if str(token.get("token_type", "")).lower() != "bearer":
            log.warning("oidc: unexpected token_type")
            raise SignInFailed(502, "The identity provider's answer was not understood.")
        claims = _verify_id_token(metadata, id_token, access_token, nonce)
        userinfo = _userinfo(client, metadata)
    if userinfo.get("sub") != claims["sub"]:  # OIDC Core 5.3.2
        log.warning("oidc: userinfo sub differs from the id_token's")
        raise SignInFailed(502, "The identity provider's answers do not agree.")
    return {**claims, **userinfo, "iss": claims["iss"], "sub": claims["sub"]}


def _verify_id_token(metadata, id_token, access_token, nonce):
    supported = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
    algorithms = [a for a in supported if a in ASYMMETRIC] or ["RS256"]
    registry = JWSRegistry(algorithms=algorithms, strict_check_header=False)
    try:
        try:
            decoded = jwt.decode(id_token, _key_set(metadata), registry=registry)
        except (InvalidKeyIdError, BadSignatureError):
            # The keys were rotated since we cached them: under a new key id, or (as
            # LemonLDAP::NG 2.16 does) a new key under the same id. Fetched again, once.
            decoded = jwt.decode(id_token, _key_set(metadata, refresh=True), registry=registry)
        settings = _settings()
        claims = CodeIDToken(
            decoded.claims,
            decoded.header,
            options={
                "iss": {"essential": True, "value": metadata["issuer"]},
                "aud": {"essential": True, "value": settings.oidc_client_id},
                "sub": {"essential": True},
            },
            params={"nonce": nonce, "client_id": settings.oidc_client_id, "access_token": access_token},
        )
        claims.validate(leeway=CLOCK_LEEWAY)
    except (JoseError, ValueError, TypeError, KeyError) as exc:
        log.warning("oidc: id_token rejected: %s %s", type(exc).__name__, getattr(exc, "error", ""))
        raise SignInFailed(502, "The identity provider's answer could not be verified.") from None
    if not isinstance(claims.get("sub"), str) or not claims["sub"]:
        raise SignInFailed(502, "The identity provider's answer could not be verified.")
    return dict(claims)


def _userinfo(client, metadata):
    try:
        response = client.get(
            metadata["userinfo_endpoint"], headers={"Accept": "application/json"}, allow_redirects=False
        )
    except requests.RequestException as exc:
        log.warning("oidc: userinfo unreachable: %s", type(exc).__name__)
        raise SignInFailed(502, "The identity provider could not be reached. Try again later.") from None
    if response.status_code != 200:
        log.warning("oidc: userinfo answered %s", response.status_code)
        raise SignInFailed(502, "The identity provider did not share the account's details.")
    try:
        info = response.json()
    except ValueError:
        info = None
    if not isinstance(info, dict):
        log.warning("oidc: userinfo is not a JSON object (a signed userinfo is not supported)")
        raise SignInFailed(502, "The identity provider's account details could not be read.")
    return info


# --- the account --------------------------------------------------------------------------


def _is_verified(value):
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _sign_in(claims):
    """The account for these verified claims: linked, matched by verified email, or new."""
    settings = _settings()
    issuer, subject = claims["iss"], claims["sub"]
    email = claims.get("email")
    email = email.strip() if isinstance(email, str) else ""
    verified = _is_verified(claims.get("email_verified"))
    if settings.oidc_email_domains:
        domain = email.rsplit("@", 1)[-1].lower() if "@" in email else ""
        if domain not in settings.oidc_email_domains or not verified:
            log.info("oidc: email domain not allowed or email not verified")
            raise SignInFailed(403, "Your email address is not allowed to sign in to this deployment.")

    link = OidcLink.get_or_none((OidcLink.issuer == issuer) & (OidcLink.subject == subject))
    if link is not None:
        return _active(User.get_by_id(link.user_id))

    if not email or len(email) > 254 or not EMAIL.match(email):
        raise SignInFailed(403, "The identity provider did not share a usable email address for your account.")
    existing = User.get_or_none(User.email_key == email.lower())
    if existing is not None:
        if not verified:
            log.info("oidc: unverified email matches an existing account; refused")
            raise SignInFailed(
                403,
                "An account with this email address already exists, but the identity "
                "provider has not verified that the address is yours.",
                hint="Verify your email address at the identity provider, or sign in with your password.",
            )
        if OidcLink.select().where((OidcLink.user == existing) & (OidcLink.issuer == issuer)).exists():
            # Another identity at this provider already owns the account: an address
            # handed on to someone else must not hand the account on with it.
            log.warning("oidc: account already linked to another subject of this issuer; refused")
            raise SignInFailed(
                409,
                "This account is already linked to a different identity at the provider.",
                hint="Ask an administrator for help.",
            )
        _active(existing)
        try:
            with database.atomic():
                OidcLink.create(user=existing, issuer=issuer, subject=subject)
                audit(
                    "user.oidc_link",
                    existing,
                    actor=client_address(),
                    issuer=issuer,
                    subject=subject,
                    email=email,
                    matched_by="verified_email",
                )
        except IntegrityError:  # the same person, signing in twice at once
            return _linked_or_fail(issuer, subject)
        return existing
    return _create(claims, issuer, subject, email)


def _active(user):
    if user.status != "active":
        raise SignInFailed(403, "This account is not active.")
    return user


def _linked_or_fail(issuer, subject):
    link = OidcLink.get_or_none((OidcLink.issuer == issuer) & (OidcLink.subject == subject))
    if link is None:
        raise SignInFailed(409, "The account could not be set up. Try again.")
    return _active(User.get_by_id(link.user_id))


_NOT_IN_USERNAME = re.compile(r"[^A-Za-z0-9]+")


def username_from(preferred, email):
    """A name of the allowed shape (payloads.USERNAME) from preferred_username or the
    email's local part: other characters become single hyphens, at most 32."""
    for candidate in (preferred, email.split("@")[0] if email else ""):
        if not isinstance(candidate, str):
            continue
        name = _NOT_IN_USERNAME.sub("-", candidate).strip("-")[:32].strip("-")
        if name and USERNAME.match(name):
            return name
    return "user"


def _taken(username):
    return User.select().where(User.username_key == username.lower()).exists()


def unique_username(base):
    """`base`, or `base-2`, `base-3`, ... (case-insensitively unused), within 32 characters."""
    if not _taken(base):
        return base
    for n in range(2, 100):
        suffix = f"-{n}"
        candidate = base[: 32 - len(suffix)].rstrip("-") + suffix
        if not _taken(candidate):
            return candidate
    return base[:23].rstrip("-") + "-" + secrets.token_hex(4)


def _create(claims, issuer, subject, email):
    name = claims.get("name") if isinstance(claims.get("name"), str) else ""
    base = username_from(claims.get("preferred_username"), email)
    for _ in range(3):  # a name taken between the check and the insert: pick again
        username = unique_username(base)
        try:
            with database.atomic():
                user = accounts.create(username, email, name=name.strip()[:128], login_type="oidc", actor="oidc")
                OidcLink.create(user=user, issuer=issuer, subject=subject)
                audit(
                    "user.oidc_link",
                    user,
                    actor=client_address(),
                    issuer=issuer,
                    subject=subject,
                    email=email,
                    matched_by="new_account",
                )
            log.info("oidc: created account %s", username)
            return user
        except IntegrityError:  # the link: the same person, signing in twice at once
            return _linked_or_fail(issuer, subject)
        except Failure as exc:
            if exc.status != 409:
                raise SignInFailed(403, "The account could not be created from the provider's details.") from None
            if User.select().where(User.email_key == email.lower()).exists():
                return _linked_or_fail(issuer, subject)
    raise SignInFailed(409, "The account could not be set up. Try again.")
