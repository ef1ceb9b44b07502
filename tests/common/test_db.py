"""Opening a service's SQLite database from several processes at once."""

import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Opens the wizard's database once its parent says go (a line on stdin), the way
# each worker of a first start opens it.
OPENER = """
import sys
from app.wizard.migrations import open_database
print("ready", flush=True)
sys.stdin.readline()
open_database("sqlite:///" + sys.argv[1])
print("opened", flush=True)
"""


def open_together(path, processes):
    """Starts `processes` openers, lets them go together once all are ready; their
    (exit code, stderr)."""
    openers = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(path)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    for opener in openers:
        assert opener.stdout.readline() == "ready\n", opener.stderr.read()
    for opener in openers:
        opener.stdin.write("go\n")
        opener.stdin.flush()
    return [(opener.wait(timeout=120), opener.stderr.read()) for opener in openers]


def test_workers_that_open_a_new_database_together_all_start(tmp_path):
    """Each process switches the file to WAL; SQLite refuses all but one switch at once
    without waiting, and a refusal must not stop a worker's start."""
    for round_ in range(4):
        path = tmp_path / f"new-{round_}.db"
        outcomes = open_together(path, processes=4)
        assert [code for code, _ in outcomes] == [0] * 4, [err[-1500:] for code, err in outcomes if code]
        with sqlite3.connect(path) as connection:
            assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
            assert connection.execute("SELECT COUNT(*) FROM schema_migrations").fetchone()[0] > 0
