"""Deck review service (spec 000, part B): decks imported from Markdown, review
sessions with an append-only event log, a live SSE stream, and scribble overlays."""
from flask import Blueprint

from app.decks import settings

bp = Blueprint("decks", __name__, template_folder="templates", static_folder="static",
               static_url_path="/static")

# The largest body the service takes, as at the proxy: the scribble upload.
MAX_BODY_BYTES = 64 * 1024 * 1024
# A session's event log grows to this size at most (DECKS_MAX_LOG_BYTES, our addition to
# the spec's variables); past it an append answers 507 and nothing is stored.
DEFAULT_MAX_LOG_BYTES = settings.MAX_LOG_BYTES.default


def error_body(status, message, extra):
    return {"error": message, **{k: v for k, v in extra.items() if k == "fields"}}


def init_app(app):
    from app.decks import api, pages  # noqa: F401  (routes register on bp)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.config.setdefault("DECKS_MAX_LOG_BYTES", settings.MAX_LOG_BYTES.read())
    app.register_blueprint(bp)
