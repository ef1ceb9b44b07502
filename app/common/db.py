"""The relational database of a service (peewee): one URL, one connection per request.

    database = DatabaseProxy()           # in the service's models module
    db = connect_database(database, url, HISTORY)   # HISTORY: the service's migrations.py
    bind_to_requests(app, database)

`sqlite:///path` opens a pooled SQLite database in WAL mode (the embedded default);
`postgresql://user:password@host:port/name` (or libpq's multi-host form,
app.common.database_url) a pooled PostgreSQL database through psycopg 3, which
yields to other greenlets while it waits on the server (gevent patches `select`,
which psycopg uses from 3.1.14 on). Each PostgreSQL connection names itself
(`application_name`, app.common.live_processes), and each web worker registers
itself as a live process of its release (bind_to_requests).

A pool with every connection in use makes a checkout wait for one to come back, up
to POOL_WAIT_SECONDS (either engine), then answer 503 (app.common.errors): a burst
of requests (a reconnect storm after a restart) is slowed, never failed. Routes
that stream (SSE, websockets) take no connection of their own (bind_to_requests'
`no_connection`, or `proxy.close()` before the long part) and one for each block
that reads or writes (connection_for_block).
"""

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager, nullcontext
from typing import Any, Protocol

from peewee import Database, DatabaseProxy, InterfaceError, OperationalError, SqliteDatabase, TextField
from playhouse.db_url import connect
from playhouse.pool import MaxConnectionsExceeded, PooledDatabase
from playhouse.postgres_ext import PooledPsycopg3Database
from prometheus_client import Counter, Gauge, Histogram

from app.common import database_url, live_processes, metrics
from app.common.config import ConfigError
from app.common.failures import Unavailable
from app.common.migrations import LOCK_WAIT_SECONDS, History, bring_up_to_date

# A web worker's greenlets share its pool; past this many connections in use a request
# waits up to POOL_WAIT_SECONDS for one to come back (then 503), on either engine.
POSTGRES_POOL_SIZE = 32
SQLITE_POOL_SIZE = 64
POOL_WAIT_SECONDS = 10
# A waiting checkout looks at the pool again at least this often: a connection given
# back between its failed try and its wait wakes no one (threads; in a gevent worker no
# switch happens in between).
POOL_RECHECK_SECONDS = 1.0
# A transaction of ours never waits on anything but the database between its
# statements: one left open this long belongs to a process that is gone or cut off
# (a host lost mid-write: no FIN, no RST). PostgreSQL ends its session then, and frees
# its locks, write_transaction's advisory lock included, on which every other writer
# of the service would otherwise wait until TCP noticed the loss (hours).
IDLE_IN_TRANSACTION_SECONDS = 20
# Between two tries of the switch to WAL that another process's switch held off.
WAL_RETRY_SECONDS = 0.02
# The endpoints whose requests take no connection of their own (bind_to_requests).
NO_CONNECTION_ENDPOINTS = frozenset({"metrics"})
# How long a `bounded_read` may wait for a pooled connection, a lock, or its statements.
BOUNDED_READ_SECONDS = 2.0


POOL_IN_USE = Gauge(
    "bundle_db_pool_connections_in_use",
    "Database connections checked out of the workers' pools",
    ["service"],
    multiprocess_mode="livesum",
)
POOL_WAITS = Counter(
    "bundle_db_pool_waits_total",
    "Checkouts that found every connection of the pool in use (they waited for one, or timed out into a 503)",
    ["service"],
)
POOL_WAIT_TIME = Histogram(
    "bundle_db_pool_wait_seconds",
    "How long those checkouts waited for a connection (to one, or to the time-out)",
    ["service"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


class _App(Protocol):
    """What bind_to_requests uses of a Flask app (Flask is not imported: job workers
    use this module)."""

    def before_request(self, f: Callable[[], None]) -> object: ...

    def url_value_preprocessor(self, f: Callable[[str | None, dict[str, Any] | None], None]) -> object: ...

    def teardown_request(self, f: Callable[[BaseException | None], None]) -> object: ...


def connect_database(proxy: DatabaseProxy, url: str, history: History, pool: bool = True) -> Database:
    """Connect `proxy` to `url` and bring its schema up to date with `history`
    (app.common.migrations: the pending expand steps). `pool`: pooled SQLite
    connections, for a web worker (a job worker's threads keep one connection each)."""
    db = _open(url, history.service, pool)
    proxy.initialize(db)
    bring_up_to_date(db, history)
    return db


def open_for_command(url: str, history: History) -> Database:
    """The database at `url`, as a command that migrates it itself opens it (one
    connection, not migrated here): `contract`."""
    return _open(url, history.service, pool=False)


def _open(url: str, service: str, pool: bool) -> Database:
    db: Database
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        switch_to_wal(path)
        # Pooled: each request runs in a greenlet of its own, and opening a connection
        # (with its pragmas) per request would cost more than the request's queries.
        pragmas = {"foreign_keys": 1, "busy_timeout": 10000, "synchronous": "normal"}
        if pool:
            db = _measured(
                connect(
                    "sqlite+pool://" + url[len("sqlite://") :],
                    max_connections=SQLITE_POOL_SIZE,
                    stale_timeout=300,
                    timeout=POOL_WAIT_SECONDS,  # the pool's own wait; SQLite's is busy_timeout
                    pragmas=pragmas,
                )
            )
        else:
            db = connect(url, pragmas=pragmas)
    elif database_url.is_postgres(url):
        db = _measured(_pooled_postgres(url, service))
    else:
        # The URL may carry a password: only its scheme is shown.
        raise ConfigError(f"DATABASE_URL must be sqlite:///<path> or postgresql://..., got {url.split(':', 1)[0]}:...")
    return db


def _pooled_postgres(url: str, service: str) -> Database:
    """A pool of psycopg connections to `url`, built here rather than by playhouse.db_url,
    which cannot parse several hosts. Each checkout pings the connection (peewee's pool),
    so connections cut by a server restart or a failover are dropped, not handed to a
    request; a new one goes to whichever host accepts writes (target_session_attrs)."""
    params = database_url.postgres_params(url)
    conninfo = database_url.postgres_conninfo(
        url,
        application_name=live_processes.application_name(service),
        options=_with_idle_timeout(params.get("options", "")),
    )
    db: Database = PooledPsycopg3Database(
        params["dbname"],
        conninfo=conninfo,
        max_connections=POSTGRES_POOL_SIZE,
        stale_timeout=300,
        timeout=POOL_WAIT_SECONDS,
    )
    return db


def _with_idle_timeout(options: str) -> str:
    """The URL's own `options` (server settings), with ours after them."""
    ours = f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_SECONDS}s"
    return f"{options} {ours}".strip()


class _MeasuredPool(PooledDatabase):  # type: ignore[misc]  # peewee is untyped
    """Put in front of a peewee pooled database's class (`_measured`): its connections in
    use (`bundle_db_pool_connections_in_use`, this worker's count at each checkout and
    check-in), and checkouts that wait while the pool is exhausted, each bounded on its
    own (`connect(wait=...)`), counted with their wait (`bundle_db_pool_waits_total`,
    `bundle_db_pool_wait_seconds`)."""

    def connect(self, reuse_if_open: bool = False, wait: float | None = None) -> bool:
        """A connection for the calling greenlet (thread); while every one is in use, wait
        for one to be given back, up to `wait` seconds (None: the pool's `timeout`), then
        MaxConnectionsExceeded (a 503 in a request, app.common.errors).

        peewee's own wait, with a bound per call: the wait is on the pool's
        threading.Condition, which in a gevent worker (threading patched before the app,
        hence the pool, is made) is gevent's, so the worker's other greenlets, the one
        that gives a connection back among them, run meanwhile."""
        bound = self._wait_timeout if wait is None else wait
        started = time.monotonic()
        waited = False
        try:
            while True:
                try:
                    # Database.connect: a checkout (_connect) that raises when the pool is exhausted.
                    return bool(super(PooledDatabase, self).connect(reuse_if_open))
                except MaxConnectionsExceeded:
                    if not waited:  # counted as it starts to wait: a scrape counts those waiting now too
                        waited = True
                        metrics.of_service(POOL_WAITS).inc()
                    remaining = started + (bound or 0) - time.monotonic()
                    if remaining <= 0:
                        raise MaxConnectionsExceeded(
                            f"every database connection of the pool ({self._max_connections}) was in use"
                            f" for {bound or 0:g} s"
                        ) from None
                    with self._pool_available:
                        self._pool_available.wait(timeout=min(remaining, POOL_RECHECK_SECONDS))
        finally:
            if waited:
                metrics.of_service(POOL_WAIT_TIME).observe(time.monotonic() - started)

    def _is_closed(self, conn: Any) -> bool:
        """peewee's ping of an idle connection as it is checked out (under the pool's
        lock: every other checkout of the worker waits meanwhile). One that fails takes
        the pool's other idle connections with it: they reached the same server, which
        restarted, failed over or was cut off, and pinging each in turn would cost a
        host that vanished tcp_user_timeout per connection (app.common.database_url)."""
        closed = bool(super()._is_closed(conn))
        if closed:
            self.close_idle()
        return closed

    def _connect(self) -> Any:
        connection = super()._connect()
        metrics.of_service(POOL_IN_USE).set(len(self._in_use))
        return connection

    def _close(self, conn: Any, close_conn: bool = False) -> None:
        super()._close(conn, close_conn)
        metrics.of_service(POOL_IN_USE).set(len(self._in_use))


_MEASURED: dict[type, type] = {}


def _measured(db: Database) -> Database:
    """`db`, a pooled database of playhouse.db_url, made a `_MeasuredPool` of its class."""
    cls = type(db)
    if cls not in _MEASURED:
        _MEASURED[cls] = type(f"Measured{cls.__name__}", (_MeasuredPool, cls), {})
    db.__class__ = _MEASURED[cls]
    return db


def switch_to_wal(path: str) -> None:
    """Put the SQLite file at `path` in WAL mode, which the file keeps: once per process
    start, before any other connection. The switch needs the file to itself, and
    when several processes switch a new file at once (the workers of a first start)
    SQLite refuses all but one at once, without waiting (two processes that each hold
    a read lock and want the write lock would wait on each other): a refused switch is
    tried again, for as long as a migration may hold the file."""
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    while True:
        with closing(sqlite3.connect(path, timeout=LOCK_WAIT_SECONDS)) as connection:
            try:
                connection.execute("PRAGMA journal_mode = wal")
                return
            except sqlite3.OperationalError as error:
                busy = error.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY  # the extended codes too
                if not busy or time.monotonic() > deadline:
                    raise
        time.sleep(WAL_RETRY_SECONDS)


def bind_to_requests(app: _App, proxy: DatabaseProxy, no_connection: frozenset[str] = frozenset()) -> None:
    """Each request takes a connection (from the pool) and gives it back at its end,
    but for the endpoints of NO_CONNECTION_ENDPOINTS (`/metrics`: a scrape must answer
    while the pool is exhausted or the database down; a collector that reads the
    database takes a connection itself, `bounded_read`) and the service's own
    `no_connection` (view names, whatever their blueprint) that say the same: the
    routes that stream, which take a connection per read (connection_for_block), so
    that a burst of them (a reconnect storm) holds none while it subscribes and none
    while it streams (a streamed body runs after this teardown, with none).
    In a gevent web worker (gunicorn's, patched) the worker also registers itself as a
    live process of its release (app.common.live_processes) until it exits; an app
    made in an unpatched process (a test's client) does not."""
    from gevent import monkey

    if monkey.is_module_patched("threading"):
        live_processes.register(proxy.obj, "web worker")

    # The request's endpoint, as Flask hands it to the URL value preprocessors (which run
    # before every before_request hook): this module imports no Flask.
    endpoint = threading.local()  # greenlet-local in a patched worker

    @app.url_value_preprocessor
    def note_endpoint(name: str | None, values: dict[str, Any] | None) -> None:
        endpoint.name = name

    skipped = NO_CONNECTION_ENDPOINTS | no_connection

    @app.before_request
    def connect_for_request() -> None:
        name = getattr(endpoint, "name", None) or ""
        if name.rsplit(".", 1)[-1] not in skipped:
            proxy.connect(reuse_if_open=True)

    @app.teardown_request
    def release_after_request(exc: BaseException | None) -> None:
        if not proxy.is_closed():
            proxy.close()


@contextmanager
def connection_for_block(proxy: DatabaseProxy) -> Iterator[None]:
    """The caller's open connection (a request's), or, outside any request (a
    greenlet of its own, a job worker's thread), one taken for the block and given
    back after it. Never in a web worker's threadpool (app.common.offload.blocking)."""
    if not proxy.is_closed():
        yield
        return
    with proxy.connection_context():
        yield


@contextmanager
def bounded_read(proxy: DatabaseProxy, seconds: float = BOUNDED_READ_SECONDS) -> Iterator[None]:
    """A read that gives up after about `seconds` (TimeoutError, or the database's
    error) rather than waiting on the database: for a scrape's collector, which must
    answer within Prometheus' scrape time-out. A connection of its own, taken from the
    pool (waiting for one `seconds` at most) and given back after the block, or the
    caller's if one is open; in a transaction of its own whose statements and locks
    wait `seconds` at most (PostgreSQL's statement_timeout and lock_timeout, SQLite's
    busy_timeout, put back after). Refused inside a transaction of the caller's, which
    those settings would outlast.

    The whole of it (the checkout, its ping, the statements, the commit) runs under a
    gevent time-out too: a database host that stops answering (powered off, cut off)
    enforces no statement_timeout, and TCP would wait minutes. A connection that timed
    out is mid-command: it is closed, never given back to the pool (nor left to the
    caller, whose next query opens a new one)."""
    import gevent

    if proxy.in_transaction():
        raise RuntimeError("bounded_read runs in a transaction of its own, not inside the caller's")
    opened = proxy.is_closed()  # else the caller's connection, left open after
    milliseconds = int(seconds * 1000)
    timer = gevent.Timeout(seconds)  # a BaseException: no driver's `except Exception` takes it
    timer.start()
    try:
        if opened:
            _checkout(proxy, seconds)
        with _busy_timeout(proxy.obj, milliseconds) if isinstance(proxy.obj, SqliteDatabase) else nullcontext():
            proxy.begin()
            try:
                if not isinstance(proxy.obj, SqliteDatabase):
                    proxy.execute_sql(f"SET LOCAL statement_timeout = {milliseconds}")
                    proxy.execute_sql(f"SET LOCAL lock_timeout = {milliseconds}")
                yield
            except BaseException:
                if timer.pending:  # else the connection is mid-command: discarded below
                    proxy.rollback()
                raise
            proxy.commit()
        if opened:
            proxy.close()
    except BaseException as exc:
        expired = not timer.pending
        timer.close()
        if expired:
            _discard(proxy)
            raise TimeoutError(f"no free connection or no answer from the database within {seconds:g} s") from (
                None if exc is timer else exc
            )
        if opened and not proxy.is_closed():
            proxy.close()
        raise
    finally:
        timer.close()


def _checkout(proxy: DatabaseProxy, seconds: float) -> None:
    """A connection from `proxy`'s pool waiting `seconds` at most for one (the gevent
    time-out bounds that wait too, but only in a patched process)."""
    if isinstance(proxy.obj, _MeasuredPool):
        proxy.obj.connect(wait=seconds)
    else:
        proxy.connect()


def _discard(proxy: DatabaseProxy) -> None:
    """Close the connection open on `proxy` without giving it back to its pool."""
    if proxy.is_closed():
        return
    if isinstance(proxy.obj, PooledDatabase):
        proxy.obj.manual_close()
    else:
        proxy.close()


@contextmanager
def _busy_timeout(db: Database, milliseconds: int) -> Iterator[None]:
    before = db.execute_sql("PRAGMA busy_timeout").fetchone()[0]
    db.execute_sql(f"PRAGMA busy_timeout = {milliseconds}")
    try:
        yield
    finally:
        db.execute_sql(f"PRAGMA busy_timeout = {int(before)}")


def run_sql(proxy: DatabaseProxy, sql: str, params: Sequence[Any] = ()) -> Any:
    """`proxy.execute_sql` for hand-written SQL with `?` placeholders, on either
    engine (psycopg's are `%s`). Keep literal `%` and `?` out of such SQL."""
    if not isinstance(proxy.obj, SqliteDatabase):
        sql = sql.replace("?", "%s")
    return proxy.execute_sql(sql, params)


class BuiltOnce:
    """SQL that peewee builds once and a hot path runs on every request: building a
    query costs many times more than running it. `run(proxy, params)` runs it on the
    proxy's database. Kept per engine, whose placeholders and quoting differ, so a
    process that opens a database of the other engine (the tests' in-process apps)
    builds it again."""

    def __init__(self, build: Callable[[], Any]) -> None:
        self.build = build  # () -> a peewee query whose parameters are the placeholders
        self._by_engine: dict[type, str] = {}

    def run(self, proxy: DatabaseProxy, params: Sequence[Any]) -> Any:
        engine = type(proxy.obj)
        sql = self._by_engine.get(engine)
        if sql is None:
            sql = self._by_engine[engine] = self.build().sql()[0]
        return proxy.execute_sql(sql, params)


class JSONField(TextField):
    """JSON as compact text in a TEXT column, the same on both engines (playhouse's JSON
    fields are each tied to one; its SQLite one declares TEXT too, so databases made by
    earlier releases keep their schema)."""

    def db_value(self, value: Any) -> str | None:
        return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)

    def python_value(self, value: str | None) -> Any:
        return None if value is None else json.loads(value)


# The errors that answer 503 (unavailable_error): the database went away, or the pool
# stayed exhausted for all of POOL_WAIT_SECONDS.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError, MaxConnectionsExceeded)


def unavailable_error(exc: Exception) -> Unavailable:
    """The 503 that answers a request whose database went away under it (a restart,
    a lost host: the pool drops the broken connection, so later requests reconnect), or
    that found no free connection within POOL_WAIT_SECONDS (more requests at once than
    the pool serves in that time)."""
    if isinstance(exc, MaxConnectionsExceeded):
        message = "the service is busy: no database connection came free in time; try again shortly"
    else:
        message = "the database is unavailable; try again shortly"
    return Unavailable(message, detail=str(exc).strip()[:200], retry_after=2)


# The key of PostgreSQL's transaction-level advisory lock that write_transaction takes
# (one per database: each service has its own).
WRITE_LOCK_KEY = 0x62756E646C65  # "bundle"


@contextmanager
def write_transaction(proxy: DatabaseProxy) -> Iterator[Any]:
    """A transaction that reads and then writes as one writer at a time, whichever
    process runs it: what it read is still true when it writes (a like count recounted
    from the rows, a marker checked before seeding).

    On SQLite it takes the write lock at its start (a deferred one would fail at once
    with "database is locked" when another process wrote in between; an immediate one
    waits its turn, busy_timeout). On PostgreSQL, whose READ COMMITTED would let two
    such transactions interleave, an advisory lock held until commit does the same."""
    if isinstance(proxy.obj, SqliteDatabase):
        with proxy.atomic("IMMEDIATE") as transaction:
            yield transaction
        return
    with proxy.atomic() as transaction:
        proxy.execute_sql("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
        yield transaction
