"""Reading imported decks."""
import json
import os

from app.decks import layout

SUMMARY_FIELDS = ("id", "title", "slide_count", "source", "imported_at")


def load(deck_id):
    """The parsed deck, or None."""
    if not layout.valid_id(deck_id):
        return None
    try:
        with open(layout.deck_json(deck_id), "rb") as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError):
        return None


def summary(deck_id):
    deck = load(deck_id)
    return {k: deck.get(k) for k in SUMMARY_FIELDS} if deck else None


def list_all():
    try:
        names = sorted(os.listdir(layout.decks_dir()))
    except FileNotFoundError:
        return []
    found = (summary(name) for name in names if layout.valid_id(name))
    return [d for d in found if d]


def slide_count(deck_id):
    """The deck's slide count, cached by deck.json's identity: events are validated
    against it on every post, and deck.json may be large."""
    try:
        st = os.stat(layout.deck_json(deck_id))
    except (FileNotFoundError, NotADirectoryError):
        return None
    key = (layout.deck_json(deck_id), st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _slide_counts:
        deck = load(deck_id)
        if deck is None:
            return None
        if len(_slide_counts) > 1000:
            _slide_counts.clear()
        _slide_counts[key] = deck["slide_count"]
    return _slide_counts[key]


_slide_counts = {}
