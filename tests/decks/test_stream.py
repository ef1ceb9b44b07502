"""The live stream: replay, cursor, no gap or duplicate, keepalive, graceful stop."""

import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from devtools.waiting import wait_for
from tests.support.decks import StreamReader, post_event, post_event_on, streams_on_every_worker

# gunicorn.conf.py's graceful_timeout: a stop that open streams held would take this
# long (the arbiter then kills the worker), so a stop under it shows they did not.
GRACEFUL_TIMEOUT_S = 10


def stream_url(service, session, after=None):
    url = f"{service.base_url}/api/sessions/{session['id']}/stream"
    return url if after is None else f"{url}?after={after}"


def post_notes(service, session, count, start=0):
    for n in range(start, start + count):
        post_event(service.base_url, session["id"], {"type": "note", "slide": 0, "text": f"n{n}"}).raise_for_status()


def test_replays_past_the_cursor_then_streams_live(deck_session):
    service, session = deck_session
    post_notes(service, session, 3)
    reader = StreamReader(stream_url(service, session, after=1), until=5)
    reader.start()
    reader.wait_open()
    headers = reader.response.headers
    assert headers["Content-Type"].startswith("text/event-stream")
    assert headers["Cache-Control"] == "no-cache" and headers["X-Accel-Buffering"] == "no"
    post_notes(service, session, 2, start=3)
    reader.join(10)
    assert not reader.is_alive() and reader.error is None
    assert reader.seqs == [2, 3, 4, 5]
    assert [e["text"] for e in reader.events] == ["n1", "n2", "n3", "n4"]


def test_last_event_id_or_after_whichever_is_larger(deck_session):
    service, session = deck_session
    post_notes(service, session, 4)
    for after, last_event_id, first in [(1, "3", 4), (3, "1", 4), (None, "2", 3)]:
        reader = StreamReader(stream_url(service, session, after), until=4, headers={"Last-Event-ID": last_event_id})
        reader.start()
        reader.join(10)
        assert reader.seqs == list(range(first, 5)), (after, last_event_id)


def test_bad_cursor_is_400(shared_decks_server):
    url = stream_url(shared_decks_server, shared_decks_server.session)
    for params, headers in [({"after": "abc"}, {}), ({"after": "1.5"}, {}), ({}, {"Last-Event-ID": "x"})]:
        response = requests.get(url, params=params, headers=headers, timeout=10)
        assert response.status_code == 400
        assert response.json()["error"].startswith(("after:", "Last-Event-ID:"))
    assert requests.get(f"{shared_decks_server.base_url}/api/sessions/nope/stream", timeout=10).status_code == 404


def test_no_gap_and_no_duplicate_while_events_flow_during_connects(deck_session):
    """Streams connect at random moments while 120 events are being posted; each
    must see exactly 1..120, whatever lands in the replay and what comes live."""
    service, session = deck_session
    total = 120
    readers = []

    def poster():
        with ThreadPoolExecutor(4) as pool:
            list(
                pool.map(
                    lambda n: post_event(
                        service.base_url, session["id"], {"type": "note", "slide": 0, "text": f"{n}"}
                    ).raise_for_status(),
                    range(total),
                )
            )

    posting = threading.Thread(target=poster)
    posting.start()
    while posting.is_alive() and len(readers) < 12:
        reader = StreamReader(stream_url(service, session, after=0), until=total)
        reader.start()
        reader.wait_open()
        readers.append(reader)
    posting.join(60)
    for reader in readers:
        reader.join(30)
        assert reader.error is None
        assert reader.seqs == list(range(1, total + 1))


def test_streams_on_several_workers_see_events_posted_to_any_worker(start_service, tmp_path):
    """With two workers, events appended by one reach streams held by the other
    (through the log), in order and without gap."""
    from tests.support.decks import copy_sample_deck

    data = tmp_path / "data"
    data.mkdir()
    body = copy_sample_deck(data)
    service = start_service("decks", data_dir=data, workers=2)
    requests.post(f"{service.base_url}/api/decks/import", json=body, timeout=10).raise_for_status()
    session = requests.post(f"{service.base_url}/api/sessions", json={"deck_id": "welcome"}, timeout=10).json()
    readers = [StreamReader(stream_url(service, session, after=0), until=40) for _ in range(8)]
    for reader in readers:
        reader.start()
        reader.wait_open()
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda n: post_event(
                    service.base_url, session["id"], {"type": "note", "slide": 0, "text": f"{n}"}
                ).raise_for_status(),
                range(40),
            )
        )
    for reader in readers:
        reader.join(30)
        assert reader.error is None and reader.seqs == list(range(1, 41))


def test_sigterm_with_open_streams_ends_them_and_exits_quickly(deck_session):
    service, session = deck_session
    readers = [StreamReader(stream_url(service, session, after=0)) for _ in range(20)]
    for reader in readers:
        reader.start()
        reader.wait_open()
    took = service.stop()
    assert took < GRACEFUL_TIMEOUT_S, f"stopping took {took:.1f} s with open streams"
    for reader in readers:
        reader.join(5)
        assert not reader.is_alive()
        assert reader.comment_lines[-1] == "closed: server is stopping"


@pytest.mark.slow
def test_keepalive_comment_every_25_seconds(shared_decks_server):
    """The real interval, through the real server: one comment, not before ~25 s.
    (Only the lower bound is checked: a loaded machine can make the comment late,
    never early.)"""
    reader = StreamReader(stream_url(shared_decks_server, shared_decks_server.session, after=10**6))
    started = time.monotonic()
    reader.start()
    reader.wait_open()
    deadline = started + 120
    while "keepalive" not in reader.comment_lines and time.monotonic() < deadline:
        time.sleep(0.2)  # polling the reader thread's progress
    took = time.monotonic() - started
    assert "keepalive" in reader.comment_lines
    assert took >= 24.5, took  # the 25 s interval
    # The reader thread ends when the module's service stops.


def test_a_gone_client_is_noticed_on_the_next_write(start_service, tmp_path):
    import socket

    from tests.support.decks import copy_sample_deck

    data = tmp_path / "data"
    data.mkdir()
    body = copy_sample_deck(data)
    log_path = tmp_path / "service.log"
    with open(log_path, "wb") as log:
        service = start_service("decks", data_dir=data, stderr=log)
    requests.post(f"{service.base_url}/api/decks/import", json=body, timeout=10).raise_for_status()
    session = requests.post(f"{service.base_url}/api/sessions", json={"deck_id": "welcome"}, timeout=10).json()

    client = socket.create_connection(("127.0.0.1", service.port), timeout=10)
    client.sendall(f"GET /api/sessions/{session['id']}/stream HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    received = b""
    while b": stream open" not in received:
        received += client.recv(4096)
    client.close()
    post_notes(service, session, 2)  # the next writes find the client gone
    deadline = time.monotonic() + 10
    while b"ended" not in log_path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the log file
    assert f"stream /api/sessions/{session['id']}/stream ended".encode() in log_path.read_bytes()
    assert b": client gone" in log_path.read_bytes()


def test_a_stream_opened_on_a_kept_alive_connection_while_stopping_is_closed(deck_session):
    """A stopping worker still serves kept-alive connections: a stream opened
    there must end at once instead of holding the stop until the time-out."""
    import signal

    service, session = deck_session
    with requests.Session() as http:
        http.get(f"{service.base_url}/healthz", timeout=10).raise_for_status()
        started = time.monotonic()
        service.process.send_signal(signal.SIGTERM)
        with http.get(stream_url(service, session, after=0), stream=True, timeout=10) as response:
            assert response.status_code == 200
            body = response.raw.read(1024, decode_content=True)
        assert b": closed: server is stopping" in body
    service.process.wait(20)
    assert time.monotonic() - started < GRACEFUL_TIMEOUT_S


def two_workers(start_service, tmp_path):
    """A 2-worker service with the sample deck and one session, its stderr in a file:
    (service, session, log path)."""
    from tests.support.decks import copy_sample_deck

    data = tmp_path / "data"
    data.mkdir()
    body = copy_sample_deck(data)
    log_path = tmp_path / "service.log"
    with open(log_path, "wb") as log:
        service = start_service("decks", data_dir=data, workers=2, stderr=log)
    requests.post(f"{service.base_url}/api/decks/import", json=body, timeout=10).raise_for_status()
    session = requests.post(f"{service.base_url}/api/sessions", json={"deck_id": "welcome"}, timeout=10).json()
    wait_for(lambda: len(service.worker_pids()) == 2, "both workers running")
    return service, session, log_path


def note_via(service, pid, session, text):
    return post_event_on(service, pid, session["id"], {"type": "note", "slide": 0, "text": text})["seq"]


def assert_every_stream_saw(by_worker, seqs):
    for pid, readers in by_worker.items():
        for reader in readers:
            reader.join(30)
            assert reader.error is None and reader.seqs == seqs, (pid, reader.seqs, reader.error)


def test_an_event_posted_through_one_worker_reaches_the_streams_of_the_other(start_service, tmp_path):
    """Streams held by each worker (told apart through /proc), posts through each in
    turn: every stream sees every event. Delivery across workers is inotify's (a feed
    that watches never polls), and the service never fell back to polling."""
    service, session, log_path = two_workers(start_service, tmp_path)
    by_worker = streams_on_every_worker(service, stream_url(service, session, after=0), until=6)
    first, second = sorted(by_worker)
    assert [note_via(service, pid, session, f"via {pid}") for pid in (first, second, first, first, second, second)] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    assert_every_stream_saw(by_worker, [1, 2, 3, 4, 5, 6])
    assert b"instead of at once" not in log_path.read_bytes()


def restored_log(path, last):
    path.write_text(
        "".join(
            json.dumps(
                {"seq": n, "ts": "2026-01-01T00:00:00.000Z", "type": "note", "slide": 0, "text": f"restored {n}"}
            )
            + "\n"
            for n in range(1, last + 1)
        )
    )
    return path


def test_streams_on_both_workers_follow_a_log_restored_while_running(start_service, tmp_path):
    """A restore renames a copy over the log, copies one over it, or puts back the
    whole session directory; streams on both workers get the restored events, then
    the ones posted through either worker, in order and without gap."""
    service, session, log_path = two_workers(start_service, tmp_path)
    session_dir = service.data_dir / "sessions" / session["id"]
    events = session_dir / "events.jsonl"
    by_worker = streams_on_every_worker(service, stream_url(service, session, after=0), until=13)
    first, second = sorted(by_worker)
    assert note_via(service, first, session, "before the restores") == 1

    os.replace(restored_log(tmp_path / "backup-5.jsonl", 5), events)  # a new inode at the path
    assert [note_via(service, second, session, "a"), note_via(service, first, session, "b")] == [6, 7]

    shutil.copyfile(restored_log(tmp_path / "backup-9.jsonl", 9), events)  # same inode, new content
    assert note_via(service, second, session, "c") == 10

    backup = tmp_path / "backup-session"
    shutil.copytree(session_dir, backup)
    restored_log(backup / "events.jsonl", 12)
    shutil.rmtree(session_dir)  # the whole directory put back
    os.rename(backup, session_dir)
    assert note_via(service, first, session, "d") == 13
    assert_every_stream_saw(by_worker, list(range(1, 14)))
    assert b"instead of at once" not in log_path.read_bytes()
