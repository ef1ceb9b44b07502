"""Reading imported decks."""

import os

from app.common.fsutil import read_json
from app.decks import layout

SUMMARY_FIELDS = ("id", "title", "slide_count", "source", "imported_at")


def load(deck_id):
    """The parsed deck, or None."""
    return read_json(layout.deck_json(deck_id)) if layout.valid_id(deck_id) else None


def summary(deck_id):
    deck = load(deck_id)
    return {k: deck.get(k) for k in SUMMARY_FIELDS} if deck else None


def list_all():
    found = (summary(deck_id) for deck_id in layout.ids_in(layout.decks_dir()))
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


_slide_counts: dict[object, int] = {}
