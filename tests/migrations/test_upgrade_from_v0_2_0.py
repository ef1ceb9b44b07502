"""A rolling upgrade from release 0.2.0 (commit bacec1f), on the wizard, whose schema
has an expand step (2: an index on each collection's key) and a contract step (3: the
like count only on blueprints) since.

Release 0.2.0's own code (a tree of that commit, started by devtools.release_dumps'
Release as production starts it) keeps serving, and starts again, on a database that
the current code expanded; `python -m app.wizard contract` refuses, with one line
naming the host, while a process of another release is live (on PostgreSQL, 0.2.0's
own connections, which carry no application name, and connections named by another
release; on SQLite, 0.2.0's processes holding the file; on both engines, a registered
process of another release), runs once they are gone, and the current code serves on
the contracted schema, which is the one a new database gets, and on which 0.2.0
refuses to start. And a start while a migration holds
the lock waits for it, then serves on the whole schema.
"""

import json
import os
import sqlite3
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from contextlib import closing
from io import BytesIO
from pathlib import Path

import psycopg
import pytest
import requests

from app.common import live_processes
from app.common.migrations import _lock_key
from devtools import services
from devtools.release_dumps import Release
from tests.migrations.test_upgrade_from_v0_1_0 import schema_of
from tests.support.wizard import TEST_IDENTITY, WizardClient

RELEASE_COMMIT = "bacec1f"  # release 0.2.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """Release 0.2.0's tree (`git archive` of its commit: the repository's worktrees
    are left alone), its `.venv` this checkout's; its processes stopped at the end."""
    found = subprocess.run(["git", "cat-file", "-e", f"{RELEASE_COMMIT}^{{commit}}"], cwd=ROOT, capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"release 0.2.0's commit {RELEASE_COMMIT} is not in this clone (a shallow one?)")
    scratch = tmp_path_factory.mktemp("release-0.2.0")
    tree = scratch / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", RELEASE_COMMIT], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    (tree / ".venv").symlink_to(ROOT / ".venv")
    assert (tree / "VERSION").read_text().strip() != live_processes.RELEASE
    old = Release(tree, scratch)
    old.check_code()
    yield old
    old.stop_all()


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request, tmp_path):
    """(DATA_DIR, the environment that points a wizard at a new database of the engine)."""
    data_dir = tmp_path / "wizard-data"
    data_dir.mkdir()
    env = dict(TEST_IDENTITY)
    if request.param == "postgresql":
        env["DATABASE_URL"] = request.getfixturevalue("postgres_server").new_database()
    return data_dir, env


def sql(data_dir, env, statement, params=()):
    """Run one statement on the wizard's database (PostgreSQL: a connection with a name,
    so that it is not taken for a process of an earlier release); its rows."""
    url = env.get("DATABASE_URL")
    if url is None:
        with closing(sqlite3.connect(data_dir / "wizard.db")) as connection, connection:  # closed: not a holder
            return connection.execute(statement, params).fetchall()
    with psycopg.connect(url, autocommit=True, application_name="the test") as connection:
        cursor = connection.execute(statement.replace("?", "%s"), params)
        return cursor.fetchall() if cursor.description else []


def recorded(data_dir, env):
    """The schema history, both tables: [(version, phase)], or [(version, None)] as
    release 0.2.0 keeps it."""
    phase = "phase" if "phase" in columns(data_dir, env, "schema_migrations") else "NULL"
    found = dict(sql(data_dir, env, f"SELECT version, {phase} FROM schema_migrations"))
    if columns(data_dir, env, "schema_expansions"):
        found.update(sql(data_dir, env, "SELECT version, phase FROM schema_expansions"))
    return sorted(found.items())


def seen_by_0_2_0(data_dir, env):
    """The versions of the table release 0.2.0 reads (MAX: its idea of the schema's version)."""
    return [version for (version,) in sql(data_dir, env, "SELECT version FROM schema_migrations ORDER BY version")]


def family(pid):
    """`pid` and its descendants (a gunicorn master and its workers)."""
    found = {pid}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            lines = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if int(lines.get("PPid", "0").strip()) == pid:
            found.add(int(status.parent.name))
    return found


def columns(data_dir, env, table):
    if "DATABASE_URL" not in env:
        return {row[1] for row in sql(data_dir, env, f"PRAGMA table_info({table})")}
    rows = sql(data_dir, env, "SELECT column_name FROM information_schema.columns WHERE table_name = ?", (table,))
    return {name for (name,) in rows}


def contract(data_dir, env, *args):
    """`python -m app.wizard contract ARGS` of the current code on the wizard's database."""
    base = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env = {**base, "DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(
        [sys.executable, "-m", "app.wizard", "contract", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def ok(response):
    assert 200 <= response.status_code < 300, f"{response.url}: {response.status_code} {response.text[:300]}"
    return response.json() if response.content else None


def blueprint_likes(client, blueprint_id):
    return next(row for row in ok(client.get("/api/collections/blueprints")) if row["id"] == blueprint_id)[
        "likes_count"
    ]


def test_release_0_2_0_serves_on_the_expanded_schema_and_contract_waits_for_it(
    release, database, start_service, monkeypatch
):
    data_dir, env = database
    monkeypatch.delenv("DATABASE_URL", raising=False)
    old = release.start_service("wizard", data_dir, env=env)
    assert recorded(data_dir, env) == [(1, None)]  # 0.2.0's history: no phase
    old_alice = WizardClient(old.base_url, "alice")
    first = ok(old_alice.post("/api/collections/blueprints", json={"title": "one", "is_public": True}))
    ok(old_alice.post("/api/collections/saved_prompts", json={"key": "greeting", "text": "hello"}))

    # The current code starts beside it (the other host, upgraded): the expand step only.
    new = start_service("wizard", data_dir=data_dir, env=env)
    assert recorded(data_dir, env) == [(1, None), (2, "expand")]
    assert seen_by_0_2_0(data_dir, env) == [1]  # the expand step is recorded where 0.2.0 does not look
    assert "likes_count" in columns(data_dir, env, "wizards")
    new_alice, new_bob = WizardClient(new.base_url, "alice"), WizardClient(new.base_url, "bob")

    # Both serve, each sees the other's writes.
    ok(new_bob.post("/api/likes/toggle", json={"blueprint_id": first["id"]}))
    assert blueprint_likes(old_alice, first["id"]) == 1
    second = ok(old_alice.post("/api/collections/blueprints", json={"title": "two", "is_public": True}))
    ok(old_alice.post("/api/likes/toggle", json={"blueprint_id": second["id"]}))
    assert blueprint_likes(new_bob, second["id"]) == 1
    by_key = {"filter": json.dumps({"key": "greeting"})}  # the filter the expand step indexed
    assert [r["key"] for r in ok(new_alice.get("/api/collections/saved_prompts", params=by_key))] == ["greeting"]
    ok(old_alice.get("/api/collections/wizards"))

    # A 0.2.0 service STARTS on the expanded schema (a worker replaced, a host restarted, a roll back).
    restarted = release.start_service("wizard", data_dir, env=env)
    assert blueprint_likes(WizardClient(restarted.base_url, "alice"), first["id"]) == 1
    assert release.stop(restarted.process) == 0

    # A registered process of another release (as a later one writes its row): refused, one line.
    sql(
        data_dir,
        env,
        "INSERT INTO live_processes (id, host, pid, role, release, started_at, seen_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (uuid.uuid4().hex, "app2.example", 4242, "web worker", "0.2.5", "2026-01-01T00:00:00Z", time.time()),
    )
    refused = contract(data_dir, env)
    assert refused.returncode == 1, refused
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("error: "), refused.stderr
    assert "release 0.2.5 on host app2.example" in refused.stderr
    sql(data_dir, env, "DELETE FROM live_processes WHERE host = 'app2.example'")

    if "DATABASE_URL" in env:  # 0.2.0 does not register, but its connections are seen
        refused = contract(data_dir, env)
        assert refused.returncode == 1, refused
        assert refused.stderr == (
            "error: the wizard schema was not contracted: a process of an earlier release connected from host "
            "127.0.0.1 is live; upgrade or stop it, then run contract again\n"
        )
    else:  # 0.2.0 does not register, but it holds the SQLite file open
        refused = contract(data_dir, env)
        assert refused.returncode == 1, refused
        assert refused.stderr.count("\n") == 1, refused.stderr
        assert f"a process not registered as one of release {live_processes.RELEASE} on host " in refused.stderr
        assert f"on host {live_processes.HOST} holding" in refused.stderr
        pids = {int(pid) for pid in refused.stderr.split("(pid ")[1].split(")")[0].split(", ")}
        assert pids and pids <= family(old.process.pid), (pids, refused.stderr)
    assert (3, "contract") not in recorded(data_dir, env)
    assert blueprint_likes(old_alice, first["id"]) == 1  # and 0.2.0 still serves

    # 0.2.0 stopped: the contract step runs; the current code serves on the contracted schema.
    assert release.stop(old.process) == 0
    if "DATABASE_URL" in env:  # a connection named by another release (its row gone, say): live too
        with psycopg.connect(env["DATABASE_URL"], application_name="bundle wizard 0.2.5 app3.example"):
            refused = contract(data_dir, env)
        assert refused.returncode == 1, refused
        assert "a process of release 0.2.5 on host app3.example (connected from 127.0.0.1)" in refused.stderr
    dry = contract(data_dir, env, "--dry-run")
    assert (dry.returncode, dry.stdout) == (0, "would run contract step 3: a like count on blueprints only\n"), dry
    assert "likes_count" in columns(data_dir, env, "wizards")
    done = contract(data_dir, env)
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        "ran contract step 3: a like count on blueprints only\n",
        "",
    )
    assert recorded(data_dir, env) == [(1, None), (2, "expand"), (3, "contract")]
    assert seen_by_0_2_0(data_dir, env) == [1, 2, 3]  # with a copy of the expand step below it
    with pytest.raises(RuntimeError, match="newer than this code"):  # 0.2.0 may read what was dropped
        release.start_service("wizard", data_dir, env=env)
    assert "likes_count" not in columns(data_dir, env, "wizards")
    assert "likes_count" in columns(data_dir, env, "blueprints")
    again = contract(data_dir, env)
    assert (again.returncode, again.stdout) == (0, "nothing to contract\n")

    assert blueprint_likes(new_bob, first["id"]) == 1
    ok(new_bob.post("/api/likes/toggle", json={"blueprint_id": first["id"]}))
    assert blueprint_likes(new_bob, first["id"]) == 0
    assert ok(new_bob.post("/api/collections/wizards", json={"name": "mine"}))["user_id"] == "bob"
    for collection in ("wizards", "blueprints", "saved_prompts", "likes", "prompt_history"):
        ok(new_bob.get(f"/api/collections/{collection}"))

    # The current worker registered itself, and removes its row when it stops.
    rows = sql(data_dir, env, "SELECT role, release FROM live_processes")
    assert rows == [("web worker", live_processes.RELEASE)]
    new.stop()
    assert sql(data_dir, env, "SELECT COUNT(*) FROM live_processes") == [(0,)]

    if "DATABASE_URL" not in env:  # the contracted schema is the one a new database gets
        fresh = data_dir.parent / "fresh"
        code = f"from app.wizard.migrations import open_database; open_database('sqlite:///{fresh}/wizard.db')"
        subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
        assert schema_of(data_dir / "wizard.db") == schema_of(fresh / "wizard.db")


def test_a_start_while_a_migration_holds_the_lock_waits_then_serves_the_whole_schema(release, database, monkeypatch):
    """The lock taken by the test as a migrating process holds it: the current service
    answers nothing until it is released, then serves with its expand step applied."""
    data_dir, env = database
    monkeypatch.delenv("DATABASE_URL", raising=False)
    made = subprocess.run(  # a database as release 0.2.0 makes it
        [
            release.python,
            "-c",
            "import os; from app.wizard.migrations import open_database; "
            "open_database(os.environ.get('DATABASE_URL') or 'sqlite:///' + os.environ['DATA_DIR'] + '/wizard.db')",
        ],
        cwd=release.tree,
        env=release.env({"DATA_DIR": str(data_dir), **env}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert recorded(data_dir, env) == [(1, None)]
    url = env.get("DATABASE_URL")
    if url is None:
        holder = sqlite3.connect(data_dir / "wizard.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the write lock, which a migration takes at BEGIN
    else:
        holder = psycopg.connect(url, application_name="the test")
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("wizard"),))
    port = services.free_port()
    started = {}

    def start():
        try:
            started["service"] = services.start("wizard", data_dir, port=port, env=env)
        except BaseException as exc:
            started["error"] = exc

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    try:
        time.sleep(3)
        assert starting.is_alive() and not started, started
        with pytest.raises(requests.RequestException):
            requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
        assert recorded(data_dir, env) == [(1, None)]  # nothing ran meanwhile
    finally:
        holder.rollback()
        holder.close()
    starting.join(60)
    assert "service" in started, started
    service = started["service"]
    try:
        assert recorded(data_dir, env) == [(1, None), (2, "expand")]
        ok(WizardClient(service.base_url, "alice").post("/api/collections/saved_prompts", json={"key": "k"}))
        assert [
            r["key"] for r in ok(WizardClient(service.base_url, "alice").get("/api/collections/saved_prompts"))
        ] == ["k"]
    finally:
        service.stop()


def test_a_migration_lock_held_past_the_wait_fails_saying_so_on_postgresql(postgres_server, monkeypatch):
    """PostgreSQL's advisory lock waits LOCK_WAIT_SECONDS at most (lock_timeout), like SQLite's."""
    from app.common import migrations
    from app.common.db import open_for_command
    from app.wizard.migrations import HISTORY

    url = postgres_server.new_database()
    monkeypatch.setattr(migrations, "LOCK_WAIT_SECONDS", 0.5)
    with psycopg.connect(url, application_name="the test") as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("wizard"),))
        db = open_for_command(url, HISTORY)
        try:
            with pytest.raises(migrations.MigrationLockTimeout, match="for more than 0.5 s"):
                migrations.bring_up_to_date(db, HISTORY)
        finally:
            db.close()
        holder.rollback()
