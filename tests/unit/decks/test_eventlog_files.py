"""Reading the log file directly: cursors, torn and garbage lines, long lines."""

import json
import os

import pytest

from app.decks import eventlog


def write_log(path, seqs, big_every=0, garbage_after=None, torn=False):
    with open(path, "wb") as f:
        for seq in seqs:
            text = "x" * (70_000 if big_every and seq % big_every == 0 else 10)  # longer than a read block
            f.write(json.dumps({"seq": seq, "type": "note", "text": text}).encode() + b"\n")
            if seq == garbage_after:
                f.write(b'{"seq": 99, "type": "no\n')  # an old torn line, later terminated
    if torn:
        with open(path, "ab") as f:
            f.write(b'{"seq": 1000, "type": "note", "text": "' + b"y" * 100_000)


@pytest.mark.parametrize("big_every", [0, 3])
def test_read_events_after_every_cursor(tmp_path, big_every):
    path = tmp_path / "events.jsonl"
    seqs = list(range(1, 21))
    write_log(path, seqs, big_every=big_every, garbage_after=7, torn=True)
    for after in range(0, 22):
        assert [e["seq"] for e in eventlog.read_events(path, after)] == [s for s in seqs if s > after]
    assert [e["seq"] for e in eventlog.read_events(path, 5, limit=3)] == [6, 7, 8]


def test_scan_tail_skips_a_long_torn_fragment(tmp_path):
    path = tmp_path / "events.jsonl"
    write_log(path, [1, 2, 3], big_every=3, torn=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        last, complete_end = eventlog.scan_tail(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    assert last == 3
    assert path.read_bytes()[:complete_end].endswith(b"}\n")


def test_missing_or_empty_log(tmp_path):
    assert eventlog.read_events(tmp_path / "nope.jsonl", 0) == []
    (tmp_path / "empty.jsonl").write_bytes(b"")
    assert eventlog.read_events(tmp_path / "empty.jsonl", 3) == []
    assert eventlog.last_seq_in_file(tmp_path / "empty.jsonl") == 0
