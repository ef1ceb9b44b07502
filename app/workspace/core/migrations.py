"""The workspace database's schema: its numbered history (app.common.migrations) and
how a process opens the database. Add a step at the end of STEPS for every change of
a model's table, and change the model to match."""

from app.common.db import connect_database
from app.common.migrations import History, Step
from app.workspace.core.models import DEFAULT_ORGANIZATION, MODELS, Organization, database

STEPS = [
    Step(1, "release 0.1.0"),
]
HISTORY = History("workspace", MODELS, STEPS)


def open_database(url):
    """Connect the models to `url`, migrated, with the default organization."""
    db = connect_database(database, url, HISTORY)
    with db.connection_context():
        if not Organization.select().where(Organization.is_default).exists():
            Organization.get_or_create(name=DEFAULT_ORGANIZATION, defaults={"is_default": True})
    return db
