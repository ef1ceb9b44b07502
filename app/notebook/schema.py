"""The notebook database's schema: its numbered history (app.common.migrations) and
how a process opens the database. Add a step at the end of STEPS for every change of
a model's table, and change the model to match."""
from peewee import ForeignKeyField, SqliteDatabase, TextField
from playhouse.migrate import migrate

from app.common.db import connect_database
from app.common.migrations import History, Step
from app.notebook.models import FTS_DDL, FTS_RANK, MODELS, LanguageModel, database


def _create_search_index(db):
    """SQLite's full-text table and its rank, made with a new database. (Writing FTS5's
    configuration again, even with the same value, changes it under every other
    process's open statements: their next search fails with "SQL logic error".)"""
    if isinstance(db, SqliteDatabase):
        db.execute_sql(FTS_DDL)
        db.execute_sql(FTS_RANK)


def _model_of_transformations_and_modalities(db, migrator):
    """Open Notebook's clients set a transformation's model and a credential's modalities."""
    migrate(
        migrator.add_column("transformation", "model_id",
                            ForeignKeyField(LanguageModel, null=True, on_delete="SET NULL", field=LanguageModel.id)),
        migrator.add_column("credential", "modalities", TextField(null=True)),
    )


STEPS = [
    Step(1, "release 0.1.0"),
    Step(2, "a transformation's model, a credential's modalities", _model_of_transformations_and_modalities),
]
HISTORY = History("notebook", MODELS, STEPS, create_extra=_create_search_index)


def open_database(url, pool=True):
    """Connect the models to `url`, migrated. `pool`: pooled connections, for the web
    worker where each request is a greenlet."""
    return connect_database(database, url, HISTORY, pool=pool)
