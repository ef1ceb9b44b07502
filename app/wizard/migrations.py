"""The wizard database's schema: its numbered history (app.common.migrations) and how
a process opens the database. Add a step at the end of STEPS for every change of a
model's table, and change the model to match: an expand step (the default) for what
release 0.2.0's code, still running on another host, can live with; a contract step
for what it cannot (it runs through `python -m app.wizard contract`)."""

from playhouse.migrate import migrate

from app.common.db import connect_database
from app.common.migrations import CONTRACT, History, Step
from app.wizard import cache, events
from app.wizard.models import COLLECTIONS, MODELS, CollectionVersion, database

# Raw names, not the models: the models may have moved on by the time a step runs.
_COLLECTION_TABLES = ("wizards", "blueprints", "prompt_history", "saved_prompts", "likes", "admin_prompts", "llm_logs")
# The names peewee gives the models' indexes (after the model's class, not its table).
_KEY_INDEXES = {
    "wizards": "wizard_key",
    "blueprints": "blueprint_key",
    "prompt_history": "prompthistory_key",
    "saved_prompts": "savedprompt_key",
    "likes": "like_key",
    "admin_prompts": "adminprompt_key",
    "llm_logs": "llmlog_key",
}


def _index_the_key_filter(db, migrator):
    """`?filter={"key": ...}` (an admin prompt, a saved prompt by its key) was a scan
    of the collection: each collection's `key` gets an index, as user_id and
    blueprint_id have. CREATE INDEX (not CONCURRENTLY, which cannot run in the
    migration's transaction) blocks writes to the table while it builds: a fraction of
    a second for the sizes the wizard's collections have (thousands of rows), which
    the writes of the older release still running wait out."""
    migrate(*(migrator.add_index(table, ("key",), name=_KEY_INDEXES[table]) for table in _COLLECTION_TABLES))


def _like_counts_only_on_blueprints(db, migrator):
    """Release 0.2.0 declared `likes_count` on every collection and read it with
    every row; only blueprints have likes, and the current code reads it there only."""
    others = [table for table in _COLLECTION_TABLES if table != "blueprints"]
    migrate(*(migrator.drop_column(table, "likes_count") for table in others))


STEPS = [
    Step(1, "release 0.1.0"),
    Step(2, "an index on each collection's key", _index_the_key_filter),
    Step(3, "a like count on blueprints only", _like_counts_only_on_blueprints, phase=CONTRACT),
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
