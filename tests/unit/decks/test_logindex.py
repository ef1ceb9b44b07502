"""The event log's index (events.idx): a read of a page costs what it returns, however
long the log, and the index is never trusted over the log (missing, stale, torn,
restored or foreign indexes are rebuilt). Costs are counted in bytes read, not timed."""

import json
import os
import shutil

import pytest

from app.decks import eventlog, logindex

BIG_LOG_BYTES = 60 * 1024 * 1024
# A read of one event may read the index's few entries, one index step of log and a
# small first block: far below this, whatever the size of the log.
ONE_EVENT_BUDGET = 256 * 1024


def event_line(seq, size=1000):
    return (
        json.dumps(
            {"seq": seq, "ts": "2026-01-01T00:00:00.000Z", "type": "note", "slide": 0, "text": "x" * size}
        ).encode()
        + b"\n"
    )


def write_log(path, count, size=1000, first=1):
    with open(path, "wb") as f:
        for seq in range(first, first + count):
            f.write(event_line(seq, size))
    return path


@pytest.fixture(scope="module")
def big_log(tmp_path_factory):
    """A 60 MB log of ~1 KB notes, its index built by a first read."""
    path = tmp_path_factory.mktemp("big") / "events.jsonl"
    count = BIG_LOG_BYTES // len(event_line(1))
    write_log(path, count)
    assert eventlog.read_events(path, 0, 1)[0]["seq"] == 1
    return path, count


class PreadCounter:
    """Counts the bytes every os.pread of this process returns (the log and its index)."""

    def __init__(self, monkeypatch):
        self.bytes = 0
        real = os.pread

        def counting(fd, size, offset):
            data = real(fd, size, offset)
            self.bytes += len(data)
            return data

        monkeypatch.setattr(os, "pread", counting)

    def cost(self, fn, *args):
        before = self.bytes
        result = fn(*args)
        return result, self.bytes - before


def test_reading_one_event_costs_the_same_on_a_60_mb_log_as_on_a_small_one(big_log, tmp_path, monkeypatch):
    path, count = big_log
    small = write_log(tmp_path / "events.jsonl", 3)
    eventlog.read_events(small, 0, 1)  # its index is built by the first read
    counter = PreadCounter(monkeypatch)
    small_events, small_cost = counter.cost(eventlog.read_events, small, 0, 1)
    assert [e["seq"] for e in small_events] == [1]
    for after in (0, 1, count // 3, count // 2 + 17, count - 2, count - 1):
        events, cost = counter.cost(eventlog.read_events, path, after, 1)
        assert [e["seq"] for e in events] == [after + 1]
        assert cost < ONE_EVENT_BUDGET, f"after={after}: {cost} bytes read for one event"
        assert cost - small_cost < ONE_EVENT_BUDGET
    # A page costs about what it returns.
    events, cost = counter.cost(eventlog.read_events, path, count // 2, 200)
    assert [e["seq"] for e in events] == list(range(count // 2 + 1, count // 2 + 201))
    assert cost < 200 * len(event_line(1)) + ONE_EVENT_BUDGET
    # Past the end: nothing to return, little read.
    events, cost = counter.cost(eventlog.read_events, path, count, 10)
    assert events == [] and cost < ONE_EVENT_BUDGET


def test_the_index_is_sparse_and_kept_up_to_date_by_appends(tmp_path):
    path = str(tmp_path / "events.jsonl")
    state = eventlog.SeqState()
    for _ in range(300):
        eventlog.commit(path, [{"type": "note", "slide": 0, "text": "y" * 900} for _ in range(3)], state)
    size = os.path.getsize(path)
    index = open(logindex.index_path(path), "rb").read()
    magic, covered = logindex.HEADER.unpack(index[: logindex.HEADER.size])
    assert magic == logindex.MAGIC and covered == size
    entries = [logindex.ENTRY.unpack(index[i : i + 16]) for i in range(16, len(index), 16)]
    assert size // logindex.STEP <= len(entries) <= size // logindex.STEP + 1
    data = open(path, "rb").read()
    for seq, offset in entries:
        assert json.loads(data[offset : data.index(b"\n", offset)])["seq"] == seq
    assert [e["seq"] for e in eventlog.read_events(path, 450, 3)] == [451, 452, 453]


def every_cursor_reads_right(path, seqs):
    for after in [0, 1, *seqs[::37], seqs[-1] - 1, seqs[-1], seqs[-1] + 5]:
        got = [e["seq"] for e in eventlog.read_events(path, after, 5)]
        assert got == [s for s in seqs if s > after][:5], after


def test_a_stale_or_broken_index_is_never_believed(tmp_path):
    """The log is the truth: an index left from an older or newer copy, a torn or
    garbage one, one of another log, or none, and still every read is right."""
    path = tmp_path / "events.jsonl"
    idx = logindex.index_path(path)
    write_log(path, 2000, size=200)
    every_cursor_reads_right(path, list(range(1, 2001)))
    old_index = open(idx, "rb").read()

    write_log(path, 500, size=200)  # an older copy restored (a prefix)
    every_cursor_reads_right(path, list(range(1, 501)))
    write_log(path, 3000, size=200)  # a newer one, its index behind
    every_cursor_reads_right(path, list(range(1, 3001)))
    write_log(tmp_path / "other.jsonl", 1500, size=333, first=7)
    os.replace(tmp_path / "other.jsonl", path)  # another log renamed over it
    every_cursor_reads_right(path, list(range(7, 1507)))
    with open(idx, "wb") as f:  # an index of another log
        f.write(old_index)
    every_cursor_reads_right(path, list(range(7, 1507)))
    with open(idx, "r+b") as f:  # garbage entries, a valid header
        f.seek(16)
        f.write(os.urandom(len(old_index) - 16))
    every_cursor_reads_right(path, list(range(7, 1507)))
    with open(idx, "wb") as f:  # torn
        f.write(old_index[:23])
    every_cursor_reads_right(path, list(range(7, 1507)))
    os.unlink(idx)  # missing (a backup of the log alone)
    every_cursor_reads_right(path, list(range(7, 1507)))
    assert os.path.exists(idx)


def test_a_rolled_back_log_keeps_reading_right_after_appends(tmp_path):
    """An older copy restored under a running writer: the next seqs leave a gap, the
    index follows the file as it is now."""
    path = str(tmp_path / "events.jsonl")
    state = eventlog.SeqState()
    for _ in range(400):
        eventlog.commit(path, [{"type": "note", "slide": 0, "text": "z" * 500}], state)
    backup = tmp_path / "backup.jsonl"
    shutil.copyfile(path, backup)
    for _ in range(400):
        eventlog.commit(path, [{"type": "note", "slide": 0, "text": "z" * 500}], state)
    shutil.copyfile(backup, path)
    for _ in range(100):
        eventlog.commit(path, [{"type": "note", "slide": 0, "text": "z" * 500}], state)
    every_cursor_reads_right(path, list(range(1, 401)) + list(range(801, 901)))


def test_a_torn_trailing_line_is_skipped_with_the_index(tmp_path):
    path = write_log(tmp_path / "events.jsonl", 300, size=500)
    with open(path, "ab") as f:
        f.write(event_line(301)[:40])
    assert [e["seq"] for e in eventlog.read_events(path, 298)] == [299, 300]
    state = eventlog.SeqState()
    eventlog.commit(str(path), [{"type": "note", "slide": 0, "text": "after"}], state)
    assert [e["seq"] for e in eventlog.read_events(path, 299)] == [300, 301]


def test_an_append_past_the_cap_is_refused_and_writes_nothing(tmp_path):
    path = str(tmp_path / "events.jsonl")
    state = eventlog.SeqState()
    limit = 3 * len(event_line(1, 100))
    for _ in range(2):
        eventlog.commit(path, [{"type": "note", "slide": 0, "text": "a" * 100}], state, limit)
    before = open(path, "rb").read()
    big, small = {"type": "note", "slide": 0, "text": "b" * 2000}, {"type": "note", "slide": 0, "text": "c"}
    outcome = eventlog.commit(path, [big, small, big], state, limit)
    assert [r and r["seq"] for r in outcome.placed] == [None, 3, None]  # the small one still fits
    assert [e["seq"] for e in outcome.events] == [3]
    assert open(path, "rb").read().startswith(before) and os.path.getsize(path) <= limit
    refused = eventlog.commit(path, [big], state, limit)
    assert refused.placed == [None] and refused.events == []
    assert os.path.getsize(path) <= limit
    # The next event that fits takes the next seq: a refusal takes none.
    assert eventlog.commit(path, [{"type": "note", "slide": 0}], state, limit).placed[0]["seq"] == 4
