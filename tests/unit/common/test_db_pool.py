"""A pooled database whose connections are all in use (app.common.db._MeasuredPool):
a checkout waits for one to come back, up to its bound, then fails; in a request that
failure is the 503 of an unavailable database, never a 500. Threads stand in for
greenlets here (peewee keeps a connection per thread; in a gevent worker threading is
patched and the wait is gevent's: tests/wizard/test_stream_burst.py)."""

import threading

import pytest
from peewee import DatabaseProxy
from playhouse.pool import MaxConnectionsExceeded

from app import create_app
from app.common import db, metrics
from devtools.waiting import wait_for


def value(metric, *labels):
    return metric.labels(*labels)._value.get()


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """A web worker's SQLite pool as the services open it, of one connection; its
    connection passes from thread to thread, as a worker's from greenlet to greenlet."""
    proxy = DatabaseProxy()
    database = db._open(f"sqlite:///{tmp_path / 'x.db'}", "test", pool=True)
    monkeypatch.setattr(database, "_max_connections", 1)
    database.connect_params["check_same_thread"] = False
    proxy.initialize(database)
    yield proxy
    database.close_all()


class Holder:
    """A thread that holds one connection of `proxy` until `release()`."""

    def __init__(self, proxy):
        self.proxy, self.holding, self._release = proxy, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold)
        self.thread.start()
        assert self.holding.wait(10)

    def _hold(self):
        self.proxy.connect()
        self.holding.set()
        self._release.wait(30)
        self.proxy.close()

    def release(self):
        self._release.set()
        self.thread.join(10)


def test_a_checkout_waits_for_a_connection_given_back_and_gets_it(pool):
    service = metrics.service()
    waits, wait_count = value(db.POOL_WAITS, service), db.POOL_WAIT_TIME.labels(service)._sum.get()
    holder = Holder(pool)
    got = []

    def checkout():
        pool.connect()
        got.append(pool.execute_sql("SELECT 1").fetchone()[0])
        pool.close()

    waiter = threading.Thread(target=checkout)
    waiter.start()
    try:
        # Counted as it starts to wait.
        wait_for(lambda: value(db.POOL_WAITS, service) == waits + 1, "a checkout waiting on the pool", timeout=10)
        assert got == []  # still waiting: not refused
    finally:
        holder.release()
    waiter.join(10)
    assert got == [1]
    assert value(db.POOL_WAITS, service) == waits + 1
    assert db.POOL_WAIT_TIME.labels(service)._sum.get() > wait_count
    assert value(db.POOL_IN_USE, service) == 0


def test_a_checkout_still_without_a_connection_after_its_bound_fails(pool):
    service = metrics.service()
    waits = value(db.POOL_WAITS, service)
    holder = Holder(pool)
    try:
        with pytest.raises(MaxConnectionsExceeded, match=r"every database connection of the pool \(1\) was in use"):
            pool.obj.connect(wait=0.05)
        assert value(db.POOL_WAITS, service) == waits + 1
        assert pool.is_closed()
    finally:
        holder.release()
    pool.connect()  # the connection given back serves the next checkout at once
    pool.close()
    assert value(db.POOL_WAITS, service) == waits + 1


def test_a_request_that_finds_no_connection_within_the_bound_answers_503(tmp_path, monkeypatch):
    monkeypatch.delenv(metrics.MULTIPROCESS_ENV, raising=False)
    monkeypatch.setenv("DATA_DIR", str(tmp_path))
    monkeypatch.setenv("NOTEBOOK_ALLOW_NO_PASSWORD", "1")
    client = create_app("notebook").test_client()
    from app.notebook.core.models import database

    monkeypatch.setattr(database.obj, "_max_connections", 1)
    monkeypatch.setattr(database.obj, "_wait_timeout", 0.05)  # the bound, shortened for the test
    holder = Holder(database)
    try:
        response = client.get("/health")
        assert response.status_code == 503, response.get_data(as_text=True)
        assert response.headers["Retry-After"] == "2"
        assert "no database connection came free in time" in response.get_data(as_text=True)
    finally:
        holder.release()
    database.obj.close_idle()  # the holder thread's SQLite connection serves no other thread
    assert client.get("/health").status_code == 200


def test_a_connection_that_fails_its_checkout_ping_takes_the_idle_ones_with_it(tmp_path):
    """After a server restart, a failover or a cut-off host every idle connection is
    dead: the first that fails its ping closes the others, rather than each costing a
    checkout its own failed ping (tcp_user_timeout, under the pool's lock)."""
    database = db._open(f"sqlite:///{tmp_path / 'x.db'}", "test", pool=True)
    database.connect_params["check_same_thread"] = False
    proxy = DatabaseProxy()
    proxy.initialize(database)
    holders = [Holder(proxy) for _ in range(3)]  # three threads, three connections at once
    for holder in holders:
        holder.release()
    idle = [conn for _, _, conn in database._connections]
    assert len(idle) == 3
    oldest = min(database._connections)[2]
    oldest.close()  # its server went away: the next checkout's ping fails on it
    database.connect()
    fresh = database.connection()
    assert fresh not in idle
    assert database._connections == []  # the other two were closed, not left to fail later
    for conn in idle:
        with pytest.raises(Exception, match="closed"):
            conn.execute("SELECT 1")
    database.close()
    database.close_all()
