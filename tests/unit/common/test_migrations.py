"""Schema migrations (app/common/migrations.py) on real SQLite files: a new database,
a release 0.1.0 database brought forward, each step exactly once when many processes
start together, and a database newer than the code refused with one line."""

import sqlite3

import pytest
from peewee import CharField, DatabaseProxy, IntegerField, Model, SqliteDatabase
from playhouse.migrate import migrate

from app.common.migrations import CONTRACT, History, SchemaTooNew, Step, applied_versions, bring_up_to_date

proxy = DatabaseProxy()


class Pet(Model):
    """The current model: `legs` was added by step 2, `sound` by step 3."""

    name = CharField()
    legs = IntegerField(default=4)
    sound = CharField(default="")

    class Meta:
        database = proxy
        table_name = "pets"


RELEASE_DDL = "CREATE TABLE pets (id INTEGER NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL)"


def add_legs(db, migrator):
    migrate(migrator.add_column("pets", "legs", IntegerField(default=4)))


def add_sound(db, migrator):
    migrate(migrator.add_column("pets", "sound", CharField(default="")))
    db.execute_sql("UPDATE pets SET sound = 'woof' WHERE name = 'rex'")  # a data step beside the column


HISTORY = History("pets", [Pet], [Step(1, "release 0.1.0"), Step(2, "legs", add_legs), Step(3, "sound", add_sound)])


def open_db(path):
    db = SqliteDatabase(str(path), pragmas={"journal_mode": "wal", "busy_timeout": 10000})
    proxy.initialize(db)
    return db


def columns(path):
    with sqlite3.connect(path) as conn:
        return {
            table: [(c[1], c[2].upper(), c[3], c[4]) for c in conn.execute(f"PRAGMA table_info({table})")]
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }


def release_database(path):
    """A database as release 0.1.0 left it: its tables, its data, no history."""
    with sqlite3.connect(path) as conn:
        conn.execute(RELEASE_DDL)
        conn.executemany("INSERT INTO pets (name) VALUES (?)", [("rex",), ("tom",)])


def test_a_new_database_gets_the_current_tables_at_the_newest_version(tmp_path):
    db = open_db(tmp_path / "new.db")
    assert bring_up_to_date(db, HISTORY) == 3
    assert [v[:2] for v in applied_versions(db)] == [(1, "release 0.1.0"), (2, "legs"), (3, "sound")]
    assert [c[0] for c in columns(tmp_path / "new.db")["pets"]] == ["id", "name", "legs", "sound"]
    assert bring_up_to_date(db, HISTORY) == 3 and len(applied_versions(db)) == 3  # nothing twice


def test_a_release_database_is_brought_forward_with_its_data(tmp_path):
    path = tmp_path / "old.db"
    release_database(path)
    db = open_db(path)
    assert bring_up_to_date(db, HISTORY) == 3
    assert [v[0] for v in applied_versions(db)] == [1, 2, 3]
    with db.connection_context():
        assert [(p.name, p.legs, p.sound) for p in Pet.select().order_by(Pet.name)] == [
            ("rex", 4, "woof"),
            ("tom", 4, ""),
        ]


def test_both_roads_give_the_same_schema(tmp_path):
    release_database(tmp_path / "old.db")
    bring_up_to_date(open_db(tmp_path / "old.db"), HISTORY)
    bring_up_to_date(open_db(tmp_path / "new.db"), HISTORY)
    assert columns(tmp_path / "old.db") == columns(tmp_path / "new.db")


def test_a_failing_step_changes_nothing_and_is_not_recorded(tmp_path):
    path = tmp_path / "old.db"
    release_database(path)

    def broken(db, migrator):
        migrate(migrator.add_column("pets", "legs", IntegerField(default=4)))
        raise RuntimeError("the step failed half way")

    history = History("pets", [Pet], [Step(1, "release 0.1.0"), Step(2, "legs", broken)])
    with pytest.raises(RuntimeError):
        bring_up_to_date(open_db(path), history)
    assert [c[0] for c in columns(path)["pets"]] == ["id", "name"]
    assert "schema_migrations" not in columns(path)  # the whole start rolled back, history table too
    assert bring_up_to_date(open_db(path), HISTORY) == 3  # and a fixed release proceeds


def test_a_database_with_a_newer_contract_step_is_refused(tmp_path):
    db = open_db(tmp_path / "new.db")
    newer = History("pets", [Pet], [*HISTORY.steps, Step(4, "drop sound", lambda db, m: None, phase=CONTRACT)])
    bring_up_to_date(db, newer)
    with pytest.raises(
        SchemaTooNew,
        match="pets database is at schema version 4, newer than this code's 3, and its step 4 is a contract step",
    ):
        bring_up_to_date(db, HISTORY)


def test_a_database_with_a_newer_expand_step_serves_and_says_so_once(tmp_path, caplog):
    db = open_db(tmp_path / "new.db")
    bring_up_to_date(db, HISTORY)
    older_code = History("pets", [Pet], HISTORY.steps[:2])
    assert bring_up_to_date(db, older_code) == 2
    assert bring_up_to_date(db, older_code) == 2
    said = [r.getMessage() for r in caplog.records if "newer release" in r.getMessage()]
    assert len(said) == 1 and "expand step(s) 3" in said[0]


def test_steps_must_be_numbered_from_one_without_gaps():
    with pytest.raises(ValueError, match="numbered"):
        History("pets", [Pet], [Step(1, "a"), Step(3, "c")])


def test_a_step_that_rebuilds_a_referenced_table_keeps_the_references(tmp_path):
    """playhouse.migrate rebuilds a SQLite table to change a column; with foreign keys
    on, dropping the old table would null (or delete) the rows that refer to it."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.executescript("""
            CREATE TABLE owners (id INTEGER NOT NULL PRIMARY KEY, name VARCHAR(255));
            CREATE TABLE pets (id INTEGER NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL,
                               owner_id INTEGER REFERENCES owners (id) ON DELETE SET NULL);
            INSERT INTO owners VALUES (1, 'ann');
            INSERT INTO pets VALUES (1, 'rex', 1);
        """)

    def names_required(db, migrator):
        migrate(migrator.add_not_null("owners", "name"))  # a table rebuild on SQLite

    history = History("pets", [Pet], [Step(1, "release 0.1.0"), Step(2, "owners need names", names_required)])
    db = SqliteDatabase(str(path), pragmas={"foreign_keys": 1, "busy_timeout": 10000})
    proxy.initialize(db)
    assert bring_up_to_date(db, history) == 2
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT owner_id FROM pets").fetchall() == [(1,)]
        required = conn.execute("SELECT \"notnull\" FROM pragma_table_info('owners') WHERE name = 'name'")
        assert required.fetchone() == (1,)
    with db.connection_context():
        assert db.execute_sql("PRAGMA foreign_keys").fetchone() == (1,)  # on again for the process's work
