"""The folder of collection lists nginx sends: the sweep keeps what was written lately;
the anonymous view is published where one host owns the database."""

import os
import time

import requests

from app.wizard import cache, list_files, public_lists


def test_the_sweep_removes_only_files_not_written_for_a_while(tmp_path):
    now = time.time()
    old, fresh = tmp_path / ("a" * 24 + ".json"), tmp_path / ("b" * 24 + ".json")
    old.write_bytes(b"[]")
    fresh.write_bytes(b"[1]")
    os.utime(old, (now - list_files.STALE_SECONDS - 5,) * 2)
    os.utime(fresh, (now - list_files.STALE_SECONDS + 5,) * 2)
    list_files.prune(str(tmp_path), now=now)
    assert not old.exists() and fresh.read_bytes() == b"[1]"


def test_the_anonymous_view_is_published_on_sqlite_only(wizard_server, db_backend):
    # With PostgreSQL another host's nginx could send its own file before that host
    # heard of a write (app/wizard/public_lists.py).
    answer = requests.get(
        wizard_server.base_url + "/api/collections/blueprints",
        timeout=10,
        headers={"Remote-User": "public", "X-Wiz-Accel-Lists": "on"},
    )
    assert answer.status_code == 200
    published = wizard_server.data_dir / "lists" / "public" / "blueprints.json"
    assert published.exists() == (db_backend.name == "sqlite")


def test_a_published_view_never_moves_back_past_a_newer_one(tmp_path, monkeypatch):
    # Builds finish in any order (a slow anonymous read, a writer's rebuild); a file
    # withdrawn after a failure or at a start must not let an older build in either.
    monkeypatch.setattr(public_lists, "_folder", str(tmp_path))
    older, newer = cache.answer(b'[{"title":"older"}]'), cache.answer(b'[{"title":"newer"}]')
    body = tmp_path / "blueprints.json"
    public_lists.store("blueprints", 7, newer)
    public_lists.store("blueprints", 6, older)
    assert body.read_bytes() == newer.body
    first_mtime = body.stat().st_mtime
    public_lists.withdraw("blueprints")
    public_lists.store("blueprints", 6, older)
    assert not body.exists()
    public_lists.store("blueprints", 7, older)  # as new as the last: its content is at least that new
    assert body.read_bytes() == older.body and body.stat().st_mtime > first_mtime
    mtime = body.stat().st_mtime
    public_lists.store("blueprints", 8, older)  # the same bytes: the file (and its ETag) stays
    assert body.stat().st_mtime == mtime
    body.write_bytes(b"[cut short")  # not the body its state describes (another mtime)
    os.utime(body, (mtime - 1, mtime - 1))
    public_lists.store("blueprints", 8, older)
    assert body.read_bytes() == older.body and body.stat().st_mtime > mtime


def test_a_leftover_view_another_starting_worker_removed_first_is_no_error(tmp_path, monkeypatch):
    # On PostgreSQL the views an earlier SQLite run left are removed without the lock,
    # by every worker of the start: the listing may name a file another has removed.
    for name in ("blueprints.json", "wizards.json", "wizards.json.tmp"):
        (tmp_path / name).write_bytes(b"[]")
    listing = os.scandir

    def listed_then_removed_by_another_worker(folder):
        entries = list(listing(folder))
        for entry in entries:
            os.unlink(entry.path)
        return iter(entries)

    monkeypatch.setattr(public_lists.os, "scandir", listed_then_removed_by_another_worker)
    public_lists._remove_bodies(str(tmp_path))
    assert list(tmp_path.iterdir()) == []
