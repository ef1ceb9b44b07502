"""Numbered schema migrations of a service's database, in two phases.

Each database service keeps its history in its `migrations.py` (the registry's `migrations`): a `History` of
`Step`s numbered from 1, where step 1 is the schema of release 0.1.0 (the last release
without a history). Each step is an expand step (the default: safe while an older
release's code still runs on the database: a new table, a nullable column, an index)
or a contract step (a drop, a rename, a NOT NULL: only once no older code runs).

Every process that opens the database (each web worker, a job worker, a command)
applies the pending expand steps first, under a lock that all processes of all hosts
take in turn (SQLite: the write lock, taken at BEGIN; PostgreSQL: an advisory lock held
by the transaction), so each step runs exactly once, and a process that finds another
one migrating waits for it (LOCK_WAIT_SECONDS at most) instead of starting on a half
migrated schema:

- an empty database gets the current models' tables and is recorded at the newest
  version, contract steps included: the models are the newest schema, and the steps
  exist only to bring an older database to it (a test checks that both roads give the
  same schema);
- a database with the service's tables and no history is release 0.1.0's: recorded
  at version 1, then brought forward;
- otherwise every expand step that is not recorded runs, in order, inside the
  transaction that records it (DDL is transactional on SQLite and PostgreSQL). On
  SQLite the steps run with foreign keys off, as SQLite's procedure for schema
  changes says: playhouse.migrate rebuilds a table to change a column, and dropping
  the old table would otherwise fire ON DELETE actions on the rows that refer to it
  (SET NULL, CASCADE). The keys are checked before the commit instead;
- the contract steps run only through `contract()` (the command
  `python -m app.<service> contract`), once every host runs this code: it refuses
  while a process of another release is live (app.common.live_processes). So the code
  works with its contract steps applied or not, and an expand step must not depend on
  an earlier contract step having run;
- a database that holds a contract step newer than the code refuses the start with
  one line (SchemaTooNew): this code may read what that step dropped. A newer expand
  step is fine (logged once): it only added what this code does not use. (Release
  0.2.0 predates the phases and refuses any newer step.)

The history lives in the table `schema_migrations (version, name, applied_at, phase)`;
`phase` was added by release 0.3.0 (NULL in earlier rows: they were all expand steps).
"""

import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from peewee import Database, Model, PostgresqlDatabase, SqliteDatabase
from playhouse.migrate import SchemaMigrator

from app.common import live_processes
from app.common.config import ConfigError
from app.common.timeutil import utc_timestamp

log = logging.getLogger("bundle.migrations")

HISTORY_TABLE = "schema_migrations"
# A process that finds another one migrating waits its turn this long at most.
LOCK_WAIT_SECONDS = 300.0
EXPAND: Literal["expand"] = "expand"
CONTRACT: Literal["contract"] = "contract"
Phase = Literal["expand", "contract"]

# (service, version) of the unknown expand steps already logged by this process.
_logged_unknown: set[tuple[str, int]] = set()


class SchemaTooNew(ConfigError):
    """The database holds a contract step of a newer release than this code."""


class ContractRefused(Exception):
    """A contract step was asked for while a process of another release is live."""


@dataclass(frozen=True)
class Step:
    version: int
    name: str
    # apply(db, migrator): the change, with playhouse.migrate's operations or SQL.
    # None for step 1, the release 0.1.0 schema, which has nothing to apply.
    apply: Callable[[Database, SchemaMigrator], object] | None = None
    # "expand": safe while older code runs (run at every start); "contract": run only
    # by the `contract` command, once no older release is live.
    phase: Phase = EXPAND

    def __post_init__(self) -> None:
        if self.phase not in (EXPAND, CONTRACT):
            raise ValueError(f"step {self.version}: phase must be {EXPAND!r} or {CONTRACT!r}, got {self.phase!r}")


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

    def pending(self, recorded: dict[int, str | None], phase: Phase) -> list[Step]:
        """The steps of `phase` that `recorded` ({version: phase}) lacks, in order."""
        return [step for step in self.steps if step.phase == phase and step.version not in recorded]


@dataclass(frozen=True)
class Contracted:
    """What contract() found: the contract steps it ran (or would run: dry_run), the
    expand steps that ran (or would run) before them, and (dry_run) the live processes
    of other releases that would make it refuse now."""

    expand: list[Step]
    contract: list[Step]
    blockers: list[str] = field(default_factory=list)


def bring_up_to_date(db: Database, history: History) -> int:
    """Apply the expand steps of `history` that the database lacks; returns the newest
    version of `history` it holds."""
    with db.connection_context(), _foreign_keys_deferred(db), _locked(db, history.service):
        recorded = _prepare(db, history)
        if recorded is None:
            return history.newest
        _expand(db, history, recorded)
        return max(version for version in recorded if version <= history.newest)


def contract(db: Database, history: History, release: str, dry_run: bool = False) -> Contracted:
    """Run the pending contract steps (after any pending expand step), under the
    migration lock; ContractRefused while a process of another release than `release`
    is live. `dry_run`: change nothing, say what would run."""
    with db.connection_context(), _foreign_keys_deferred(db), _locked(db, history.service):
        recorded = _prepare(db, history, create=not dry_run)
        if recorded is None:  # a new database: made at the newest schema
            return Contracted([], [])
        expand, pending = history.pending(recorded, EXPAND), history.pending(recorded, CONTRACT)
        if dry_run:
            known = pending and db.table_exists(live_processes.TABLE)
            return Contracted(expand, pending, live_processes.others_live(db, release) if known else [])
        _expand(db, history, recorded)
        if pending:
            others = live_processes.others_live(db, release)
            if others:
                more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
                raise ContractRefused(
                    f"the {history.service} schema was not contracted: {others[0]} is live{more}; "
                    "upgrade or stop it, then run contract again"
                )
            migrator = SchemaMigrator.from_database(db)
            for step in pending:
                step.apply(db, migrator)  # type: ignore[misc]  # step 1 is an expand step
                _record(db, step)
            _check_foreign_keys(db)
        return Contracted(expand, pending)


def applied_versions(db: Database) -> list[tuple[Any, ...]]:
    """The recorded history: [(version, name, applied_at)], oldest first."""
    with db.connection_context():
        return [
            tuple(row)
            for row in db.execute_sql(f"SELECT version, name, applied_at FROM {HISTORY_TABLE} ORDER BY version")
        ]


def recorded_phases(db: Database) -> dict[int, str | None]:
    """{version: phase} of the recorded history (None: a row of a release before the phases)."""
    with db.connection_context():
        return _recorded(db)


def _prepare(db: Database, history: History, create: bool = True) -> dict[int, str | None] | None:
    """The bookkeeping tables made or brought forward, and the recorded history
    ({version: phase}); None when the database was empty and is now made at the newest
    schema. Refuses a database that holds a contract step newer than the code. Without
    `create`, changes nothing (a dry run): an empty database answers as made."""
    exists = db.table_exists(HISTORY_TABLE)
    if not create:
        if not exists:
            return {1: EXPAND} if db.table_exists(history.models[0]._meta.table_name) else None
        recorded = _recorded(db)
        _refuse_unknown_contract(history, recorded)
        return recorded or None
    if not exists:
        db.execute_sql(
            f"CREATE TABLE {HISTORY_TABLE} (version INTEGER PRIMARY KEY, name VARCHAR(200) NOT NULL, "
            "applied_at VARCHAR(40) NOT NULL, phase VARCHAR(20))"
        )
    elif "phase" not in {column.name for column in db.get_columns(HISTORY_TABLE)}:
        db.execute_sql(f"ALTER TABLE {HISTORY_TABLE} ADD COLUMN phase VARCHAR(20)")  # made by release 0.2.0
    live_processes.create_table(db)
    recorded = _recorded(db)
    if not recorded:
        if db.table_exists(history.models[0]._meta.table_name):
            _record(db, history.steps[0])  # release 0.1.0's database
            return {1: EXPAND}
        _create(db, history)
        return None
    _refuse_unknown_contract(history, recorded)
    return recorded


def _recorded(db: Database) -> dict[int, str | None]:
    if "phase" not in {column.name for column in db.get_columns(HISTORY_TABLE)}:
        return {version: None for (version,) in db.execute_sql(f"SELECT version FROM {HISTORY_TABLE}")}
    return {version: phase for version, phase in db.execute_sql(f"SELECT version, phase FROM {HISTORY_TABLE}")}


def _refuse_unknown_contract(history: History, recorded: dict[int, str | None]) -> None:
    unknown = sorted(version for version in recorded if version > history.newest)
    contracts = [version for version in unknown if recorded[version] == CONTRACT]
    if contracts:
        raise SchemaTooNew(
            f"the {history.service} database is at schema version {max(unknown)}, newer than this code's "
            f"{history.newest}, and its step {contracts[0]} is a contract step: run the release that "
            "migrated it, or a newer one"
        )
    fresh = [version for version in unknown if (history.service, version) not in _logged_unknown]
    if fresh:
        _logged_unknown.update((history.service, version) for version in fresh)
        log.warning(
            "the %s database holds expand step(s) %s of a newer release than this code (newest %d): "
            "serving, as an expand step only adds what this code does not use",
            history.service,
            ", ".join(map(str, fresh)),
            history.newest,
        )


def _expand(db: Database, history: History, recorded: dict[int, str | None]) -> None:
    """Apply the pending expand steps, in order, and add them to `recorded`."""
    pending = history.pending(recorded, EXPAND)
    if not pending:
        return
    migrator = SchemaMigrator.from_database(db)
    for step in pending:
        step.apply(db, migrator)  # type: ignore[misc]  # only step 1 has none, and it is always recorded
        _record(db, step)
        recorded[step.version] = step.phase
    _check_foreign_keys(db)


def _create(db: Database, history: History) -> None:
    db.create_tables(history.models)
    if history.create_extra:
        history.create_extra(db)
    for step in history.steps:
        _record(db, step)


def _record(db: Database, step: Step) -> None:
    db.execute_sql(
        f"INSERT INTO {HISTORY_TABLE} (version, name, applied_at, phase) VALUES (?, ?, ?, ?)".replace("?", db.param),
        (step.version, step.name, utc_timestamp(), step.phase),
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
