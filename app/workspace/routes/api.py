"""The platform's JSON API under /api/v2 (sign-in arrangement)."""

from flask import Blueprint, current_app, g, jsonify

from app.common import readiness
from app.common.body import json_object, validated
from app.common.failures import Forbidden, NotFound
from app.workspace.access import accounts, sessions
from app.workspace.core.models import audit
from app.workspace.core.payloads import CreateUserSchema, FirstUserSchema, LoginSchema
from app.workspace.routes import agent_files
from app.workspace.settings import VERSION

bp = Blueprint("api", __name__)

BODY_LIMIT = 64 * 1024


def _settings():
    return current_app.config["WORKSPACE"]


@bp.get("/healthz")
def healthz():
    """Liveness: `{"status": "ok"}` while the process answers."""
    return {"status": "ok"}


bp.add_url_rule("/readyz", view_func=readiness.readyz)


@bp.get("/api/v2/buildinfo")
def buildinfo():
    """The platform's version, public addresses and agent program."""
    settings = _settings()
    return {
        "version": VERSION,
        "dashboard_url": settings.access_url + "/",
        "external_url": settings.access_url,
        "agent": agent_files.agent_info(),
    }


@bp.get("/api/v2/users/authmethods")
def authmethods():
    """Which sign-in methods are on, with the OIDC button's label and icon."""
    settings = _settings()
    return {
        "password": {"enabled": settings.password_enabled},
        "oidc": {
            "enabled": settings.oidc_enabled,
            "signInText": settings.oidc_sign_in_text,
            "iconUrl": settings.oidc_icon_url,
        },
    }


@bp.get("/api/v2/users/first")
def first_user_status():
    """404 before the initial user exists, 200 after."""
    if not accounts.first_user_exists():
        raise NotFound("The initial user has not been created.")
    return {"message": "The initial user has already been created."}


@bp.post("/api/v2/users/first")
def create_first_user():
    """Create the initial user, the Owner of the default organization, signed in (201); 409 once one exists."""
    sessions.require_same_origin()  # it sets the cookie: another site's page must not
    data = validated(FirstUserSchema(), json_object(BODY_LIMIT))
    user = accounts.create_first(data["username"], data["email"], data["name"], data["password"])
    token = sessions.mint(user, "password")
    response = jsonify(
        {"user_id": str(user.id), "organization_id": str(accounts.default_organization().id), "session_token": token}
    )
    response.status_code = 201
    return sessions.set_cookie(response, token)


@bp.post("/api/v2/users")
def create_user():
    """An administrator creates an account (201); 403 for anyone else."""
    actor = sessions.current_user()
    if not accounts.is_admin(actor):
        raise Forbidden("Only an administrator can create accounts.")
    data = validated(CreateUserSchema(), json_object(BODY_LIMIT))
    user = accounts.create(
        data["username"], data["email"], data["name"], data.get("password"), data["login_type"], actor=actor.username
    )
    return accounts.public(user), 201


@bp.get("/api/v2/users/me")
def me():
    """The signed-in user's account."""
    return accounts.public(sessions.current_user())


@bp.post("/api/v2/users/login")
def login():
    """Sign in with email and password: a session token and its cookie (201); 401 for a wrong account or password
    alike."""
    settings = _settings()
    sessions.require_same_origin()  # it sets the cookie: another site's page must not
    data = validated(LoginSchema(), json_object(BODY_LIMIT))
    if not settings.password_enabled:
        raise Forbidden("Password sign-in is disabled on this deployment.")
    user = accounts.password_sign_in(settings, data["email"].lower(), data["password"])
    token = sessions.mint(user, "password")
    response = jsonify({"session_token": token})
    response.status_code = 201
    return sessions.set_cookie(response, token)


@bp.post("/api/v2/users/logout")
def logout():
    """Revoke the session's token and clear its cookie."""
    user = sessions.current_user()
    sessions.revoke(g.api_key.id)
    audit("user.logout", user)
    return sessions.clear_cookie(jsonify({"message": "Signed out."}))
