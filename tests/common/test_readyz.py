"""`/readyz` on a running gunicorn: it follows the database (a PostgreSQL this test
starts and stops), and a worker told to stop answers 503
`stopping` to a request that arrives on a connection it kept alive. The checks one by
one, in process: tests/unit/common/test_readiness.py."""

import http.client
import json
import signal

import pytest
import requests

from devtools.pg_server import PostgresServer
from tests.support.decks import StreamReader


@pytest.fixture
def own_postgres():
    """A PostgreSQL of this test alone: it is stopped and started again."""
    with PostgresServer() as server:
        yield server


def test_readiness_follows_the_database(start_service, own_postgres):
    service = start_service("wizard", env={"DATABASE_URL": own_postgres.new_database()})
    ready = requests.get(service.base_url + "/readyz", timeout=10)
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"stopping": "ok", "data": "ok", "database": "ok"}}

    own_postgres.stop()
    down = requests.get(service.base_url + "/readyz", timeout=10)
    assert down.status_code == 503
    assert down.headers["Retry-After"] and down.headers["Cache-Control"] == "no-store"
    body = down.json()
    assert body["status"] == "unavailable" and body["failing"] == "database"
    assert body["checks"]["database"].startswith("does not answer: ")
    assert {k: v for k, v in body["checks"].items() if k != "database"} == {"stopping": "ok", "data": "ok"}

    own_postgres.start()
    # The pool drops the connections the stop cut (each checkout pings): the next answer is green.
    assert requests.get(service.base_url + "/readyz", timeout=10).json()["status"] == "ready"


def _get(connection, path):
    connection.request("GET", path)
    response = connection.getresponse()
    return response, json.loads(response.read())


def test_a_stopping_worker_answers_503_on_a_kept_alive_connection(deck_session):
    service, session = deck_session
    # The SIGTERM handler marks the worker stopping, then ends its streams: a stream's
    # end tells this test that the mark is set.
    stream = StreamReader(f"{service.base_url}/api/sessions/{session['id']}/stream")
    stream.start()
    stream.wait_open()
    kept = http.client.HTTPConnection("127.0.0.1", service.port, timeout=10)
    try:
        first, body = _get(kept, "/readyz")
        assert first.status == 200 and body["status"] == "ready" and not first.will_close

        service.process.send_signal(signal.SIGTERM)  # the arbiter passes it to its worker (systemctl stop)
        stream.join(10)
        assert not stream.is_alive() and stream.comment_lines[-1] == "closed: server is stopping"

        draining, body = _get(kept, "/readyz")  # the same connection, still served while the worker drains
        assert draining.status == 503
        assert body == {
            "status": "unavailable",
            "failing": "stopping",
            "checks": {"stopping": "the worker is stopping (SIGTERM)", "data": "ok"},
        }
        assert draining.will_close  # and then the worker closes it
    finally:
        kept.close()
    assert service.process.wait(20) == 0
