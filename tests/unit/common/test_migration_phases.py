"""Expand and contract steps (app/common/migrations.py) and the registry of live
processes (app/common/live_processes.py), on real SQLite files: a start applies the
expand steps only, `contract` runs the others once no process of another release is
live, and a history table of release 0.2.0 (no phase) is brought forward."""

import importlib.util
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from peewee import CharField, DatabaseProxy, IntegerField, Model, SqliteDatabase
from playhouse.migrate import migrate

from app.common import live_processes
from app.common.migrations import (
    CONTRACT,
    ContractRefused,
    History,
    MigrationLockTimeout,
    Step,
    bring_up_to_date,
    contract,
    recorded_phases,
)

proxy = DatabaseProxy()


class Pet(Model):
    """The current model: step 2 added `legs`; step 3 (contract) dropped `nickname`,
    which the release before read."""

    name = CharField()
    legs = IntegerField(default=4)

    class Meta:
        database = proxy
        table_name = "pets"


def add_legs(db, migrator):
    migrate(migrator.add_column("pets", "legs", IntegerField(default=4)))


def drop_nickname(db, migrator):
    migrate(migrator.drop_column("pets", "nickname"))


STEPS = [Step(1, "release 0.1.0"), Step(2, "legs", add_legs), Step(3, "no nickname", drop_nickname, phase=CONTRACT)]
HISTORY = History("pets", [Pet], STEPS)


def release_0_2_database(path):
    """As a release before the phases left it: its table and a history without `phase`."""
    with sqlite3.connect(path) as conn:
        conn.executescript("""
            CREATE TABLE pets (id INTEGER NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, nickname VARCHAR(255));
            INSERT INTO pets (name, nickname) VALUES ('rex', 'rexy');
            CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR(200) NOT NULL,
                                            applied_at VARCHAR(40) NOT NULL);
            INSERT INTO schema_migrations VALUES (1, 'release 0.1.0', '2026-01-01T00:00:00Z');
        """)


def open_db(path):
    db = SqliteDatabase(str(path), pragmas={"journal_mode": "wal", "busy_timeout": 10000})
    proxy.initialize(db)
    return db


def pet_columns(path):
    with sqlite3.connect(path) as conn:
        return [row[1] for row in conn.execute("PRAGMA table_info(pets)")]


def live_row(db, release, host="app2", seen_ago=0.0, pid=4242):
    """A row as a process of `release` writes it (seen `seen_ago` seconds ago)."""
    with db.connection_context():
        db.execute_sql(
            "INSERT INTO live_processes VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                f"{host}-{release}-{seen_ago}-{pid}",
                host,
                pid,
                "web worker",
                release,
                "2026-01-01T00:00:00Z",
                time.time() - seen_ago,
            ),
        )


def test_a_start_applies_the_expand_steps_only_and_the_code_works_either_way(tmp_path):
    path = tmp_path / "old.db"
    release_0_2_database(path)
    db = open_db(path)
    assert bring_up_to_date(db, HISTORY) == 2
    assert recorded_phases(db) == {1: None, 2: "expand"}  # the earlier row: an expand step
    assert pet_columns(path) == ["id", "name", "nickname", "legs"]
    with db.connection_context():  # the current code reads and writes with the column still there
        Pet.create(name="tom")
        assert [(p.name, p.legs) for p in Pet.select().order_by(Pet.id)] == [("rex", 4), ("tom", 4)]
    assert bring_up_to_date(db, HISTORY) == 2  # and every later start leaves the contract step alone


def test_contract_runs_the_pending_contract_steps_once(tmp_path):
    path = tmp_path / "old.db"
    release_0_2_database(path)
    db = open_db(path)
    done = contract(db, HISTORY, "9.9")  # the expand steps first, when no start ran them
    assert [s.version for s in done.expand] == [2] and [s.version for s in done.contract] == [3]
    assert pet_columns(path) == ["id", "name", "legs"]
    assert recorded_phases(db) == {1: None, 2: "expand", 3: "contract"}
    again = contract(db, HISTORY, "9.9")
    assert again.expand == [] and again.contract == []
    with db.connection_context():
        assert [p.name for p in Pet.select()] == ["rex"]


def test_a_dry_run_lists_and_changes_nothing(tmp_path):
    path = tmp_path / "old.db"
    release_0_2_database(path)
    db = open_db(path)
    done = contract(db, HISTORY, "9.9", dry_run=True)
    assert [s.version for s in done.expand] == [2] and [s.version for s in done.contract] == [3]
    assert pet_columns(path) == ["id", "name", "nickname"]
    assert recorded_phases(db) == {1: None}


def test_contract_refuses_while_a_process_of_another_release_is_live(tmp_path):
    path = tmp_path / "old.db"
    release_0_2_database(path)
    db = open_db(path)
    bring_up_to_date(db, HISTORY)
    live_row(db, "0.2.9", host="app2")
    live_row(db, "9.9", host="app1")  # this release's own processes do not count
    dry = contract(db, HISTORY, "9.9", dry_run=True)  # says so ahead
    assert dry.blockers == ["a web worker of release 0.2.9 on host app2 (pid 4242)"]
    with pytest.raises(ContractRefused) as refused:
        contract(db, HISTORY, "9.9")
    assert str(refused.value) == (
        "the pets schema was not contracted: a web worker of release 0.2.9 on host app2 (pid 4242) is live; "
        "upgrade or stop it, then run contract again"
    )
    assert "\n" not in str(refused.value)
    assert pet_columns(path) == ["id", "name", "nickname", "legs"] and 3 not in recorded_phases(db)
    with db.connection_context():  # it went away without removing its row: live no longer, after a while
        db.execute_sql(
            "UPDATE live_processes SET seen_at = seen_at - ? WHERE host = 'app2'", (live_processes.LIVE_SECONDS + 1,)
        )
    assert [s.version for s in contract(db, HISTORY, "9.9").contract] == [3]


def test_a_new_database_is_made_contracted(tmp_path):
    db = open_db(tmp_path / "new.db")
    assert bring_up_to_date(db, HISTORY) == 3
    assert recorded_phases(db) == {1: "expand", 2: "expand", 3: "contract"}
    assert pet_columns(tmp_path / "new.db") == ["id", "name", "legs"]
    assert contract(db, HISTORY, "9.9").contract == []


def test_a_later_expand_step_runs_while_a_contract_step_waits(tmp_path):
    path = tmp_path / "old.db"
    release_0_2_database(path)
    db = open_db(path)
    bring_up_to_date(db, HISTORY)

    def add_colour(db, migrator):
        migrate(migrator.add_column("pets", "colour", CharField(null=True)))

    later = History("pets", [Pet], [*STEPS, Step(4, "colour", add_colour)])
    assert bring_up_to_date(db, later) == 4
    assert recorded_phases(db) == {1: None, 2: "expand", 4: "expand"}
    assert [s.version for s in contract(db, later, "9.9").contract] == [3]
    assert pet_columns(path) == ["id", "name", "legs", "colour"]


def test_a_registered_process_is_live_until_it_stops(tmp_path):
    db = open_db(tmp_path / "new.db")
    bring_up_to_date(db, HISTORY)
    registration = live_processes.register(db, "job worker")
    try:
        with db.connection_context():
            rows = db.execute_sql("SELECT host, role, release FROM live_processes").fetchall()
            assert rows == [(live_processes.HOST, "job worker", live_processes.RELEASE)]
            assert live_processes.others_live(db, "0.0.1") == [
                f"a job worker of release {live_processes.RELEASE} on host {live_processes.HOST} (pid {os.getpid()})"
            ]
            assert live_processes.others_live(db) == []
    finally:
        registration.stop()
    registration.stop()  # again: nothing
    with db.connection_context():
        assert db.execute_sql("SELECT COUNT(*) FROM live_processes").fetchone() == (0,)


ROOT = Path(__file__).resolve().parents[3]
RELEASE_0_2_0 = "bacec1f"


def release_0_2_0_migrations(tmp_path):
    """Release 0.2.0's own app/common/migrations.py (from its commit), as a module."""
    source = subprocess.run(
        ["git", "show", f"{RELEASE_0_2_0}:app/common/migrations.py"], cwd=ROOT, capture_output=True, text=True
    )
    if source.returncode != 0:
        pytest.skip(f"release 0.2.0's commit {RELEASE_0_2_0} is not in this clone")
    path = tmp_path / "migrations_0_2_0.py"
    path.write_text(source.stdout)
    spec = importlib.util.spec_from_file_location("migrations_0_2_0", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def history_table(path, table="schema_migrations"):
    with sqlite3.connect(path) as conn:
        return [version for (version,) in conn.execute(f"SELECT version FROM {table} ORDER BY version")]


def test_release_0_2_0_starts_on_the_expanded_database_and_refuses_the_contracted_one(tmp_path):
    old = release_0_2_0_migrations(tmp_path)
    old_history = old.History("pets", [Pet], [old.Step(1, "release 0.1.0")])
    path = tmp_path / "old.db"
    release_0_2_database(path)
    db = open_db(path)
    bring_up_to_date(db, HISTORY)
    assert history_table(path) == [1] and history_table(path, "schema_expansions") == [2]
    assert old.bring_up_to_date(db, old_history) == 1  # 0.2.0 starts (again) on the expanded schema
    contract(db, HISTORY, "9.9")
    assert history_table(path) == [1, 2, 3]  # the contract step, and a copy of the expand step below it
    assert recorded_phases(db) == {1: None, 2: "expand", 3: "contract"}
    with pytest.raises(old.SchemaTooNew):
        old.bring_up_to_date(db, old_history)


def test_the_steps_release_0_2_0_knew_stay_where_it_reads_them(tmp_path):
    """A release 0.1.0 database brought forward past 0.2.0's own step 2: 0.2.0 must see
    it applied, or it would run it again."""
    old = release_0_2_0_migrations(tmp_path)
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE pets (id INTEGER NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL)")
    history = History("pets", [Pet], STEPS[:2], before_phases=2)
    db = open_db(path)
    bring_up_to_date(db, history)
    assert history_table(path) == [1, 2] and history_table(path, "schema_expansions") == []
    assert old.bring_up_to_date(db, old.History("pets", [Pet], [old.Step(1, "a"), old.Step(2, "legs")])) == 2
    with pytest.raises(ValueError):
        History("pets", [Pet], STEPS, before_phases=3)  # a step 0.2.0 knew cannot be a contract one


def test_a_new_database_without_contract_steps_keeps_its_expand_steps_from_the_older_releases(tmp_path):
    db = open_db(tmp_path / "new.db")
    bring_up_to_date(db, History("pets", [Pet], STEPS[:2]))
    assert history_table(tmp_path / "new.db") == [1]
    assert history_table(tmp_path / "new.db", "schema_expansions") == [2]
    new = open_db(tmp_path / "contracted.db")
    bring_up_to_date(new, HISTORY)  # made contracted: every step where all releases read
    assert history_table(tmp_path / "contracted.db") == [1, 2, 3]


def test_contract_refuses_while_an_unregistered_process_holds_the_sqlite_file(tmp_path):
    path = tmp_path / "old.db"
    release_0_2_database(path)
    db = open_db(path)
    bring_up_to_date(db, HISTORY)
    hold = "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1]); c.execute('SELECT 1 FROM pets'); "
    hold += "print('open', flush=True); time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "open\n"
        expected = (
            f"a process not registered as one of release 9.9 on host {live_processes.HOST} holding "
            f"{os.path.realpath(path)} open (pid {holder.pid})"
        )
        assert contract(db, HISTORY, "9.9", dry_run=True).blockers == [expected]
        with pytest.raises(ContractRefused) as refused:
            contract(db, HISTORY, "9.9")
        assert expected in str(refused.value) and "\n" not in str(refused.value)
        assert 3 not in recorded_phases(db)
        live_row(db, "9.9", host=live_processes.HOST, pid=holder.pid)  # a registered process of this release
        assert contract(db, HISTORY, "9.9", dry_run=True).blockers == []
    finally:
        holder.kill()
        holder.wait()


def test_a_refresh_writes_a_deleted_row_again(tmp_path):
    db = open_db(tmp_path / "new.db")
    bring_up_to_date(db, HISTORY)
    registration = live_processes.register(db, "job worker")
    try:
        with db.connection_context():
            db.execute_sql("DELETE FROM live_processes")  # the clean-up of another process, a restore
        registration.refresh()
        with db.connection_context():
            assert db.execute_sql("SELECT pid, role FROM live_processes").fetchall() == [(os.getpid(), "job worker")]
    finally:
        registration.stop()
    registration.refresh()  # stopped: not written again
    with db.connection_context():
        assert db.execute_sql("SELECT COUNT(*) FROM live_processes").fetchone() == (0,)


def test_unregister_all_removes_this_process_rows(tmp_path):
    db = open_db(tmp_path / "new.db")
    bring_up_to_date(db, HISTORY)
    live_processes.register(db, "web worker")
    live_processes.register(db, "job worker")
    live_processes.unregister_all()
    with db.connection_context():
        assert db.execute_sql("SELECT COUNT(*) FROM live_processes").fetchone() == (0,)


def test_a_migration_lock_held_too_long_fails_saying_so(tmp_path, monkeypatch):
    from app.common import migrations

    path = tmp_path / "old.db"
    release_0_2_database(path)
    db = open_db(path)
    db.connect()  # (in WAL mode from now on)
    db.close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(migrations, "LOCK_WAIT_SECONDS", 0.2)
    try:
        with pytest.raises(MigrationLockTimeout) as late:
            bring_up_to_date(db, HISTORY)
        assert "held the pets schema's migration lock for more than 0.2 s" in str(late.value)
    finally:
        holder.rollback()
        holder.close()
