"""Server-rendered pages: sign-in, first-user set-up, and a minimal dashboard.

Every form post here signs a browser in or out, so each must come from the
platform's own pages (sessions.same_origin): another site's form would sign the
visitor in as the attacker (login CSRF) or out. A refused post is a 403 page."""

import functools
from pathlib import Path

from flask import Blueprint, current_app, g, redirect, render_template, request

from app.common.body import validated
from app.common.failures import Failure
from app.workspace.access import accounts, sessions
from app.workspace.access.sessions import safe_redirect
from app.workspace.core.models import audit
from app.workspace.core.payloads import FirstUserSchema

PACKAGE = Path(__file__).parent.parent
# The templates and static files of every page of the platform (app/workspace/templates, /static).
bp = Blueprint(
    "pages",
    __name__,
    template_folder=str(PACKAGE / "templates"),
    static_folder=str(PACKAGE / "static"),
    static_url_path="/static",
)


def same_origin_form(view):
    """Refuse (403, a page that says why, nothing changed) a form post that another
    origin's page sent."""

    @functools.wraps(view)
    def checked(*args, **kwargs):
        try:
            sessions.require_same_origin()
        except Failure as exc:
            return render_template("workspace/refused.html", message=exc.message), exc.status
        return view(*args, **kwargs)

    return checked


def _login_page(error=None, status=200, retry_after=None):
    settings = current_app.config["WORKSPACE"]
    page = render_template(
        "workspace/login.html",
        settings=settings,
        error=error,
        redirect_to=safe_redirect(request.values.get("redirect")),
    )
    return page, status, ({"Retry-After": str(retry_after)} if retry_after else {})


@bp.get("/login")
def login_page():
    """The sign-in page (with the single sign-on button when OIDC is on)."""
    return _login_page()


@bp.post("/login")
@same_origin_form
def login_form():
    """The password form's target: same rules as POST /api/v2/users/login."""
    settings = current_app.config["WORKSPACE"]
    email, password = request.form.get("email", "").strip().lower(), request.form.get("password", "")
    if not settings.password_enabled:
        return _login_page("Password sign-in is disabled on this deployment.", 403)
    if not email or not password or len(email) > 254 or len(password) > 256:
        return _login_page("Enter your email and password.", 400)
    try:
        user = accounts.password_sign_in(settings, email, password)
    except Failure as exc:
        return _login_page(exc.message, exc.status, exc.extra.get("retry_after"))
    token = sessions.mint(user, "password")
    return sessions.set_cookie(redirect(safe_redirect(request.form.get("redirect")), 303), token)


@bp.get("/setup")
def setup_page():
    """The first-user page; once that user exists, a redirect to the sign-in page."""
    if accounts.first_user_exists():
        return redirect("/login", 303)
    return render_template("workspace/setup.html", error=None)


@bp.post("/setup")
@same_origin_form
def setup_form():
    """The first-user form's target: creates the Owner and signs them in."""
    if accounts.first_user_exists():
        return redirect("/login", 303)
    form = {k: request.form.get(k, "").strip() for k in ("username", "email", "name")}
    try:
        data = validated(FirstUserSchema(), {**form, "password": request.form.get("password", "")})
        user = accounts.create_first(data["username"], data["email"], data["name"], data["password"])
    except Failure as exc:
        problems = exc.extra.get("fields") or {}
        detail = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in problems.items()) or exc.message
        return render_template("workspace/setup.html", error=detail, form=form), exc.status
    return sessions.set_cookie(redirect("/", 303), sessions.mint(user, "password"))


@bp.get("/")
def dashboard():
    """A minimal dashboard of the signed-in user's workspaces; others are sent to set-up or sign-in."""
    try:
        user = sessions.current_user()
    except Failure:
        if not accounts.first_user_exists():
            return redirect("/setup", 303)
        return redirect("/login?redirect=/", 303)
    from app.workspace.routes.workspaces import owned_workspaces

    return render_template("workspace/dashboard.html", user=accounts.public(user), workspaces=owned_workspaces(user))


@bp.post("/logout")
@same_origin_form
def logout_form():
    """Revokes the token on the server (not only the cookie), whichever way it came."""
    try:
        user = sessions.current_user()
        sessions.revoke(g.api_key.id)
        audit("user.logout", user)
    except Failure:
        pass  # no valid session: nothing to revoke, the cookie goes all the same
    return sessions.clear_cookie(redirect("/login", 303))
