"""Where things live below DATA_DIR (the spec's layout), and the id rules.

    decks/<deck_id>/deck.json, decks/<deck_id>/assets/...
    sessions/<session_id>/session.json, events.jsonl, scribbles/<name>.png

Directories are created lazily, by the first write that needs them.
"""

import os
import re

from flask import current_app

ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def valid_id(value):
    return isinstance(value, str) and ID_PATTERN.match(value) is not None


def ids_in(directory):
    """The valid ids among the entries of `directory`, sorted (none if it is missing)."""
    try:
        return sorted(name for name in os.listdir(directory) if valid_id(name))
    except FileNotFoundError:
        return []


def data_dir():
    return current_app.config["DATA_DIR"]


def decks_dir():
    return os.path.join(data_dir(), "decks")


def deck_dir(deck_id):
    return os.path.join(decks_dir(), deck_id)


def deck_json(deck_id):
    return os.path.join(deck_dir(deck_id), "deck.json")


def sessions_dir():
    return os.path.join(data_dir(), "sessions")


def session_dir(session_id):
    return os.path.join(sessions_dir(), session_id)


def session_json(session_id):
    return os.path.join(session_dir(session_id), "session.json")


def events_log(session_id):
    return os.path.join(session_dir(session_id), "events.jsonl")


def scribbles_dir(session_id):
    return os.path.join(session_dir(session_id), "scribbles")
