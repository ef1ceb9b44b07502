"""Moving a notebook install from SQLite to PostgreSQL (`python -m app.notebook
copy-to-postgres`): the rows come along, and the full-text index, which each engine
keeps its own way, is made again on the target, so search finds what it found."""

import os
import subprocess
import sys

from tests.support.notebook import add_note, add_text_source, start_stack, stop_stack
from tests.support.shared import ROOT


def search(nb, query):
    response = nb.post("/search", json={"type": "text", "query": query})
    assert response.status_code == 200, response.text
    return sorted(hit["id"] for hit in response.json()["results"])


def test_a_notebook_moves_to_postgresql_and_its_search_follows(tmp_path, postgres_server):
    data_dir = tmp_path / "data"
    before = start_stack(data_dir)
    try:
        notebook = before.notebook("field notes")
        source = add_text_source(before, notebook, "Glaciers", "The glacier retreated past the old moraine.")
        note = add_note(before, notebook, "Moraines", "A moraine marks where the glacier stood.")
        found = search(before, "moraine")
        assert found == sorted([source, note])
        listed = before.get(f"/sources?notebook_id={notebook}").json()
    finally:
        stop_stack(before)

    url = postgres_server.new_database()
    done = subprocess.run(
        [sys.executable, "-m", "app.notebook", "copy-to-postgres", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DATA_DIR": str(data_dir)},
    )
    assert done.returncode == 0, done.stderr
    assert "indexed for text search" in done.stdout and "MISMATCH" not in done.stdout

    after = start_stack(data_dir, DATABASE_URL=url)
    try:
        assert search(after, "moraine") == found
        assert after.get(f"/sources?notebook_id={notebook}").json() == listed
        assert after.get(f"/notes/{note}").json()["content"] == "A moraine marks where the glacier stood."
    finally:
        stop_stack(after)
