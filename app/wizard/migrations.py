"""The wizard database's schema: its numbered history (app.common.migrations) and how
a process opens the database. Add a step at the end of STEPS for every change of a
model's table, and change the model to match."""

from app.common.db import connect_database
from app.common.migrations import History, Step
from app.wizard import cache, events
from app.wizard.models import COLLECTIONS, MODELS, CollectionVersion, database

STEPS = [
    Step(1, "release 0.1.0"),
]
HISTORY = History("wizard", MODELS, STEPS)


def open_database(url):
    """Connect the models to `url`, migrated, with a version counter per collection."""
    db = connect_database(database, url, HISTORY)
    cache.clear()
    events.forget()
    with db.connection_context():
        for name in COLLECTIONS:
            CollectionVersion.get_or_create(name=name)
    return db
