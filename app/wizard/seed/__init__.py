"""The global wizards (user_id NULL), seeded once in the life of a database from
wizards.json: an administrator may later edit or delete them, and a restart does
not bring deleted ones back."""

import json
from pathlib import Path

from app.common.db import write_transaction
from app.wizard import cache
from app.wizard.models import Marker, Wizard, database

SEED_FILE = Path(__file__).with_name("wizards.json")
_MARKER = "seeded:global-wizards"


def seed_global_wizards():
    wizards = json.loads(SEED_FILE.read_text(encoding="utf-8"))
    # Immediate: a second worker starting at the same moment waits, then sees the marker.
    with database.connection_context(), write_transaction(database):
        if Marker.get_or_none(Marker.key == _MARKER):
            return 0
        Marker.create(key=_MARKER)
        for wizard in reversed(wizards):  # the first in the file is the newest
            Wizard.create(user_id=None, is_public=True, data={**wizard, "is_public": True})
        cache.bump("wizards")
    return len(wizards)
