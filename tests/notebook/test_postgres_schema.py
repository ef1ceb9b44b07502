"""The notebook's schema on PostgreSQL: a new database gets the full-text column and
its GIN index with the tables, and records every step; a database made before text
search came to PostgreSQL (at schema version 2, with sources and notes that were
never indexed) gets them from step 3, its records indexed. Each case runs the code in
a process of its own, as a service start does."""

import json
import subprocess
import sys

import psycopg

from app.notebook.core.migrations import HISTORY
from tests.support.shared import ROOT

SEARCH = """
import json, sys
from app.notebook.core.models import database
from app.notebook.core.migrations import open_database
from app.notebook.routes.search import _ranked
open_database(sys.argv[1], pool=False)
data = {"query": sys.argv[2], "limit": 10, "search_sources": True, "search_notes": True}
with database.connection_context():
    print(json.dumps([parent for parent, _, _ in _ranked(data, None)[1]]))
"""


def _search(url, query):
    done = subprocess.run(
        [sys.executable, "-c", SEARCH, url, query], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _search_columns(db):
    return db.execute(
        "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'searchdoc'"
        " AND column_name IN ('document', 'body_start') ORDER BY column_name"
    ).fetchall()


def _gin_index(db):
    return db.execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = 'searchdoc' AND indexname = 'searchdoc_document'"
    ).fetchone()


# The database's history: the steps after the releases before the phases are recorded
# in schema_expansions (app.common.migrations).
HISTORY_ROWS = (
    "SELECT version, name FROM schema_migrations UNION SELECT version, name FROM schema_expansions ORDER BY version"
)


def test_a_new_database_and_one_of_version_2_end_with_the_same_text_index(postgres_server):
    url = postgres_server.new_database()
    assert _search(url, "anything") == []
    with psycopg.connect(url, autocommit=True) as db:
        assert db.execute(HISTORY_ROWS).fetchall() == [(step.version, step.name) for step in HISTORY.steps]
        assert _search_columns(db) == [("body_start", "integer"), ("document", "tsvector")]
        assert "USING gin (document)" in _gin_index(db)[0]
        # As a PostgreSQL database of schema version 2 was: no text index, records not indexed.
        db.execute("DROP INDEX searchdoc_document")
        db.execute("ALTER TABLE searchdoc DROP COLUMN document, DROP COLUMN body_start")
        db.execute("DELETE FROM schema_migrations WHERE version > 2")
        db.execute(
            "INSERT INTO source (id, kind, title, full_text, topics, status, embed, delete_file, created,"
            " updated) VALUES ('s1', 'text', 'Lighthouses', 'Fresnel lenses focus the beacons.', '[]',"
            " 'completed', false, false, now(), now()),"
            " ('s2', 'text', 'Queued beacon notes', 'Not processed yet: beacon text unindexed.', '[]', 'new',"
            " false, false, now(), now())"
        )
        db.execute(
            "INSERT INTO note (id, title, content, note_type, created, updated) VALUES"
            " ('n1', 'Keepers', 'Lighthouse keepers trimmed the beacon wicks.', 'human', now(), now())"
        )
    assert sorted(_search(url, "beacon")) == ["note:n1", "source:s1", "source:s2"]
    assert _search(url, "unindexed") == []  # a source not processed yet: its title only
    with psycopg.connect(url, autocommit=True) as db:
        assert [v for (v, _) in db.execute(HISTORY_ROWS)] == [step.version for step in HISTORY.steps]
        assert _search_columns(db) == [("body_start", "integer"), ("document", "tsvector")]
        assert _gin_index(db) is not None
