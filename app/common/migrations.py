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
one migrating waits for it (LOCK_WAIT_SECONDS at most, then MigrationLockTimeout; on
PostgreSQL through `SET LOCAL lock_timeout`) instead of starting on a half migrated
schema:

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
  while a process of another release is live (app.common.live_processes; on SQLite
  also a process of this host that holds the file open unregistered, as release
  0.2.0's do). So the code
  works with its contract steps applied or not, and an expand step must not depend on
  an earlier contract step having run;
- a database that holds a contract step newer than the code refuses the start with
  one line (SchemaTooNew): this code may read what that step dropped. A newer expand
  step is fine (logged once): it only added what this code does not use.

The history lives in two tables of the same columns (version, name, applied_at,
phase). `schema_migrations` is the one every release reads: release 0.2.0, before
the phases, takes its MAX(version) for the database's version and refuses to start
on any version newer than its own. So the expand steps after the releases before the
phases (`History.before_phases`) are recorded in `schema_expansions`, which those
releases never read: an older release still starts (and can be rolled back to) on
an expanded database. A contract step is recorded in `schema_migrations` with copies
of every step below it, so that after a contract the older releases do refuse to
start: what they read may be gone. This code's history is the union of both tables.
`phase` was added to `schema_migrations` by release 0.3.0 (NULL in earlier rows: they
were all expand steps).
"""

import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

from peewee import Database, Model, OperationalError, PostgresqlDatabase, SqliteDatabase
from playhouse.migrate import SchemaMigrator

from app.common import live_processes
from app.common.config import ConfigError
from app.common.timeutil import utc_timestamp

log = logging.getLogger("bundle.migrations")

HISTORY_TABLE = "schema_migrations"
# The expand steps that the releases before the phases must not see (see above).
EXPANSIONS_TABLE = "schema_expansions"
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


class MigrationLockTimeout(RuntimeError):
    """Another process held the migration lock for more than LOCK_WAIT_SECONDS."""


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
    # The newest step of the releases before the phases (0.2.0), which take
    # schema_migrations' MAX(version) for their version and run the steps after it: the
    # steps up to this one are recorded there (else such a release would run them again).
    before_phases: int = 1

    def __post_init__(self) -> None:
        numbers = [step.version for step in self.steps]
        if numbers != list(range(1, len(numbers) + 1)):
            raise ValueError(f"{self.service}: schema steps must be numbered 1, 2, 3...; got {numbers}")
        if any(step.phase == CONTRACT for step in self.steps[: self.before_phases]):
            raise ValueError(
                f"{self.service}: the steps before the phases (1 to {self.before_phases}) are expand steps"
            )

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
            return Contracted(expand, pending, _others_live(db, history, release) if pending else [])
        _expand(db, history, recorded)
        if pending:
            others = _others_live(db, history, release)
            if others:
                more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
                raise ContractRefused(
                    f"the {history.service} schema was not contracted: {others[0]} is live{more}; "
                    "upgrade or stop it, then run contract again"
                )
            migrator = SchemaMigrator.from_database(db)
            for step in pending:
                step.apply(db, migrator)  # type: ignore[misc]  # step 1 is an expand step
                _record(db, history, step)
            _check_foreign_keys(db)
        return Contracted(expand, pending)


def has_history(db: Database, history: History) -> bool:
    """Whether the database holds the service's schema (its history or, a release
    0.1.0 database, its first model's table): what a command that must not create a
    database checks first."""
    with db.connection_context():
        return db.table_exists(HISTORY_TABLE) or db.table_exists(history.models[0]._meta.table_name)


def _others_live(db: Database, history: History, release: str) -> list[str]:
    """The processes of other releases than `release` on the database (the caller holds
    a connection): the registered ones, the PostgreSQL connections of other releases,
    and, on SQLite, the processes of this host that hold the file open unregistered."""
    found = live_processes.others_live(db, release, history.service) if db.table_exists(live_processes.TABLE) else []
    if isinstance(db, SqliteDatabase):
        found += live_processes.unregistered_holders(db, release)
    return found


def applied_versions(db: Database) -> list[tuple[Any, ...]]:
    """The recorded history, both tables: [(version, name, applied_at)], oldest first."""
    with db.connection_context():
        rows = {row[0]: tuple(row) for row in db.execute_sql(f"SELECT version, name, applied_at FROM {HISTORY_TABLE}")}
        if db.table_exists(EXPANSIONS_TABLE):
            for row in db.execute_sql(f"SELECT version, name, applied_at FROM {EXPANSIONS_TABLE}"):
                rows.setdefault(row[0], tuple(row))
        return [rows[version] for version in sorted(rows)]


def recorded_versions(db: Database) -> frozenset[int]:
    """The versions recorded in both tables, on the caller's open connection (a
    readiness check, which opens and discards its connection itself)."""
    return frozenset(int(version) for version in _recorded(db))


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
    for table in (HISTORY_TABLE, EXPANSIONS_TABLE):
        db.execute_sql(
            f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER PRIMARY KEY, name VARCHAR(200) NOT NULL, "
            "applied_at VARCHAR(40) NOT NULL, phase VARCHAR(20))"
        )
    if exists and "phase" not in {column.name for column in db.get_columns(HISTORY_TABLE)}:
        db.execute_sql(f"ALTER TABLE {HISTORY_TABLE} ADD COLUMN phase VARCHAR(20)")  # made by release 0.2.0
    live_processes.create_table(db)
    recorded = _recorded(db)
    if not recorded:
        if db.table_exists(history.models[0]._meta.table_name):
            _record(db, history, history.steps[0])  # release 0.1.0's database
            return {1: EXPAND}
        _create(db, history)
        return None
    _refuse_unknown_contract(history, recorded)
    return recorded


def _recorded(db: Database) -> dict[int, str | None]:
    """{version: phase} of both tables (None: a row of a release before the phases)."""
    found: dict[int, str | None] = {}
    if db.table_exists(EXPANSIONS_TABLE):
        found.update(db.execute_sql(f"SELECT version, phase FROM {EXPANSIONS_TABLE}").fetchall())
    if "phase" not in {column.name for column in db.get_columns(HISTORY_TABLE)}:
        found.update((version, None) for (version,) in db.execute_sql(f"SELECT version FROM {HISTORY_TABLE}"))
    else:
        found.update(db.execute_sql(f"SELECT version, phase FROM {HISTORY_TABLE}").fetchall())
    return found


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
        _record(db, history, step)
        recorded[step.version] = step.phase
    _check_foreign_keys(db)


def _create(db: Database, history: History) -> None:
    db.create_tables(history.models)
    if history.create_extra:
        history.create_extra(db)
    for step in history.steps:
        _record(db, history, step)


def _record(db: Database, history: History, step: Step) -> None:
    """Record `step` as applied: in schema_migrations when the releases before the
    phases knew it, or when it is a contract step (with copies of the steps below it
    that only schema_expansions holds); else, an expand step, in schema_expansions."""
    table = EXPANSIONS_TABLE if step.phase == EXPAND and step.version > history.before_phases else HISTORY_TABLE
    db.execute_sql(
        f"INSERT INTO {table} (version, name, applied_at, phase) VALUES (?, ?, ?, ?)".replace("?", db.param),
        (step.version, step.name, utc_timestamp(), step.phase),
    )
    if step.phase == CONTRACT:
        db.execute_sql(
            f"INSERT INTO {HISTORY_TABLE} (version, name, applied_at, phase) "
            f"SELECT version, name, applied_at, phase FROM {EXPANSIONS_TABLE} "
            f"WHERE version < ? AND version NOT IN (SELECT version FROM {HISTORY_TABLE})".replace("?", db.param),
            (step.version,),
        )


@contextmanager
def _locked(db: Database, service: str) -> Iterator[None]:
    """A transaction that holds the database's migration lock from its start."""
    late = (
        f"another process held the {service} schema's migration lock for more than {LOCK_WAIT_SECONDS:g} s: "
        "a migration still running, or a process stuck while holding it; try again once it is done"
    )
    if isinstance(db, SqliteDatabase):
        # BEGIN IMMEDIATE takes the write lock, or waits busy_timeout for it: long
        # enough here for another process's migration to end.
        with _busy_timeout(db, LOCK_WAIT_SECONDS), ExitStack() as transaction:
            try:
                transaction.enter_context(db.atomic("IMMEDIATE"))
            except OperationalError as exc:
                if "locked" in str(exc) or "busy" in str(exc):
                    raise MigrationLockTimeout(late) from exc
                raise
            yield
        return
    with db.atomic():
        if isinstance(db, PostgresqlDatabase):
            # Bounded like SQLite's wait (SET LOCAL: for this transaction only; the
            # steps' own locks wait as long at most).
            db.execute_sql(f"SET LOCAL lock_timeout = '{int(LOCK_WAIT_SECONDS * 1000)}ms'")
            try:
                db.execute_sql("SELECT pg_advisory_xact_lock(%s)", (_lock_key(service),))
            except OperationalError as exc:
                if "lock timeout" in str(exc):  # (55P03: "canceling statement due to lock timeout")
                    raise MigrationLockTimeout(late) from exc
                raise
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
