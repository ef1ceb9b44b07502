"""JSON API of the deck review service."""

import os

from flask import Blueprint, jsonify, request, send_from_directory

from app.common import readiness
from app.common.body import json_object, query_int, validated
from app.common.failures import Conflict, Invalid, NotFound
from app.common.offload import blocking
from app.common.sse import stream_response
from app.decks import decks, importer, layout, scribbles, sessions
from app.decks.eventlog import LogFull
from app.decks.payloads import EVENT_SCHEMAS, EVENT_TYPES, ImportSchema, ScribbleSchema, SessionCreateSchema
from app.decks.settings import MAX_BODY_BYTES

bp = Blueprint("api", __name__)
JSON_BODY_BYTES = 1024 * 1024
MAX_PAGE = 1000


@bp.get("/healthz")
def healthz():
    """Liveness: `{"status": "ok"}` while the process answers."""
    return {"status": "ok"}


bp.add_url_rule("/readyz", view_func=readiness.readyz)


@bp.get("/api/decks")
def list_decks():
    """Every imported deck's summary."""
    return jsonify(blocking(decks.list_all))


def _deck_or_404(deck_id):
    deck = blocking(decks.load, deck_id)
    if deck is None:
        raise NotFound(f"deck {deck_id!r} does not exist")
    return deck


@bp.get("/api/decks/<deck_id>")
def get_deck(deck_id):
    """One deck: its summary, slides and assets (404 when it does not exist)."""
    return _deck_or_404(deck_id)


@bp.get("/api/decks/<deck_id>/assets/<path:asset>")
def get_asset(deck_id, asset):
    """One file of a deck's assets, sandboxed by its Content-Security-Policy (404 for a path outside them)."""
    if not layout.valid_id(deck_id):
        raise NotFound("no such asset")
    # send_from_directory refuses any path that escapes the directory (404).
    response = send_from_directory(os.path.join(layout.deck_dir(deck_id), "assets"), asset, max_age=300)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Security-Policy"] = "sandbox; default-src 'none'; style-src 'unsafe-inline'"
    return response


@bp.post("/api/decks/import")
def import_deck():
    """Import (or re-import) a deck from a Markdown file under DATA_DIR: 201 when new, 200 when replaced, with its
    warnings."""
    data = validated(ImportSchema(), json_object(JSON_BODY_BYTES))
    deck = blocking(importer.prepare, data["id"], data["md_path"], data["copy_from"])
    existed = os.path.exists(layout.deck_json(data["id"]))
    blocking(importer.build, deck)
    summary = {k: deck[k] for k in decks.SUMMARY_FIELDS}
    return {**summary, "asset_count": len(deck["assets"]), "warnings": deck["warnings"]}, 200 if existed else 201


@bp.get("/api/sessions")
def list_sessions():
    """Every review session's summary."""
    return jsonify(blocking(sessions.list_all))


@bp.post("/api/sessions")
def create_session():
    """Start a review session of a deck (201)."""
    data = validated(SessionCreateSchema(), json_object(JSON_BODY_BYTES))
    return blocking(sessions.create, data["deck_id"], data.get("title")), 201


@bp.get("/api/sessions/<session_id>")
def get_session(session_id):
    """One review session (404 when it does not exist)."""
    session = blocking(sessions.get, session_id)
    if session is None:
        raise NotFound(f"session {session_id!r} does not exist")
    return session


def _check_slide(session, slide):
    if slide is None:
        return
    count = decks.slide_count(session["deck_id"])  # a stat and a cache lookup: cheap enough for the loop
    if count is None:
        raise Conflict(f"the session's deck {session['deck_id']!r} no longer exists")
    if slide >= count:
        raise Invalid(f"slide: must be between 0 and {count - 1}", fields={"slide": ["out of range"]})


def _check_task(session_id, task_seq):
    for event in sessions.events(session_id, after=task_seq - 1, limit=1):
        if event["seq"] == task_seq and event.get("type") == "task":
            return
    raise Invalid(f"task_seq: no task event has seq {task_seq}", fields={"task_seq": ["no such task"]})


@bp.post("/api/sessions/<session_id>/events")
def post_event(session_id):
    """Append one event (of the known types) to a session's log (201 with its sequence number); 507 when the log is
    full."""
    session = sessions.require(session_id)
    body = json_object(JSON_BODY_BYTES)
    kind = body.get("type")
    if kind not in EVENT_TYPES:
        raise Invalid(f"type: must be one of {', '.join(EVENT_TYPES)}", fields={"type": ["invalid"]})
    event = validated(EVENT_SCHEMAS[kind], body)
    _check_slide(session, event.get("slide"))
    if kind == "task_done":
        _check_task(session_id, event["task_seq"])
    return sessions.append(session_id, event), 201


@bp.get("/api/sessions/<session_id>/events")
def page_events(session_id):
    """A page of a session's events after the sequence number `after` (`limit` at most), with `has_more` and
    `next_after`."""
    sessions.require(session_id)
    after = query_int(request.args, "after", 0)
    limit = query_int(request.args, "limit", 100, minimum=1, maximum=MAX_PAGE)
    events = sessions.events(session_id, after, limit + 1)
    page = events[:limit]
    return {"events": page, "has_more": len(events) > limit, "next_after": page[-1]["seq"] if page else after}


@bp.get("/api/sessions/<session_id>/stream")
def stream(session_id):
    """A session's events as Server-Sent Events: those after `after` (or Last-Event-ID), then each new one live."""
    sessions.require(session_id)
    after = max(query_int(request.args, "after", 0), query_int(request.headers, "Last-Event-ID", 0))
    subscription = sessions.subscribe(session_id)  # subscribe before the replay: no gap
    try:
        replay = sessions.replay(session_id, after)
    except BaseException:
        subscription.close()
        raise
    return stream_response(replay, subscription, seq_of=lambda e: e["seq"], after=after)


@bp.post("/api/sessions/<session_id>/scribble")
def post_scribble(session_id):
    """Store a PNG scribble over a slide and append its `scribble` event (201)."""
    session = sessions.require(session_id)
    data = validated(ScribbleSchema(), json_object(MAX_BODY_BYTES))
    _check_slide(session, data["slide"])
    png, width, height = blocking(scribbles.decode_png, data["image"])
    sessions.require_room(session_id)
    name = blocking(scribbles.store, session_id, png)
    event = {
        "type": "scribble",
        "slide": data["slide"],
        "file": name,
        "width": width,
        "height": height,
        "bytes": len(png),
    }
    if "author" in data:
        event["author"] = data["author"]
    try:
        return sessions.append(session_id, event), 201
    except LogFull:
        blocking(scribbles.remove, session_id, name)  # no event refers to it: nothing stays
        raise


@bp.get("/api/sessions/<session_id>/scribbles/<name>")
def get_scribble(session_id, name):
    """One stored scribble PNG of a session."""
    if not layout.valid_id(session_id) or not scribbles.NAME_PATTERN.match(name):
        raise NotFound("no such scribble")
    response = send_from_directory(layout.scribbles_dir(session_id), name, mimetype="image/png", max_age=3600)
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response
