"""The folder of collection lists nginx sends: the sweep keeps what was written lately."""
import os
import time

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
