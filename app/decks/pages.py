"""HTML pages: the deck and session list, and the review page."""

from flask import Blueprint, render_template

from app.decks import sessions

# The pages' templates and static files (/static/...) are the service's own folders.
bp = Blueprint("pages", __name__, template_folder="templates", static_folder="static", static_url_path="/static")


@bp.get("/")
def index():
    """The decks page: the imported decks and their review sessions."""
    return render_template("decks/index.html")


@bp.get("/review/<session_id>")
def review(session_id):
    """The review page of one session (404 when it does not exist)."""
    session = sessions.require(session_id)
    return render_template("decks/review.html", session=session)
