"""Server-rendered pages: sign-in, first-user set-up, and a minimal dashboard."""
import re

from flask import current_app, g, redirect, render_template, request

from app.common.body import validated
from app.common.clientaddr import client_address
from app.common.failures import Failure
from app.workspace import accounts, bp, limits, sessions
from app.workspace.models import User, audit
from app.workspace.passwords import verify_password
from app.workspace.schemas import FirstUserSchema

_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")


def safe_redirect(value):
    """A same-site relative path, or "/": no scheme, no host, no `//` or `/\\`, no
    control characters (an open redirect must not be possible)."""
    if not value or not value.startswith("/") or value.startswith("//") or _UNSAFE.search(value):
        return "/"
    return value


def _login_page(error=None, status=200):
    settings = current_app.config["WORKSPACE"]
    return render_template("workspace/login.html", settings=settings, error=error,
                           redirect_to=safe_redirect(request.values.get("redirect"))), status


@bp.get("/login")
def login_page():
    return _login_page()


@bp.post("/login")
def login_form():
    """The password form's target: same rules as POST /api/v2/users/login."""
    settings = current_app.config["WORKSPACE"]
    email, password = request.form.get("email", "").strip().lower(), request.form.get("password", "")
    if not settings.password_enabled:
        return _login_page("Password sign-in is disabled on this deployment.", 403)
    if not email or not password or len(email) > 254 or len(password) > 256:
        return _login_page("Enter your email and password.", 400)
    try:
        limits.check_login(settings, client_address(), email)
    except Failure as exc:
        return _login_page(exc.message, 429)
    user = User.get_or_none(User.email_key == email)
    if not verify_password(password, user.password_hash if user else None) or user.login_type != "password":
        audit("user.login_failed", user, actor=client_address())
        return _login_page("Incorrect email or password.", 401)
    token = sessions.mint(user, "password")
    audit("user.login", user, actor=client_address())
    return sessions.set_cookie(redirect(safe_redirect(request.form.get("redirect")), 303), token)


@bp.get("/setup")
def setup_page():
    if accounts.first_user_exists():
        return redirect("/login", 303)
    return render_template("workspace/setup.html", error=None)


@bp.post("/setup")
def setup_form():
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
    try:
        user = sessions.current_user()
    except Failure:
        if not accounts.first_user_exists():
            return redirect("/setup", 303)
        return redirect("/login?redirect=/", 303)
    from app.workspace.workspaces import owned_workspaces
    return render_template("workspace/dashboard.html", user=accounts.public(user), workspaces=owned_workspaces(user))


@bp.post("/logout")
def logout_form():
    try:
        sessions.current_user()
        sessions.revoke(g.api_key.id)
    except Failure:
        pass
    return sessions.clear_cookie(redirect("/login", 303))
