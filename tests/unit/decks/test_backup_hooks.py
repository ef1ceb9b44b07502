"""The deck service's hooks for the backup command (app/decks/backup.py): a log is
copied up to its last complete line with its highest seq and length; every other file
is left to the plain copy; a restore marks each log it put back."""

import json
import os

from app.decks import backup, eventlog

LOG = "sessions/s1/events.jsonl"


def test_a_log_with_a_torn_line_is_copied_to_its_last_complete_line(tmp_path):
    source = tmp_path / "events.jsonl"
    complete = b"".join(
        json.dumps({"seq": seq, "type": "note", "text": "x" * seq}).encode() + b"\n" for seq in (1, 2, 3)
    )
    source.write_bytes(complete + b'{"seq": 4, "type": "no')  # a line being written
    target = tmp_path / "copy.jsonl"

    facts = backup.copy_special(LOG, str(source), str(target))

    assert facts == {"highest_seq": 3, "bytes": len(complete)}
    assert target.read_bytes() == complete
    assert [e["seq"] for e in eventlog.read_events(target, 0)] == [1, 2, 3]


def test_an_empty_log_is_copied_empty(tmp_path):
    (tmp_path / "events.jsonl").write_bytes(b"")
    facts = backup.copy_special(LOG, str(tmp_path / "events.jsonl"), str(tmp_path / "copy.jsonl"))
    assert facts == {"highest_seq": 0, "bytes": 0}
    assert (tmp_path / "copy.jsonl").read_bytes() == b""


def test_any_other_file_is_left_to_the_plain_copy(tmp_path):
    source = tmp_path / "file"
    source.write_text('{"seq": 1}\n')
    for rel in (
        "sessions/s1/session.json",
        "sessions/s1/events.idx",
        "sessions/s1/scribbles/events.jsonl",
        "decks/d1/events.jsonl",
        "events.jsonl",
    ):
        assert backup.copy_special(rel, str(source), str(tmp_path / "copy")) is None
    assert not (tmp_path / "copy").exists()
    assert backup.SKIP.match("sessions/s1/events.idx") and not backup.SKIP.match(LOG)


def test_a_restore_marks_each_log_with_its_facts(tmp_path):
    folder = tmp_path / "sessions" / "s1"
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_bytes(b'{"seq":7,"type":"note"}\n')
    backup.restored(str(tmp_path), {LOG: {"highest_seq": 7, "bytes": 24}, "other/file": {}}, "3f2a9c1e")
    mark = json.loads((folder / eventlog.RESTORED_MARK).read_text())
    assert {k: mark[k] for k in ("highest_seq", "bytes", "snapshot")} == {
        "highest_seq": 7,
        "bytes": 24,
        "snapshot": "3f2a9c1e",
    }
    assert eventlog.seq_floor(folder / "events.jsonl", 4096) == 7 + (4096 - 24) // 40 + 1
    assert not os.path.exists(tmp_path / "other")
