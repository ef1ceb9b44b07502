"""Numbered schema migrations of a service's database, applied as a process starts.

Each database service keeps its history in its `migrations.py` (the registry's `migrations`): a `History` of
`Step`s numbered from 1, where step 1 is the schema of release 0.1.0 (the last release
without a history). Every process that opens the database (each web worker, a job
worker, a command) brings it up to date first, under a lock that all processes of all
hosts take in turn (SQLite: the write lock, taken at BEGIN; PostgreSQL: an advisory
lock held by the transaction), so each step runs exactly once:

- an empty database gets the current models' tables and is recorded at the newest
  version: the models are the newest schema, and the steps exist only to bring an
  older database to it (a test checks that both roads give the same schema);
- a database with the service's tables and no history is release 0.1.0's: recorded
  at version 1, then brought forward;
- otherwise every step newer than the recorded version runs, in order, inside the
  transaction that records it (DDL is transactional on SQLite and PostgreSQL). On
  SQLite the steps run with foreign keys off, as SQLite's procedure for schema
  changes says: playhouse.migrate rebuilds a table to change a column, and dropping
  the old table would otherwise fire ON DELETE actions on the rows that refer to it
  (SET NULL, CASCADE). The keys are checked before the commit instead;
- a database recorded at a version newer than the code refuses the start with one
  line (SchemaTooNew): an older release must not write to a schema it does not know.

The history lives in the table `schema_migrations (version, name, applied_at)`.
"""

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from peewee import Database, Model, PostgresqlDatabase, SqliteDatabase
from playhouse.migrate import SchemaMigrator

from app.common.config import ConfigError
from app.common.timeutil import utc_timestamp

HISTORY_TABLE = "schema_migrations"
# A process that finds another one migrating waits its turn this long at most.
LOCK_WAIT_SECONDS = 300.0


class SchemaTooNew(ConfigError):
    """The database was migrated by a newer release than this code."""


@dataclass(frozen=True)
class Step:
    version: int
    name: str
    # apply(db, migrator): the change, with playhouse.migrate's operations or SQL.
    # None for step 1, the release 0.1.0 schema, which has nothing to apply.
    apply: Callable[[Database, SchemaMigrator], object] | None = None


@dataclass(frozen=True)
class History:
    service: str
    models: Sequence[type[Model]]
    steps: Sequence[Step] = field(default_factory=list)
    # create_extra(db): what create_tables does not make (SQLite's full-text table).
    create_extra: Callable[[Database], object] | None = None

    def __post_init__(self) -> None:
        numbers = [step.version for step in self.steps]
        if numbers != list(range(1, len(numbers) + 1)):
            raise ValueError(f"{self.service}: schema steps must be numbered 1, 2, 3...; got {numbers}")

    @property
    def newest(self) -> int:
        return self.steps[-1].version


def bring_up_to_date(db: Database, history: History) -> int:
    """Apply what `history` has that the database lacks; returns the version it is at."""
    with db.connection_context(), _foreign_keys_deferred(db), _locked(db, history.service):
        db.execute_sql(
            f"CREATE TABLE IF NOT EXISTS {HISTORY_TABLE} (version INTEGER PRIMARY KEY, "
            "name VARCHAR(200) NOT NULL, applied_at VARCHAR(40) NOT NULL)"
        )
        current: int | None = db.execute_sql(f"SELECT MAX(version) FROM {HISTORY_TABLE}").fetchone()[0]
        if current is None:
            if db.table_exists(history.models[0]._meta.table_name):
                _record(db, history.steps[0])  # release 0.1.0's database
                current = 1
            else:
                _create(db, history)
                return history.newest
        if current > history.newest:
            raise SchemaTooNew(
                f"the {history.service} database is at schema version {current}, newer than this code's "
                f"{history.newest}: run the release that migrated it, or a newer one"
            )
        migrator = SchemaMigrator.from_database(db)
        for step in history.steps[current:]:
            step.apply(db, migrator)  # type: ignore[misc]  # only step 1 has none, and it never runs here
            _record(db, step)
        _check_foreign_keys(db)
        return history.newest


def applied_versions(db: Database) -> list[tuple[Any, ...]]:
    """The recorded history: [(version, name, applied_at)], oldest first."""
    with db.connection_context():
        return [
            tuple(row)
            for row in db.execute_sql(f"SELECT version, name, applied_at FROM {HISTORY_TABLE} ORDER BY version")
        ]


def _create(db: Database, history: History) -> None:
    db.create_tables(history.models)
    if history.create_extra:
        history.create_extra(db)
    for step in history.steps:
        _record(db, step)


def _record(db: Database, step: Step) -> None:
    db.execute_sql(
        f"INSERT INTO {HISTORY_TABLE} (version, name, applied_at) VALUES (?, ?, ?)".replace("?", db.param),
        (step.version, step.name, utc_timestamp()),
    )


@contextmanager
def _locked(db: Database, service: str) -> Iterator[None]:
    """A transaction that holds the database's migration lock from its start."""
    if isinstance(db, SqliteDatabase):
        # BEGIN IMMEDIATE takes the write lock, or waits busy_timeout for it: long
        # enough here for another process's migration to end.
        with _busy_timeout(db, LOCK_WAIT_SECONDS), db.atomic("IMMEDIATE"):
            yield
        return
    with db.atomic():
        if isinstance(db, PostgresqlDatabase):
            db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (_lock_key(service),))
        yield


@contextmanager
def _foreign_keys_deferred(db: Database) -> Iterator[None]:
    """SQLite: foreign keys off for the migration's transaction (the pragma is a no-op
    inside one, so it is set before it begins), on again after."""
    if not isinstance(db, SqliteDatabase):
        yield
        return
    enabled = db.execute_sql("PRAGMA foreign_keys").fetchone()[0]
    db.execute_sql("PRAGMA foreign_keys = OFF")
    try:
        yield
    finally:
        db.execute_sql(f"PRAGMA foreign_keys = {'ON' if enabled else 'OFF'}")


def _check_foreign_keys(db: Database) -> None:
    """SQLite: a step must leave no row referring to a missing one (else it rolls back)."""
    if isinstance(db, SqliteDatabase):
        broken = db.execute_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(f"a schema step left rows whose foreign keys point nowhere: {broken[:5]}")


@contextmanager
def _busy_timeout(db: Database, seconds: float) -> Iterator[None]:
    before = db.execute_sql("PRAGMA busy_timeout").fetchone()[0]
    db.execute_sql(f"PRAGMA busy_timeout = {int(seconds * 1000)}")
    try:
        yield
    finally:
        db.execute_sql(f"PRAGMA busy_timeout = {int(before)}")


def _lock_key(service: str) -> int:
    """A stable signed 64-bit key for the service's migration lock."""
    digest = hashlib.sha256(f"bundle schema migrations: {service}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
