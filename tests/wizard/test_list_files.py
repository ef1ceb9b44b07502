"""The folder of collection lists nginx sends: the sweep keeps what was written lately;
the anonymous view is published where one host owns the database."""
import os
import time

import requests

from app.wizard import list_files


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
    answer = requests.get(wizard_server.base_url + "/api/collections/blueprints", timeout=10,
                          headers={"Remote-User": "public", "X-Wiz-Accel-Lists": "on"})
    assert answer.status_code == 200
    published = wizard_server.data_dir / "lists" / "public" / "blueprints.json"
    assert published.exists() == (db_backend.name == "sqlite")
