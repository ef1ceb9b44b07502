"""Which processes run on a service's database, and of which release: what a contract
step (app.common.migrations) asks before it drops what older code reads.

Each long-running process of this release (a web worker, a job worker) registers
itself in the table `live_processes` of its service's database, beside
`schema_migrations`: host name, pid, role, release (the VERSION file), started_at and
seen_at. It refreshes seen_at every REFRESH_SECONDS (a thread: a greenlet in a gevent
web worker, whose threading is patched) and removes its row when it stops gracefully;
a process is live while its row was seen within LIVE_SECONDS (a killed one stops
counting after that). The times are the database server's clock on PostgreSQL, so
that the hosts' clocks need not agree; on SQLite (one host) the host's.

Releases before 0.3.0 do not register. On PostgreSQL each connection of this release
names itself (application_name `bundle <service> <release> <host>`): a client of the
service's database, under its user, with an empty application_name is counted as a
process of an earlier release, named by its client address, and one named by another
release as a process of that release. On SQLite (one host) a process of this host
that holds the database file open and is not a registered process of this release
is counted too (`unregistered_holders`: /proc, the processes this user may read).
"""

import atexit
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from peewee import Database, PostgresqlDatabase

from app.common.config import RELEASE as RELEASE  # re-exported: the registry rows and contract name it
from app.common.timeutil import utc_timestamp

log = logging.getLogger("bundle.live_processes")

TABLE = "live_processes"
REFRESH_SECONDS = 20.0
LIVE_SECONDS = 60.0
# Rows of processes that died without removing them are deleted after this long.
FORGET_SECONDS = 24 * 3600.0
HOST = socket.gethostname()
# This process's registrations not stopped yet.
_registered: list["Registration"] = []


def application_name(service: str) -> str:
    """The name each PostgreSQL connection of this release gives itself (63 bytes at most)."""
    return f"bundle {service} {RELEASE} {HOST}"[:63]


def create_table(db: Database) -> None:
    db.execute_sql(
        f"CREATE TABLE IF NOT EXISTS {TABLE} (id VARCHAR(64) PRIMARY KEY, host VARCHAR(255) NOT NULL, "
        "pid INTEGER NOT NULL, role VARCHAR(40) NOT NULL, release VARCHAR(40) NOT NULL, "
        "started_at VARCHAR(40) NOT NULL, seen_at DOUBLE PRECISION NOT NULL)"
    )


def _now_sql(db: Database) -> str:
    """Seconds since the epoch by the database's clock (PostgreSQL) or this host's."""
    if isinstance(db, PostgresqlDatabase):
        return "EXTRACT(EPOCH FROM clock_timestamp())"
    return repr(time.time())


@contextmanager
def _connection(db: Database) -> Iterator[None]:
    """The caller's open connection, or one for the block (closed after it)."""
    if not db.is_closed():
        yield
        return
    with db.connection_context():
        yield


def _sql(db: Database, sql: str) -> str:
    return sql.replace("?", db.param)


class Registration:
    """One process's row: `start()` writes it and keeps it fresh, `stop()` removes it."""

    def __init__(self, db: Database, role: str) -> None:
        self.db, self.role = db, role
        self.id = uuid.uuid4().hex
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Registration":
        with _connection(self.db):
            self.db.execute_sql(
                _sql(
                    self.db,
                    f"DELETE FROM {TABLE} WHERE seen_at < {_now_sql(self.db)} - ?",
                ),
                (FORGET_SECONDS,),
            )
            self._insert()
        self._thread = threading.Thread(target=self._refresh, name="live-process", daemon=True)
        self._thread.start()
        atexit.register(self.stop)
        _registered.append(self)
        return self

    def _insert(self) -> None:
        self.db.execute_sql(
            _sql(
                self.db,
                f"INSERT INTO {TABLE} (id, host, pid, role, release, started_at, seen_at) "
                f"VALUES (?, ?, ?, ?, ?, ?, {_now_sql(self.db)})",
            ),
            (self.id, HOST, os.getpid(), self.role, RELEASE, utc_timestamp()),
        )

    def refresh(self) -> None:
        """One beat: seen_at now; the row written again if it is gone (deleted as
        forgotten after the database was away, a restore)."""
        with _connection(self.db):
            cursor = self.db.execute_sql(
                _sql(self.db, f"UPDATE {TABLE} SET seen_at = {_now_sql(self.db)} WHERE id = ?"), (self.id,)
            )
            if cursor.rowcount == 0 and not self._stopped.is_set():
                self._insert()

    def _refresh(self) -> None:
        while not self._stopped.wait(REFRESH_SECONDS):
            try:
                self.refresh()
            except Exception as exc:  # the database away a while: the next beat tries again
                log.warning("could not refresh this process's live row: %s", exc)

    def stop(self) -> None:
        """Remove the row (a graceful stop); again is a no-op."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self in _registered:
            _registered.remove(self)
        try:
            with _connection(self.db):
                self.db.execute_sql(_sql(self.db, f"DELETE FROM {TABLE} WHERE id = ?"), (self.id,))
        except Exception as exc:  # it stops counting as live after LIVE_SECONDS anyway
            log.warning("could not remove this process's live row: %s", exc)


def register(db: Database, role: str) -> Registration:
    """Register this process (role: "web worker", "job worker") in `db` until it stops."""
    return Registration(db, role).start()


def unregister_all() -> None:
    """Remove this process's rows now: for a process that ends without its exit
    handlers (os._exit), such as the reload's preflight, which builds the app as a
    worker does and registers as one."""
    for registration in list(_registered):
        registration.stop()


def others_live(db: Database, release: str = RELEASE, service: str | None = None) -> list[str]:
    """The live processes of other releases than `release`, each described in a few
    words naming its host (and release); the caller holds a connection. On
    PostgreSQL, `service`'s connections named by another release count too."""
    rows = db.execute_sql(
        _sql(
            db,
            f"SELECT host, release, role, pid FROM {TABLE} WHERE release <> ? AND seen_at >= {_now_sql(db)} - ? "
            "ORDER BY host, pid",
        ),
        (release, LIVE_SECONDS),
    ).fetchall()
    found = [f"a {role} of release {other} on host {host} (pid {pid})" for host, other, role, pid in rows]
    if isinstance(db, PostgresqlDatabase):
        unnamed = db.execute_sql(
            "SELECT DISTINCT COALESCE(host(client_addr), 'the local socket') FROM pg_stat_activity "
            "WHERE datname = current_database() AND usename = current_user AND backend_type = 'client backend' "
            "AND application_name = '' AND pid <> pg_backend_pid() ORDER BY 1"
        ).fetchall()
        found += [f"a process of an earlier release connected from host {address}" for (address,) in unnamed]
        if service is not None:
            named = db.execute_sql(
                "SELECT DISTINCT application_name, COALESCE(host(client_addr), 'the local socket') "
                "FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' "
                "AND application_name LIKE %s AND pid <> pg_backend_pid() ORDER BY 1, 2",
                (f"bundle {service} %",),
            ).fetchall()
            for name, address in named:
                parts = name.split(" ", 3)  # bundle, service, release, host (maybe cut at 63 bytes)
                if len(parts) >= 3 and parts[2] != release:
                    host = parts[3] if len(parts) > 3 else "?"
                    found.append(f"a process of release {parts[2]} on host {host} (connected from {address})")
    return found


def unregistered_holders(db: Database, release: str = RELEASE) -> list[str]:
    """SQLite: the processes of this host, other than this one, that hold the database
    file open and are not live registered processes of `release` (a release that
    does not register, a process of another release), one line naming the host and
    pids; [] when there is none. Only the processes this user may read are seen (the
    service's commands run as its user, as its processes do)."""
    target = os.path.realpath(db.database)
    registered = (
        {
            pid
            for (pid,) in db.execute_sql(
                _sql(db, f"SELECT pid FROM {TABLE} WHERE host = ? AND release = ? AND seen_at >= {_now_sql(db)} - ?"),
                (HOST, release, LIVE_SECONDS),
            )
        }
        if db.table_exists(TABLE)
        else set()
    )
    holders = sorted(pid for pid in _holders(target) if pid != os.getpid() and pid not in registered)
    if not holders:
        return []
    return [
        f"a process not registered as one of release {release} on host {HOST} holding {target} open "
        f"(pid {', '.join(map(str, holders))})"
    ]


def _holders(path: str) -> set[int]:
    """The pids of this host's processes (those this user may read) that hold `path` open."""
    found: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) == path:
                    found.add(int(proc.name))
                    break
        except OSError:  # not ours to read, or gone meanwhile
            continue
    return found
