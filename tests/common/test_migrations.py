"""Migrations with several processes: steps applied exactly once by processes starting
together, and a service that refuses a newer database with one line. The migrations
in process are tests/unit/common/test_migrations.py."""

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASE_DDL = "CREATE TABLE pets (id INTEGER NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL)"


def release_database(path):
    """A database as release 0.1.0 left it: its tables, its data, no history."""
    with sqlite3.connect(path) as conn:
        conn.execute(RELEASE_DDL)
        conn.executemany("INSERT INTO pets (name) VALUES (?)", [("rex",), ("tom",)])


RACER = textwrap.dedent("""
    import sys, time
    from peewee import IntegerField, SqliteDatabase
    from playhouse.migrate import migrate
    from app.common.migrations import History, Step, bring_up_to_date
    from tests.unit.common.test_migrations import Pet, proxy

    def slow_step(number):
        def apply(db, migrator):
            db.execute_sql("CREATE TABLE IF NOT EXISTS step_runs (step INTEGER, pid INTEGER)")
            db.execute_sql("INSERT INTO step_runs VALUES (?, ?)", (number, __import__("os").getpid()))
            time.sleep(0.3)  # hold the lock a while: the others must wait, not run it too
            if number == 2:
                migrate(migrator.add_column("pets", "legs", IntegerField(default=4)))
        return apply

    db = SqliteDatabase(sys.argv[1], pragmas={"journal_mode": "wal", "busy_timeout": 10000})
    proxy.initialize(db)
    steps = [Step(1, "release 0.1.0"), Step(2, "legs", slow_step(2)), Step(3, "three", slow_step(3))]
    print(bring_up_to_date(db, History("pets", [Pet], steps)))
""")


def test_processes_starting_together_apply_each_step_exactly_once(tmp_path):
    path = tmp_path / "shared.db"
    release_database(path)
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    outcomes = [racer.communicate(timeout=120) for racer in racers]
    assert [racer.returncode for racer in racers] == [0] * 6, [err[-2000:] for _, err in outcomes]
    assert [out.strip() for out, _ in outcomes] == ["3"] * 6
    with sqlite3.connect(path) as conn:
        runs = conn.execute("SELECT step, COUNT(*), COUNT(DISTINCT pid) FROM step_runs GROUP BY step").fetchall()
        history = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
    assert runs == [(2, 1, 1), (3, 1, 1)] and history == [(1,), (2,), (3,)]


def test_a_service_refuses_to_start_on_a_newer_contracted_database_with_one_line(tmp_path):
    """Through the real gunicorn: the worker exits at once and says what is wrong (a
    newer contract step may have dropped what this code reads)."""
    from app.wizard.migrations import HISTORY as WIZARD

    data_dir = tmp_path / "wizard-data"
    data_dir.mkdir()
    prepare = textwrap.dedent(f"""
        from app.wizard.migrations import open_database
        db = open_database("sqlite:///{data_dir}/wizard.db")
        with db.connection_context():
            db.execute_sql(
                "INSERT INTO schema_migrations VALUES ({WIZARD.newest + 1}, 'from the future', 'x', 'contract')"
            )
    """)
    subprocess.run([sys.executable, "-c", prepare], cwd=ROOT, check=True, timeout=60)
    env = {"SERVICE": "wizard", "PORT": "0", "DATA_DIR": str(data_dir), "PATH": "/usr/bin:/bin"}
    started = subprocess.run(
        [str(ROOT / ".venv/bin/gunicorn"), "-c", "gunicorn.conf.py", "wsgi:app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode != 0
    errors = [line for line in started.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: the wizard database is at schema version {WIZARD.newest + 1}, newer than this "
        f"code's {WIZARD.newest}, and its step {WIZARD.newest + 1} is a contract step: run the release that "
        "migrated it, or a newer one"
    ], started.stderr
