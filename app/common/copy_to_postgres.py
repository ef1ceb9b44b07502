"""Moving an install to PostgreSQL: `python -m app.<service> copy-to-postgres <URL>`
copies the service's SQLite database (its DATA_DIR / DATABASE_URL, migrated to
this code's schema first) into an empty PostgreSQL database, then prints each
table's row count on both sides. It refuses a database that already has tables, and
fails (exit 1) when any count differs. Stop the service while it runs: writes made
during the copy would not be copied.

The target's schema is made by the same migration history as a service start, so it
is exactly what the service would have created; rows go through the models (each
value read by its field and written by it again), then the serial columns'
sequences move past the copied ids.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Sequence
from typing import Any, TextIO

# sort_models is peewee's (create_tables uses it); its stubs do not list it.
from peewee import AutoField, Database, Model, sort_models  # type: ignore[attr-defined]
from playhouse.db_url import connect
from playhouse.postgres_ext import Psycopg3Database

from app.common import database_url, live_processes
from app.common.migrations import EXPANSIONS_TABLE, HISTORY_TABLE, History, bring_up_to_date

BATCH = 500


class CopyRefused(Exception):
    pass


def copy_database(
    history: History, source_url: str, target_url: str, out: TextIO = sys.stdout, derived: Collection[type[Model]] = ()
) -> list[tuple[str, int, int]]:
    """Copy every table of `history`'s models but the `derived` ones (an index that
    differs by engine, rebuilt by the caller); returns [(table, source rows, target rows)]."""
    if not database_url.is_postgres(target_url):
        raise CopyRefused("the target must be a postgresql:// URL")
    if not source_url.startswith("sqlite:///"):
        raise CopyRefused(f"the source must be the service's SQLite database, got {source_url.split(':', 1)[0]}:...")
    source: Database = connect(source_url, pragmas={"foreign_keys": 1, "busy_timeout": 10000})
    name = live_processes.application_name(history.service)
    target: Database = Psycopg3Database(
        database_url.postgres_params(target_url)["dbname"],
        conninfo=database_url.postgres_conninfo(target_url, application_name=name),
    )
    try:
        with source.bind_ctx(history.models):
            bring_up_to_date(source, history)
        _refuse_unless_empty(target)
        with target.bind_ctx(history.models):
            bring_up_to_date(target, history)
        models: list[type[Model]] = [m for m in sort_models(history.models) if m not in derived]
        with target.atomic():
            _empty_seeded_tables(target, models)
            for model in models:
                copied = _copy_table(model, source, target)
                out.write(f"copied {copied} rows of {model._meta.table_name}\n")
            _advance_sequences(target, models)
        return [(m._meta.table_name, _count(source, m), _count(target, m)) for m in models]
    finally:
        source.close()
        target.close()


def _refuse_unless_empty(target: Database) -> None:
    with target.connection_context():
        tables = [t for t in target.get_tables() if t not in (HISTORY_TABLE, EXPANSIONS_TABLE, live_processes.TABLE)]
    if tables:
        raise CopyRefused(
            f"the target database is not empty (it has {len(tables)} tables, such as "
            f"{', '.join(sorted(tables)[:3])}): give an empty database"
        )


def _empty_seeded_tables(target: Database, models: Sequence[type[Model]]) -> None:
    """Rows a new database starts with (a default organization, counters) come from
    the source instead."""
    for model in reversed(models):
        with target.bind_ctx([model]):
            model.delete().execute()


def _copy_table(model: type[Model], source: Database, target: Database) -> int:
    fields = model._meta.sorted_fields
    copied = 0
    batch: list[tuple[Any, ...]] = []
    with source.bind_ctx([model]), source.connection_context():
        rows = model.select(*fields).tuples().iterator()
        for row in rows:
            batch.append(row)
            if len(batch) == BATCH:
                copied += _insert(model, fields, batch, target)
                batch = []
    return copied + (_insert(model, fields, batch, target) if batch else 0)


def _insert(model: type[Model], fields: Sequence[Any], rows: Sequence[tuple[Any, ...]], target: Database) -> int:
    with target.bind_ctx([model]):
        model.insert_many(rows, fields=fields).execute()
    return len(rows)


def _advance_sequences(target: Database, models: Sequence[type[Model]]) -> None:
    for model in models:
        key = model._meta.primary_key
        if isinstance(key, AutoField):
            table, column = model._meta.table_name, key.column_name
            target.execute_sql(
                f"SELECT setval(pg_get_serial_sequence('\"{table}\"', '{column}'), "
                f'COALESCE(MAX("{column}"), 1), MAX("{column}") IS NOT NULL) FROM "{table}"'
            )


def _count(database: Database, model: type[Model]) -> int:
    with database.bind_ctx([model]), database.connection_context():
        count: int = model.select().count()
        return count


def report(counts: Sequence[tuple[str, int, int]], out: TextIO) -> bool:
    """The table of counts; True when every table matches."""
    width = max(len(name) for name, _, _ in counts)
    out.write(f"{'table':<{width}}  {'sqlite':>8}  {'postgresql':>10}\n")
    for name, source_rows, target_rows in counts:
        mark = "" if source_rows == target_rows else "  MISMATCH"
        out.write(f"{name:<{width}}  {source_rows:>8}  {target_rows:>10}{mark}\n")
    return all(s == t for _, s, t in counts)


def run(
    history: History,
    source_url: str,
    target_url: str,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    derived: Collection[type[Model]] = (),
    rebuild: Callable[[], str] | None = None,
) -> int:
    """The command's body: exit code 0 when copied and counted equal. `rebuild()` then
    makes the `derived` tables on the target."""
    try:
        counts = copy_database(history, source_url, target_url, out, derived)
    except CopyRefused as exc:
        err.write(f"error: {exc}\n")
        return 2
    if not report(counts, out):
        err.write("error: the row counts differ\n")
        return 1
    if rebuild is not None:
        out.write(rebuild() + "\n")
    return 0
