"""HTML pages: the deck and session list, and the review page."""
from flask import render_template

from app.decks import bp, sessions


@bp.get("/")
def index():
    """The decks page: the imported decks and their review sessions."""
    return render_template("decks/index.html")


@bp.get("/review/<session_id>")
def review(session_id):
    """The review page of one session (404 when it does not exist)."""
    session = sessions.require(session_id)
    return render_template("decks/review.html", session=session)
