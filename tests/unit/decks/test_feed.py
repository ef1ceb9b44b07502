"""The live feed in this process, on real files: what another writer appends and
what a restore puts in place is heard through inotify (the feed never polls while
inotify watches, so these tests fail if a change goes unheard), the watch ends with
the last subscriber, and without inotify the feed polls and says so.

The feed runs on gevent in the test process; another worker's appends are made by
`eventlog.commit` with a state of their own, as that worker's writer would."""

import json
import logging
import os
import resource
import shutil
import time

import gevent
import pytest

from app.decks import eventlog, logwatch
from app.decks.feed import subscribe

WAIT_S = 30  # a bound on each wait, never an expectation of speed


@pytest.fixture
def watcher():
    watcher = logwatch.LogWatcher()
    assert watcher.available, watcher.error
    yield watcher
    watcher.close()


@pytest.fixture
def session_dir(tmp_path):
    directory = tmp_path / "sessions" / "abc"
    directory.mkdir(parents=True)
    return directory


def other_worker_appends(path, state, count, text="other"):
    """Append `count` notes as another worker's writer does; returns their seqs."""
    outcome = eventlog.commit(
        str(path), [{"type": "note", "slide": 0, "text": f"{text} {n}"} for n in range(count)], state
    )
    return [e["seq"] for e in outcome.events]


def log_copy(path, last, text="restored"):
    """A log with seqs 1..last at `path`, as a backup would hold."""
    path.write_text(
        "".join(
            json.dumps({"seq": n, "ts": "2026-01-01T00:00:00.000Z", "type": "note", "slide": 0, "text": f"{text} {n}"})
            + "\n"
            for n in range(1, last + 1)
        )
    )
    return path


def until(predicate, what):
    """wait_for on this gevent loop (wait_for's time.sleep would hold the feed's
    greenlets still): poll `predicate` with a deadline."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {WAIT_S} s")
        gevent.sleep(0.05)  # polling a condition with a deadline, letting the loop run


def received(subscription, count):
    """The next `count` messages' seqs."""
    seqs = []
    for _ in range(count):
        message = subscription.get(timeout=WAIT_S)
        assert message is not None, f"only {seqs} arrived"
        seqs.append(message["seq"])
    return seqs


def test_appends_by_another_writer_are_heard_without_polling(session_dir, watcher):
    path = session_dir / "events.jsonl"
    log = eventlog.SessionLog(str(path))
    other = eventlog.SeqState()
    with subscribe(log, str(path), watcher) as subscription:
        assert not log.feed.polling
        assert other_worker_appends(path, other, 3) == [1, 2, 3]  # the log did not exist before
        assert received(subscription, 3) == [1, 2, 3]
        for batch in range(5):
            seqs = other_worker_appends(path, other, batch + 1)
            assert received(subscription, len(seqs)) == seqs


def test_restores_of_the_log_and_of_its_directory_are_heard(session_dir, tmp_path, watcher):
    """Every way a restore puts a log in place, each followed by more appends: the
    feed publishes what is new, in order, and keeps hearing the file at the path."""
    path = session_dir / "events.jsonl"
    log = eventlog.SessionLog(str(path))
    other = eventlog.SeqState()
    other_worker_appends(path, other, 2)
    with subscribe(log, str(path), watcher) as subscription:
        assert log.feed.delivered == 2

        shutil.copyfile(log_copy(tmp_path / "backup-5", 5), path)  # copied over: same inode
        assert received(subscription, 3) == [3, 4, 5]
        assert other_worker_appends(path, other, 2) == received(subscription, 2) == [6, 7]

        os.replace(log_copy(tmp_path / "backup-9", 9), path)  # renamed over: a new inode
        assert received(subscription, 2) == [8, 9]
        assert other_worker_appends(path, other, 1) == received(subscription, 1) == [10]

        path.unlink()  # deleted, then written again
        assert other_worker_appends(path, other, 1) == received(subscription, 1) == [11]

        # The session's directory replaced by a restored copy (renamed into place),
        # once the watcher knows the old one is gone: the new one is heard of through
        # its parent, and watched again.
        restored = tmp_path / "restored-abc"
        restored.mkdir()
        log_copy(restored / "events.jsonl", 14)
        shutil.rmtree(session_dir)
        until(lambda: str(session_dir) not in watcher.watched_directories(), "the deleted directory's watch ending")
        os.rename(restored, session_dir)
        assert received(subscription, 3) == [12, 13, 14]
        assert other_worker_appends(path, other, 2) == received(subscription, 2) == [15, 16]

        # Deleted and made again, empty, then written by a writer.
        shutil.rmtree(session_dir)
        until(lambda: str(session_dir) not in watcher.watched_directories(), "the deleted directory's watch ending")
        session_dir.mkdir()
        assert other_worker_appends(path, other, 1) == received(subscription, 1) == [17]
        assert str(session_dir) in watcher.watched_directories()


def test_an_older_copy_restored_publishes_only_seqs_past_those_delivered(session_dir, tmp_path, watcher):
    path = session_dir / "events.jsonl"
    log = eventlog.SessionLog(str(path))
    other = eventlog.SeqState()
    other_worker_appends(path, other, 6)
    with subscribe(log, str(path), watcher) as subscription:
        shutil.copyfile(log_copy(tmp_path / "backup-3", 3), path)  # rolled back from 6 to 3
        # The writer continues past the highest seq it handed out (a gap, never a reuse).
        assert other_worker_appends(path, other, 2) == received(subscription, 2) == [7, 8]


def test_a_torn_line_waits_until_it_is_complete(session_dir, watcher):
    path = session_dir / "events.jsonl"
    log = eventlog.SessionLog(str(path))
    other = eventlog.SeqState()
    with subscribe(log, str(path), watcher) as subscription:
        with open(path, "ab") as f:
            f.write(b'{"seq":1,"ts":"2026-01-01T00:00:00.000Z","type":"note","sl')  # a killed writer
        # The next writer starts on a new line; the torn fragment is never published.
        assert other_worker_appends(path, other, 2) == received(subscription, 2) == [1, 2]


def test_the_watch_ends_with_the_last_subscriber(session_dir, watcher):
    path = session_dir / "events.jsonl"
    log = eventlog.SessionLog(str(path))
    first = subscribe(log, str(path), watcher)
    second = subscribe(log, str(path), watcher)
    feed = log.feed
    assert str(session_dir) in watcher.watched_directories()
    first.close()
    assert log.feed is feed and str(session_dir) in watcher.watched_directories()
    second.close()
    assert log.feed is None and feed.stopped
    assert watcher.watched_directories() == set()
    # A new subscriber starts a new feed, which hears what was appended meanwhile.
    other = eventlog.SeqState()
    other_worker_appends(path, other, 1)
    with subscribe(log, str(path), watcher) as subscription:
        assert log.feed is not feed and str(session_dir) in watcher.watched_directories()
        assert other_worker_appends(path, other, 1) == received(subscription, 1) == [2]
    assert watcher.watched_directories() == set()


def test_local_batches_and_other_writers_interleave_in_seq_order(session_dir, watcher):
    """This process's appends (published by its writer) and another's (heard from
    the file) share one log: every seq arrives once, in order."""
    from gevent.pool import Pool

    path = session_dir / "events.jsonl"
    log = eventlog.SessionLog(str(path))
    other = eventlog.SeqState()
    with subscribe(log, str(path), watcher) as subscription:
        pool = Pool(8)
        for n in range(40):
            pool.spawn(log.append, {"type": "note", "slide": 0, "text": f"local {n}"})
            gevent.sleep(0)  # the writer starts its batch in the threadpool
            if n % 5 == 0:
                other_worker_appends(path, other, 2)
        pool.join(raise_error=True)
        assert received(subscription, 56) == list(range(1, 57))


def lowest_free_fd():
    fd = os.open(os.devnull, os.O_RDONLY)
    os.close(fd)
    return fd


def test_without_inotify_the_feed_polls_and_says_so(session_dir, caplog):
    """An inotify instance refused for real (no file descriptor left: EMFILE, as
    when fs.inotify.max_user_instances is reached) leaves the stream working."""
    logwatch.LogWatcher().close()  # the C library is loaded before the limit is lowered
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free_fd(), hard))
    try:
        refused = logwatch.LogWatcher()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not refused.available and "inotify_init1" in refused.error

    path = session_dir / "events.jsonl"
    log = eventlog.SessionLog(str(path))
    other = eventlog.SeqState()
    with caplog.at_level(logging.WARNING, logger="bundle.decks.feed"):
        subscription = subscribe(log, str(path), refused)
    with subscription:
        assert log.feed.polling
        assert any(
            "looked for every 0.5 s" in r.getMessage() and "inotify_init1" in r.getMessage() for r in caplog.records
        )
        assert other_worker_appends(path, other, 3) == received(subscription, 3) == [1, 2, 3]
