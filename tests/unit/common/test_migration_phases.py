"""Expand and contract steps (app/common/migrations.py) and the registry of live
processes (app/common/live_processes.py), on real SQLite files: a start applies the
expand steps only, `contract` runs the others once no process of another release is
live, and a history table of release 0.2.0 (no phase) is brought forward."""

import os
import sqlite3
import time

import pytest
from peewee import CharField, DatabaseProxy, IntegerField, Model, SqliteDatabase
from playhouse.migrate import migrate

from app.common import live_processes
from app.common.migrations import (
    CONTRACT,
    ContractRefused,
    History,
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


def live_row(db, release, host="app2", seen_ago=0.0):
    """A row as a process of `release` writes it (seen `seen_ago` seconds ago)."""
    with db.connection_context():
        db.execute_sql(
            "INSERT INTO live_processes VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                f"{host}-{release}-{seen_ago}",
                host,
                4242,
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
