"""The services on PostgreSQL under the gevent worker: a request waiting on the
server does not hold up the others of its worker (psycopg waits through gevent's
patched `select`), and a database restart costs the requests in flight a clean 503,
not the service.

The wait is made with a lock the test holds, not with a sleep: a request reading the
locked table waits in PostgreSQL for exactly as long as the test wants.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from app.common.db import POSTGRES_POOL_SIZE
from devtools.waiting import wait_for
from tests.support.metrics import scrape
from tests.support.wizard import TEST_IDENTITY, WizardClient


@pytest.fixture
def wizard_on_postgres(start_service, postgres_server):
    """A one-worker wizard on a new PostgreSQL database, with a blueprint made."""
    url = postgres_server.new_database()
    service = start_service("wizard", env={**TEST_IDENTITY, "DATABASE_URL": url})
    client = WizardClient(service.base_url, "owner")
    client.post("/api/collections/blueprints", json={"title": "one", "is_public": True}).raise_for_status()
    return client, url


def waiting_on_a_lock(url):
    """How many server processes of that database wait on a lock now."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()[0]


def test_a_request_waiting_on_the_database_does_not_hold_up_its_worker(wizard_on_postgres):
    client, url = wizard_on_postgres
    with ThreadPoolExecutor(1) as pool, psycopg.connect(url) as holder:
        holder.execute("LOCK TABLE prompt_history IN ACCESS EXCLUSIVE MODE")
        blocked = pool.submit(client.get, "/api/collections/prompt_history")
        wait_for(lambda: waiting_on_a_lock(url) == 1, "the request to wait on the table lock")
        # The same (only) worker answers other requests, database reads included, meanwhile.
        for _ in range(5):
            assert client.get("/api/collections/blueprints").status_code == 200
            assert client.get("/healthz").status_code == 200
        assert not blocked.done()
        holder.commit()  # releases the lock
        assert blocked.result(timeout=30).status_code == 200


def test_requests_past_the_pool_s_size_wait_for_a_connection_then_are_served(wizard_on_postgres):
    """More requests at once than the worker's pool holds connections, each holding its
    connection while it waits on the test's lock: those past the pool's size wait for a
    connection (counted as they start to wait), never fail, while the worker answers
    others; once the lock goes, every one is served."""
    client, url = wizard_on_postgres
    extra = 4
    count = POSTGRES_POOL_SIZE + extra
    with ThreadPoolExecutor(count) as pool, psycopg.connect(url) as holder:
        holder.execute("LOCK TABLE prompt_history IN ACCESS EXCLUSIVE MODE")
        clients = [client.as_user(f"reader{i}") for i in range(count)]  # a requests session each
        blocked = [pool.submit(reader.get, "/api/collections/prompt_history") for reader in clients]
        wait_for(lambda: waiting_on_a_lock(url) == POSTGRES_POOL_SIZE, "the pool's connections to wait on the lock")
        # /metrics takes no connection: the worker answers it while its pool is empty.
        wait_for(lambda: scrape(client).value("bundle_db_pool_waits_total") == extra, "checkouts waiting on the pool")
        assert scrape(client).value("bundle_db_pool_connections_in_use") == POSTGRES_POOL_SIZE
        assert not any(request.done() for request in blocked)
        holder.commit()  # releases the lock
        assert [request.result(timeout=30).status_code for request in blocked] == [200] * count
    assert scrape(client).value("bundle_db_pool_connections_in_use") == 0


def test_a_database_restart_fails_requests_in_flight_cleanly_then_heals(wizard_on_postgres, postgres_server):
    client, url = wizard_on_postgres
    with ThreadPoolExecutor(1) as pool:
        holder = psycopg.connect(url)
        holder.execute("LOCK TABLE prompt_history IN ACCESS EXCLUSIVE MODE")
        in_flight = pool.submit(client.get, "/api/collections/prompt_history")
        wait_for(lambda: waiting_on_a_lock(url) == 1, "the request to wait on the table lock")
        # An immediate stop cuts every connection at once and releases no lock on the way
        # (a fast stop ends the holder first, and the request could get the lock and
        # finish before its own end reached it).
        # The test server commits asynchronously (synchronous_commit=off, for speed): a
        # checkpoint first puts the writes made so far on disk, as a real server's are.
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("CHECKPOINT")
        postgres_server.stop("immediate")
        postgres_server.start()
        holder.close()
        cut = in_flight.result(timeout=30)
    assert cut.status_code == 503
    assert cut.json()["error"] == "the database is unavailable; try again shortly"
    assert cut.headers["Retry-After"]
    # The service was not restarted: the next requests reconnect (the pool drops the
    # connections the restart cut) and succeed, writes included.
    for _ in range(3):
        assert client.get("/api/collections/blueprints").status_code == 200
    assert client.post("/api/collections/blueprints", json={"title": "two"}).status_code == 201
    assert [row["title"] for row in client.get("/api/collections/blueprints").json()][:2] == ["two", "one"]


def test_a_database_url_of_another_engine_stops_the_start_with_one_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import wsgi"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "SERVICE": "wizard",
            "DATA_DIR": str(tmp_path),
            "DATABASE_URL": "mysql://bundle:s3cret@db.example/wizard",
        },
    )
    assert done.returncode == 3
    assert done.stderr == "error: DATABASE_URL must be sqlite:///<path> or postgresql://..., got mysql:...\n"


def test_a_transaction_left_open_by_a_lost_process_is_ended_by_the_server(postgres_server):
    """A host cut off mid-write leaves its transaction open, write_transaction's advisory
    lock held: the server ends such a session after IDLE_IN_TRANSACTION_SECONDS, so the
    other hosts' writers wait that long, not until TCP notices (tests/ops/test_two_hosts.py
    cuts a host under writes)."""
    from app.common.db import IDLE_IN_TRANSACTION_SECONDS, open_for_command
    from app.wizard.migrations import HISTORY

    database = open_for_command(postgres_server.new_database(), HISTORY)
    try:
        [(setting,)] = database.execute_sql("SHOW idle_in_transaction_session_timeout").fetchall()
    finally:
        database.close()
    assert setting == f"{IDLE_IN_TRANSACTION_SECONDS}s"
