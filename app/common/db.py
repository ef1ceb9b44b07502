"""The relational database of a service (peewee): one URL, one connection per request.

    database = DatabaseProxy()           # in the service's models module
    db = connect_database(database, url, HISTORY)   # HISTORY: app/<service>/schema.py
    bind_to_requests(app, database)

`sqlite:///path` opens a pooled SQLite database in WAL mode; any other URL
(postgresql://...) goes to playhouse.db_url as it is.
"""
import os

from peewee import SqliteDatabase
from playhouse.db_url import connect

from app.common.migrations import bring_up_to_date


def connect_database(proxy, url, history, pool=True):
    """Connect `proxy` to `url` and bring its schema up to date with `history`
    (app.common.migrations). `pool`: pooled SQLite connections, for a web worker (a
    job worker's threads keep one connection each)."""
    if url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(url[len("sqlite:///"):]) or ".", exist_ok=True)
        # Pooled: each request runs in a greenlet of its own, and opening a connection
        # (with its pragmas) per request would cost more than the request's queries.
        pragmas = {"journal_mode": "wal", "foreign_keys": 1, "busy_timeout": 10000, "synchronous": "normal"}
        if pool:
            db = connect("sqlite+pool://" + url[len("sqlite://"):], max_connections=64, stale_timeout=300,
                         pragmas=pragmas)
        else:
            db = connect(url, pragmas=pragmas)
    else:
        db = connect(url)
    proxy.initialize(db)
    bring_up_to_date(db, history)
    return db


def bind_to_requests(app, proxy):
    """Each request takes a connection (from the pool) and gives it back at its end."""

    @app.before_request
    def connect_for_request():
        proxy.connect(reuse_if_open=True)

    @app.teardown_request
    def release_after_request(exc):
        if not proxy.is_closed():
            proxy.close()


def write_transaction(proxy):
    """A transaction that takes the write lock at its start. On SQLite a deferred one
    that reads and then writes fails at once with "database is locked" when another
    process wrote in between; an immediate one waits its turn (busy_timeout)."""
    if isinstance(proxy.obj, SqliteDatabase):
        return proxy.atomic("IMMEDIATE")
    return proxy.atomic()
