"""The tests' look into a service's database, whichever engine it runs on: what the
service stored (a hash, not a secret; one row, not two) and the rare row a test
changes behind its back (an expiry moved into the past).

    with peek(service) as db:
        db.execute('select count(*) from "user" where email = ?', (email,)).fetchone()

SQL with `?` placeholders runs on both (quote names that PostgreSQL reserves, such
as "user"). Rows are tuples that also answer by column name, like sqlite3.Row.
Timestamps and UUIDs come back as text in the form SQLite keeps them.
"""

import sqlite3
import uuid
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path


class _Row(tuple):
    def __new__(cls, names, values):
        row = super().__new__(cls, values)
        row._names = names
        return row

    def __getitem__(self, key):
        return super().__getitem__(self._names.index(key) if isinstance(key, str) else key)

    def keys(self):
        return list(self._names)


def _as_sqlite_text(value):
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, uuid.UUID):
        return value.hex
    return value


class _PostgresCursor:
    def __init__(self, cursor):
        self._cursor = cursor

    def _row(self, values):
        names = [column.name for column in self._cursor.description]
        return _Row(names, [_as_sqlite_text(v) for v in values])

    def fetchone(self):
        values = self._cursor.fetchone()
        return None if values is None else self._row(values)

    def fetchall(self):
        return [self._row(values) for values in self._cursor.fetchall()]

    def __iter__(self):
        return iter(self.fetchall())


class _PostgresPeek:
    def __init__(self, url):
        import psycopg

        from app.common.database_url import postgres_conninfo

        # The service's own reading of its URL: several hosts reach the one that writes.
        self._connection = psycopg.connect(postgres_conninfo(url), autocommit=True)

    def execute(self, sql, params=()):
        return _PostgresCursor(self._connection.execute(sql.replace("?", "%s"), params))

    def close(self):
        self._connection.close()


class _SqlitePeek:
    def __init__(self, path):
        self._connection = sqlite3.connect(path, timeout=10, isolation_level=None)
        self._connection.row_factory = sqlite3.Row

    def execute(self, sql, params=()):
        return self._connection.execute(sql, params)

    def close(self):
        self._connection.close()


@contextmanager
def peek(service, file_name=None):
    """The database of a RunningService (devtools.services): its DATABASE_URL, else
    the SQLite file `file_name` (default `<service name>.db`) in its DATA_DIR.
    Each statement commits on its own."""
    url = service.env.get("DATABASE_URL", "")
    if url.startswith(("postgresql://", "postgres://")):
        database = _PostgresPeek(url)
    else:
        database = _SqlitePeek(Path(service.data_dir) / (file_name or f"{service.name}.db"))
    try:
        yield database
    finally:
        database.close()
