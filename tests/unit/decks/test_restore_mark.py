"""A deck log restored from a backup (docs/backup.md): the mark beside it,
`restored.json`, makes the next seq pass every seq the log could have handed out
after its backup, `highest_seq + (cap - bytes) // SHORTEST_LINE + 1`; without a mark,
or with one that cannot be read, the seqs go on from the log."""

import json
import logging
import os

from app.decks import eventlog

CAP = 4096  # a small cap, so that the floor is a small number
NOTE = {"type": "note", "slide": 0, "text": "hello"}


def log_of(tmp_path, count):
    """A session's log holding `count` events (seqs 1..count), written as the service does."""
    folder = tmp_path / "sessions" / "s1"
    folder.mkdir(parents=True)
    path = str(folder / "events.jsonl")
    eventlog.commit(path, [dict(NOTE) for _ in range(count)], eventlog.SeqState(), CAP)
    return path


def appended(path, count=1):
    """The seqs of `count` events appended by a process that has not seen the log yet
    (a service started after the restore)."""
    outcome = eventlog.commit(path, [dict(NOTE) for _ in range(count)], eventlog.SeqState(), CAP)
    return [event["seq"] for event in outcome.events]


def test_the_first_append_after_a_restore_passes_the_floor(tmp_path):
    path = log_of(tmp_path, 5)
    length = os.path.getsize(path)
    eventlog.mark_restored(path, 5, length, "3f2a9c1e")

    floor = 5 + (CAP - length) // 40 + 1
    assert eventlog.SHORTEST_LINE == 40
    assert eventlog.seq_floor(path, CAP) == floor

    assert appended(path) == [floor + 1]
    # A client that held a seq of the lost host resumes with after=<seq>: it gets the new events.
    assert [e["seq"] for e in eventlog.read_events(path, floor)] == [floor + 1]
    assert [e["seq"] for e in eventlog.read_events(path, 0)] == [1, 2, 3, 4, 5, floor + 1]


def test_the_floor_passes_every_seq_the_lost_log_could_reach(tmp_path):
    path = log_of(tmp_path, 5)
    backed_up = open(path, "rb").read()
    # After the backup, the lost host filled the log to its cap with the shortest events there are.
    state = eventlog.SeqState()
    while eventlog.commit(path, [{}], state, CAP).events:
        pass
    reached = eventlog.last_seq_in_file(path)
    assert reached > 5
    # The restore: the copy back in place (its index is derived: not in the snapshot), and the mark.
    with open(path, "wb") as f:
        f.write(backed_up)
    os.unlink(tmp_path / "sessions" / "s1" / "events.idx")
    eventlog.mark_restored(path, 5, len(backed_up), "3f2a9c1e")
    assert reached <= eventlog.seq_floor(path, CAP) < appended(path)[0]


def test_appends_past_the_floor_are_contiguous(tmp_path):
    path = log_of(tmp_path, 3)
    eventlog.mark_restored(path, 3, os.path.getsize(path), "3f2a9c1e")
    floor = eventlog.seq_floor(path, CAP)

    state = eventlog.SeqState()
    first = eventlog.commit(path, [dict(NOTE)], state, CAP)
    more = eventlog.commit(path, [dict(NOTE), dict(NOTE)], state, CAP)
    assert [e["seq"] for e in first.events + more.events] == [floor + 1, floor + 2, floor + 3]
    # Another process (another worker, a restart) goes on from the log: the mark, still there, adds no jump.
    assert (tmp_path / "sessions" / "s1" / eventlog.RESTORED_MARK).exists()
    assert appended(path, 2) == [floor + 4, floor + 5]


def test_without_a_mark_the_seqs_go_on_from_the_log(tmp_path):
    path = log_of(tmp_path, 4)
    assert eventlog.seq_floor(path, CAP) == 0
    assert appended(path, 2) == [5, 6]


def test_an_unreadable_mark_is_logged_and_ignored(tmp_path, caplog):
    path = log_of(tmp_path, 4)
    mark = tmp_path / "sessions" / "s1" / eventlog.RESTORED_MARK
    for text in ("{not json", json.dumps({"highest_seq": 4}), json.dumps(["a list"])):
        mark.write_text(text)
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="bundle.decks.eventlog"):
            assert eventlog.seq_floor(path, CAP) == 0
        assert [r.getMessage() for r in caplog.records] == [
            f"restored.json beside {path} is unreadable: its seqs continue from the log alone"
        ]
    first = appended(path)
    assert first == [5]
