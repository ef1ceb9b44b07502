"""HTML pages of the prompt wizard: home (wizards, prompt building, generation),
the blueprints gallery, the library and the admin pages.

The pages are shells: their scripts read and write everything through the JSON API
on the same origin. Identity comes from the same proxy headers as the API; a page
asked without one (straight at the service, not through nginx) answers a 401 page,
and the admin page a 403 page to anyone who is not an administrator.
"""

from flask import Blueprint, make_response, render_template

from app.common.failures import Failure
from app.wizard import identity
from app.wizard.models import COLLECTIONS

# The pages' templates and static files (/static/...) are the service's own folders.
bp = Blueprint("pages", __name__, template_folder="templates", static_folder="static", static_url_path="/static")
NAV = (("pages.home", "Home"), ("pages.blueprints", "Blueprints"), ("pages.library", "Library"))


def _page(template, http_status=200, **context):
    response = make_response(render_template(template, nav=NAV, **context), http_status)
    # The page names who is signed in: never shared between visitors by a cache.
    response.headers["Cache-Control"] = "private, no-cache"
    return response


def _refusal(status, title, message, who=None):
    return _page("wizard/refused.html", status, who=who, status=status, title=title, message=message)


def _identified(template, admin_only=False, **context):
    try:
        who = identity.require_identity()
    except Failure as exc:
        return _refusal(
            401,
            "Sign-in required",
            "This page is served through the site's proxy, which tells the service who you are. "
            f"This request came without that identity ({exc.message}).",
        )
    if admin_only and not who.is_admin:
        return _refusal(
            403,
            "Administrators only",
            "The admin pages are for members of the groups admins or wiz-admins. "
            + (
                "You are not signed in: sign in with an administrator account."
                if who.is_public
                else f"You are signed in as {who.username}, who is not one of them."
            ),
            who=who,
        )
    return _page(template, who=who, **context)


@bp.get("/")
def home():
    """The wizard's home page."""
    return _identified("wizard/home.html", page="home")


@bp.get("/blueprints")
def blueprints():
    """The blueprints page."""
    return _identified("wizard/blueprints.html", page="blueprints")


@bp.get("/library")
def library():
    """The library page."""
    return _identified("wizard/library.html", page="library")


@bp.get("/admin")
def admin():
    """The administration page (administrators only)."""
    return _identified("wizard/admin.html", admin_only=True, page="admin", collections=list(COLLECTIONS))
