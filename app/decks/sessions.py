"""Review sessions: their records, their event logs, and the events' rules."""

import json
import os
import uuid

from flask import current_app

from app.common.failures import NotFound
from app.common.fsutil import atomic_write, read_json
from app.common.offload import blocking
from app.common.timeutil import utc_timestamp
from app.decks import decks, layout
from app.decks.eventlog import LogFull, SessionLog, last_seq_in_file, read_events
from app.decks.feed import subscribe as subscribe_feed

# One SessionLog per session in this process, keyed by the log's path (so two apps
# with different DATA_DIRs in one test process never share one).
_logs: dict[str, SessionLog] = {}


def session_log(session_id):
    path = layout.events_log(session_id)
    log = _logs.get(path)
    if log is None:
        log = _logs[path] = SessionLog(path, current_app.config["DECKS_MAX_LOG_BYTES"])
    return log


def review_link(session_id):
    return f"/review/{session_id}"


def create(deck_id, title):
    deck = decks.summary(deck_id)
    if deck is None:
        raise NotFound(f"deck {deck_id!r} does not exist")
    session_id = uuid.uuid4().hex
    record = {
        "id": session_id,
        "deck_id": deck_id,
        "title": title or deck["title"],
        "created_at": utc_timestamp("seconds"),
        "link": review_link(session_id),
    }
    directory = layout.session_dir(session_id)
    os.makedirs(directory)
    atomic_write(layout.session_json(session_id), json.dumps(record, indent=1).encode())
    return record


def find(session_id):
    """The session's record (a small file, read on the loop), or None: also when
    session.json is missing but the log exists, as the spec says."""
    return read_json(layout.session_json(session_id)) if layout.valid_id(session_id) else None


def require(session_id):
    record = find(session_id)
    if record is None:
        raise NotFound(f"session {session_id!r} does not exist")
    return record


def get(session_id):
    """The session record with its `last_seq`, or None."""
    record = find(session_id)
    if record is None:
        return None
    return {**record, "last_seq": last_seq_in_file(layout.events_log(session_id))}


def list_all():
    found = (get(session_id) for session_id in layout.ids_in(layout.sessions_dir()))
    return sorted((s for s in found if s), key=lambda s: s["created_at"], reverse=True)


def topic(session_id):
    return f"decks:session:{layout.events_log(session_id)}"


def append(session_id, event):
    return session_log(session_id).append(event)


def subscribe(session_id):
    return subscribe_feed(session_log(session_id), topic(session_id))


def events(session_id, after=0, limit=None):
    return blocking(read_events, layout.events_log(session_id), after, limit)


# A stream's replay is read this many events at a time, as the client takes them.
REPLAY_PAGE = 500


def replay(session_id, after):
    """The events past `after`, a page at a time: a replay of a long log neither reads it
    ahead of a slow client nor holds it in memory. The first page is read at once (its
    failure is the request's), the next ones as the stream sends."""
    path = layout.events_log(session_id)  # here: the pages are read outside the request's context
    first = events(session_id, after, REPLAY_PAGE)

    def pages(page, after):
        while True:
            yield from page
            if len(page) < REPLAY_PAGE:
                return
            after = page[-1]["seq"]
            page = blocking(read_events, path, after, REPLAY_PAGE)

    return pages(first, after)


# Room kept for the event of a scribble when checking before its image is stored.
SCRIBBLE_EVENT_BYTES = 512


def require_room(session_id, needed=SCRIBBLE_EVENT_BYTES):
    """507 at once when the log has no room for `needed` more bytes (so that a scribble's
    image is not stored for an event the log would refuse)."""
    limit = current_app.config["DECKS_MAX_LOG_BYTES"]
    try:
        size = os.stat(layout.events_log(session_id)).st_size
    except FileNotFoundError:
        size = 0
    if size + needed > limit:
        raise LogFull(limit)
