"""`/readyz` on every service (app.common.readiness), in process: the checks each
service runs, a schema behind the code (expand steps) against one that only lacks a
contract step or is newer, a database and a Redis that are not there, a DATA_DIR that
cannot hold files. SIGTERM (`stopping`) and a database stopped under a running
service are in tests/common/test_readyz.py, on gunicorn."""

from contextlib import ExitStack
from dataclasses import dataclass

import pytest
from peewee import CharField, DatabaseProxy, Model
from playhouse.db_url import connect

from app import SERVICES
from app.common import readiness
from app.common.db import connect_database
from app.common.migrations import History, Step
from devtools.services import free_port
from tests.support.inprocess import in_process

CHECKS = {
    "decks": ["stopping", "data"],
    "audio": ["stopping", "data"],
    "workspace": ["stopping", "data", "database"],
    "notebook": ["stopping", "data", "database"],
    "wizard": ["stopping", "data", "database"],
}
ENVIRONMENTS = {"notebook": {"NOTEBOOK_PASSWORD": "the notebook's password in this test"}}


@pytest.fixture
def service_app(tmp_path, monkeypatch):
    """service_app(name, data_dir=None) -> the service's Flask app, in this process."""
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    with ExitStack() as stack:

        def build(name, data_dir=None):
            data_dir = data_dir or tmp_path / f"{name}-data"
            return stack.enter_context(in_process(name, data_dir, ENVIRONMENTS.get(name))).app

        yield build


@pytest.mark.parametrize("name", SERVICES)
def test_every_service_answers_ready_with_the_checks_that_apply(service_app, name):
    client = service_app(name).test_client()
    answer = client.get("/readyz")
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json() == {"status": "ready", "checks": dict.fromkeys(CHECKS[name], "ok")}
    assert list(answer.get_json()["checks"]) == CHECKS[name]
    assert answer.headers["Cache-Control"] == "no-store"
    assert "Retry-After" not in answer.headers


def test_the_notebook_answers_readiness_without_its_password_at_both_paths(service_app):
    client = service_app("notebook").test_client()
    assert client.get("/notebooks").status_code == 401
    for path in ("/readyz", "/api/readyz"):
        assert client.get(path).get_json()["status"] == "ready"


def test_audio_keeps_its_spec_routes_beside_readyz(service_app):
    client = service_app("audio").test_client()
    assert client.get("/api/audio/health").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/api/audio/readyz").status_code == 404


def test_a_schema_behind_the_code_is_unavailable_and_one_newer_is_not(service_app):
    from app.wizard.models import database

    client = service_app("wizard").test_client()
    with database.connection_context():
        database.execute_sql("DELETE FROM schema_migrations WHERE version = 1")
    behind = client.get("/readyz")
    assert behind.status_code == 503
    assert behind.headers["Retry-After"] == str(readiness.RETRY_AFTER_SECONDS)
    assert behind.get_json() == {
        "status": "unavailable",
        "failing": "database",
        "checks": {"stopping": "ok", "data": "ok", "database": "the schema is behind the code: step 1 not applied"},
    }
    with database.connection_context():
        database.execute_sql(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (1, 'release 0.1.0', 'x'),"
            " (99, 'a newer release', 'x')"
        )
    assert client.get("/readyz").status_code == 200
    assert client.get("/healthz").status_code == 200


# A step of a newer release's history: `phase` marks it expand or contract.
@dataclass(frozen=True)
class PhasedStep(Step):
    phase: str = "expand"


proxy = DatabaseProxy()


class Thing(Model):
    name = CharField()

    class Meta:
        database = proxy
        table_name = "readiness_thing"


def test_only_expand_steps_are_required(tmp_path):
    history = History(
        "readiness-test",
        [Thing],
        [Step(1, "first"), PhasedStep(2, "add a column"), PhasedStep(3, "drop a column", phase="contract")],
    )
    required = readiness.required_versions(history)
    assert required == {1, 2}
    db = connect_database(proxy, f"sqlite:///{tmp_path / 'things.db'}", history)
    try:
        assert readiness.database_problem(proxy, required) is None
        for table in ("schema_migrations", "schema_expansions"):  # a contract step waits for every host
            db.execute_sql(f"DELETE FROM {table} WHERE version = 3")
        assert readiness.database_problem(proxy, required) is None
        for table in ("schema_migrations", "schema_expansions"):
            db.execute_sql(f"DELETE FROM {table} WHERE version = 2")
        assert readiness.database_problem(proxy, required) == "the schema is behind the code: step 2 not applied"
    finally:
        db.close_all()


def test_a_database_that_is_not_there_does_not_answer():
    absent = DatabaseProxy()
    absent.initialize(connect(f"psycopg3+pool://postgres@127.0.0.1:{free_port()}/nothing", max_connections=2))
    problem = readiness.database_problem(absent, frozenset({1}))
    assert problem is not None and problem.startswith("does not answer: ")
    assert absent.is_closed()


def test_redis_is_checked_where_the_service_uses_it_and_redis_url_is_set(service_app, monkeypatch):
    audio, decks = service_app("audio").test_client(), service_app("decks").test_client()
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    answer = audio.get("/readyz")
    assert answer.status_code == 503
    body = answer.get_json()
    assert body["failing"] == "redis" and body["checks"]["redis"].startswith("does not answer: ")
    assert body["checks"]["stopping"] == body["checks"]["data"] == "ok"
    # The deck service keeps nothing in Redis: a REDIS_URL changes nothing for it.
    assert decks.get("/readyz").get_json() == {"status": "ready", "checks": {"stopping": "ok", "data": "ok"}}


def test_a_data_dir_that_cannot_hold_files_is_unavailable(service_app, tmp_path):
    not_a_folder = tmp_path / "a-file"
    not_a_folder.write_text("")
    answer = service_app("decks", data_dir=not_a_folder).test_client().get("/readyz")
    assert answer.status_code == 503
    assert answer.get_json()["failing"] == "data"
    assert answer.get_json()["checks"]["data"] == "DATA_DIR is not a folder"
    # Not made yet is fine: it is made at the first write.
    later = service_app("decks", data_dir=tmp_path / "made" / "later").test_client().get("/readyz")
    assert later.status_code == 200
    assert readiness.data_problem(str(not_a_folder / "below")) == "the folder DATA_DIR is to be made in is not a folder"
