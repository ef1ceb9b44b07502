"""Deck review service (spec 000, part B): decks imported from Markdown, review
sessions with an append-only event log, a live SSE stream, and scribble overlays.

Routes: `pages` (the HTML pages, with the static files and templates) and `api` (the
JSON API, the health route), each module with its own blueprint."""

from app.decks import settings

# A session's event log grows to this size at most (DECKS_MAX_LOG_BYTES, our addition to
# the spec's variables); past it an append answers 507 and nothing is stored.
DEFAULT_MAX_LOG_BYTES = settings.MAX_LOG_BYTES.default


def error_body(status, message, extra):
    return {"error": message, **{k: v for k, v in extra.items() if k == "fields"}}


def init_app(app):
    from app.common import readiness
    from app.decks import api, pages

    readiness.register(app)
    app.config["MAX_CONTENT_LENGTH"] = settings.MAX_BODY_BYTES
    app.config.setdefault("DECKS_MAX_LOG_BYTES", settings.MAX_LOG_BYTES.read())
    app.register_blueprint(pages.bp)
    app.register_blueprint(api.bp)
