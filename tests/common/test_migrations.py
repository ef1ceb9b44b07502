"""Migrations with several processes: steps applied exactly once by processes starting
together, and a service that refuses a newer database with one line. The migrations
in process are tests/unit/common/test_migrations.py."""

import re
import sqlite3
import subprocess
import sys
import textwrap
from contextlib import closing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASE_DDL = "CREATE TABLE pets (id INTEGER NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL)"


def release_database(path):
    """A database as release 0.1.0 left it: its tables, its data, no history. In WAL mode
    already (as a service's first start leaves it, app.common.db.switch_to_wal): the
    racers' pragma then changes nothing, where six processes switching one file at once
    would have SQLite refuse all but one ("database is locked", without waiting)."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA journal_mode = wal")
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
        history = conn.execute(
            "SELECT version FROM schema_migrations UNION SELECT version FROM schema_expansions ORDER BY version"
        ).fetchall()
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


def test_contract_refuses_a_database_that_does_not_exist_and_creates_none(tmp_path):
    """A wrong DATA_DIR: one line, exit 1, no file made (a dry run changes nothing)."""
    data_dir = tmp_path / "wizard-data"
    env = {"DATA_DIR": str(data_dir), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    for args in (["--dry-run"], []):
        done = subprocess.run(
            [sys.executable, "-m", "app.wizard", "contract", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stdout) == (1, ""), done
        assert done.stderr == f"error: no wizard database at {data_dir}/wizard.db: check DATA_DIR\n"
        assert not (data_dir / "wizard.db").exists()


def test_the_reload_preflight_leaves_no_live_process_row(tmp_path):
    """gunicorn_systemd's preflight builds the app as a worker does (so it registers)
    and exits with os._exit: its row goes before."""
    from gunicorn_systemd import PREFLIGHT

    data_dir = tmp_path / "wizard-data"
    data_dir.mkdir()
    env = {"SERVICE": "wizard", "DATA_DIR": str(data_dir), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    registers = PREFLIGHT.replace("os._exit(0)", "") + (
        "\nimport sqlite3, os\n"
        "print(sqlite3.connect(os.environ['DATA_DIR'] + '/wizard.db').execute("
        "'SELECT COUNT(*) FROM live_processes WHERE pid = ?', (os.getpid(),)).fetchone()[0])\n"
    )
    # (what the preflight does without its last two lines: the app registered this process)
    registers = registers.replace("from app.common import live_processes; live_processes.unregister_all()\n", "")
    seen = subprocess.run([sys.executable, "-c", registers], cwd=ROOT, env=env, capture_output=True, text=True)
    assert seen.stdout.strip().splitlines()[-1:] == ["1"], seen.stderr[-2000:]
    with sqlite3.connect(data_dir / "wizard.db") as conn:
        conn.execute("DELETE FROM live_processes")
    done = subprocess.run([sys.executable, "-c", PREFLIGHT], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    with sqlite3.connect(data_dir / "wizard.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM live_processes").fetchone() == (0,)


def test_the_job_worker_removes_its_row_before_huey_restarts_it(tmp_path):
    """huey's SIGHUP re-executes the worker (same pid), which registers again: one row."""
    import os
    import signal
    import time

    from tests.support.notebook import Worker, notebook_env

    data_dir = tmp_path / "notebook-data"
    data_dir.mkdir()
    worker = Worker(data_dir, {"PYTHONPATH": str(ROOT), **notebook_env(data_dir)})

    def rows():
        try:
            with closing(sqlite3.connect(data_dir / "notebook.db")) as conn:
                return conn.execute("SELECT id, pid FROM live_processes").fetchall()
        except sqlite3.OperationalError:  # not made yet
            return []

    def catches_sighup(pid):
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(re.search(r"^SigCgt:\s*([0-9a-f]+)$", status, re.M).group(1), 16)
        return bool(caught & (1 << (signal.SIGHUP - 1)))

    def wait_for(condition, what):
        deadline = time.monotonic() + 60
        while not condition():
            assert time.monotonic() < deadline, f"{what}:\n{worker.log_text()[-3000:]}"
            time.sleep(0.1)

    try:
        wait_for(lambda: len(rows()) == 1, "the worker did not register")
        [(first, pid)] = rows()
        assert pid == worker.process.pid
        # The row is written before huey's consumer installs its SIGHUP handler; a HUP
        # before that would end the process (the default action), not restart it.
        wait_for(lambda: catches_sighup(worker.process.pid), "the consumer to handle SIGHUP")
        os.kill(worker.process.pid, signal.SIGHUP)
        wait_for(lambda: any(row_id != first for row_id, _ in rows()), "the restarted worker did not register")
        time.sleep(0.5)
        assert [row_pid for _, row_pid in rows()] == [worker.process.pid]  # the first row went before the exec
    finally:
        worker.stop()
