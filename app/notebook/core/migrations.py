"""The notebook database's schema: its numbered history (app.common.migrations) and
how a process opens the database. Add a step at the end of STEPS for every change of
a model's table, and change the model to match."""

from peewee import CharField, DateTimeField, ForeignKeyField, IntegerField, Model, SqliteDatabase, TextField
from playhouse.migrate import migrate

from app.common.db import JSONField, connect_database
from app.common.migrations import History, Step
from app.notebook.core import index
from app.notebook.core.ids import public
from app.notebook.core.models import FTS_DDL, FTS_RANK, MODELS, LanguageModel, Source, database

# PostgreSQL's full-text index (see index.py): columns of `searchdoc` that the model
# does not declare, so that SQLite's schema stays what it was.
POSTGRES_SEARCH_DDL = (
    "ALTER TABLE searchdoc ADD COLUMN IF NOT EXISTS body_start INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE searchdoc ADD COLUMN IF NOT EXISTS document TSVECTOR",
    "CREATE INDEX IF NOT EXISTS searchdoc_document ON searchdoc USING GIN (document)",
)


def _create_search_index(db):
    """The full-text index, made with a new database: SQLite's full-text table and
    its rank (writing FTS5's configuration again, even with the same value, changes it
    under every other process's open statements: their next search fails with "SQL
    logic error"), or PostgreSQL's tsvector column and its GIN index."""
    if isinstance(db, SqliteDatabase):
        db.execute_sql(FTS_DDL)
        db.execute_sql(FTS_RANK)
    else:
        for statement in POSTGRES_SEARCH_DDL:
            db.execute_sql(statement)


def _model_of_transformations_and_modalities(db, migrator):
    """Open Notebook's clients set a transformation's model and a credential's modalities."""
    migrate(
        migrator.add_column(
            "transformation",
            "model_id",
            ForeignKeyField(LanguageModel, null=True, on_delete="SET NULL", field=LanguageModel.id),
        ),
        migrator.add_column("credential", "modalities", TextField(null=True)),
    )


def _postgres_text_search(db, migrator):
    """PostgreSQL's full-text index, and what a PostgreSQL database made before it
    holds indexed in it (text search refused PostgreSQL then). Nothing on SQLite,
    whose FTS5 table came with the database."""
    if isinstance(db, SqliteDatabase):
        return
    for statement in POSTGRES_SEARCH_DDL:
        db.execute_sql(statement)
    index_everything(db)


def _ollama_context_window(db, migrator):
    """Open Notebook's UI sets an Ollama credential's context window (num_ctx)."""
    migrate(migrator.add_column("credential", "num_ctx", IntegerField(null=True)))


def _open_notebook_ui(db, migrator):
    """What Open Notebook's web UI needs: notebooks may share a name (the unique index
    becomes a plain one: an older release only loses its 409, so this is an expand
    step), and views are stamped for /recently-viewed."""
    migrate(
        migrator.drop_index("notebook", "notebook_name_key"),
        migrator.add_index("notebook", ("name_key",), False),
        migrator.add_column("notebook", "last_viewed_at", DateTimeField(null=True)),
        migrator.add_index("notebook", ("last_viewed_at",), False),
        migrator.add_column("source", "last_viewed_at", DateTimeField(null=True)),
        migrator.add_index("source", ("last_viewed_at",), False),
    )


def _source_chat_and_settings(db, migrator):
    """A chat session tied to a source (Open Notebook's source chat) and the settings
    table (Open Notebook's settings and the default transformation instructions)."""
    migrate(
        migrator.add_column(
            "chatsession",
            "source_id",
            ForeignKeyField(Source, null=True, on_delete="CASCADE", field=Source.id),
        ),
    )

    class Setting(Model):  # the table as this step makes it (the model may move on)
        key = CharField(primary_key=True, max_length=100)
        value = JSONField(null=True)

        class Meta:
            database = db
            table_name = "setting"

    db.create_tables([Setting])


def index_everything(db):
    """Index every source and note of `db` (the models' proxy is connected to it)."""
    # Raw SQL: the models may have moved on by the time a migration step runs this.
    for key, title, status, text in db.execute_sql("SELECT id, title, status, full_text FROM source").fetchall():
        if status == "completed" or title:
            index.put(public("source", key), title, text if status == "completed" else "")
    for key, title, content in db.execute_sql("SELECT id, title, content FROM note").fetchall():
        index.put(public("note", key), title, content)


def _material_of_episodes(db, migrator):
    """Open Notebook's UI sends a podcast's material and a briefing with the request."""
    migrate(
        migrator.add_column("episode", "material", TextField(null=True)),
        migrator.add_column("episode", "briefing", TextField(null=True)),
    )


STEPS = [
    Step(1, "release 0.1.0"),
    Step(2, "a transformation's model, a credential's modalities", _model_of_transformations_and_modalities),
    Step(3, "PostgreSQL's full-text index", _postgres_text_search),
    Step(4, "an Ollama credential's context window", _ollama_context_window),
    Step(5, "an episode's material and briefing", _material_of_episodes),
    Step(6, "Open Notebook's UI: shared notebook names, views", _open_notebook_ui),
    Step(7, "a chat session's source, the settings", _source_chat_and_settings),
]
# Steps 2 and 3 are release 0.2.0's: recorded where it reads them (app.common.migrations).
HISTORY = History("notebook", MODELS, STEPS, create_extra=_create_search_index, before_phases=3)


def open_database(url, pool=True):
    """Connect the models to `url`, migrated. `pool`: pooled connections, for the web
    worker where each request is a greenlet."""
    return connect_database(database, url, HISTORY, pool=pool)
