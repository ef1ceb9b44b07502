"""The event log is the irreplaceable data: concurrency, torn lines, restores
while running, and a worker killed mid-append."""

import json
import os
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

import requests

from tests.support.decks import copy_sample_deck, post_event, read_log


def session_on(start_service, tmp_path, workers=1):
    data = tmp_path / "data"
    data.mkdir()
    body = copy_sample_deck(data)
    service = start_service("decks", data_dir=data, workers=workers)
    requests.post(f"{service.base_url}/api/decks/import", json=body, timeout=10).raise_for_status()
    session = requests.post(f"{service.base_url}/api/sessions", json={"deck_id": "welcome"}, timeout=10).json()
    return service, session["id"]


def log_events(service, sid):
    """Events of the complete, parseable lines of the log, and the count of others."""
    events, others = [], 0
    for line in read_log(service.data_dir, sid).split(b"\n")[:-1]:
        try:
            events.append(json.loads(line))
        except ValueError:
            others += 1
    return events, others


def note(service, sid, text):
    return post_event(service.base_url, sid, {"type": "note", "slide": 0, "text": text})


def test_200_concurrent_posters_on_two_workers_get_distinct_gapless_seqs(start_service, tmp_path):
    service, sid = session_on(start_service, tmp_path, workers=2)
    barrier = threading.Barrier(200)

    def post(n):
        barrier.wait()
        response = note(service, sid, f"poster {n}")
        assert response.status_code == 201, response.text
        return response.json()

    with ThreadPoolExecutor(200) as pool:
        stored = list(pool.map(post, range(200)))
    assert sorted(e["seq"] for e in stored) == list(range(1, 201))
    events, others = log_events(service, sid)
    assert others == 0 and [e["seq"] for e in events] == list(range(1, 201))
    assert sorted(events, key=lambda e: e["text"]) == sorted(stored, key=lambda e: e["text"])


def test_torn_trailing_line_is_skipped_and_not_glued_onto(start_service, tmp_path):
    service, sid = session_on(start_service, tmp_path)
    for n in range(3):
        note(service, sid, f"n{n}").raise_for_status()
    path = service.data_dir / "sessions" / sid / "events.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"seq":4,"ts":"2026-01-01T00:00:00Z","type":"note","sl')  # a copy taken mid-write
    page = requests.get(f"{service.base_url}/api/sessions/{sid}/events", timeout=10).json()
    assert [e["seq"] for e in page["events"]] == [1, 2, 3]
    assert requests.get(f"{service.base_url}/api/sessions/{sid}", timeout=10).json()["last_seq"] == 3
    after = note(service, sid, "after the tear")
    assert after.status_code == 201 and after.json()["seq"] == 4
    events, others = log_events(service, sid)
    assert [e["seq"] for e in events] == [1, 2, 3, 4] and others == 1
    assert read_log(service.data_dir, sid).endswith(b'"text":"after the tear"}\n')


def test_restoring_a_newer_copy_while_running_never_reuses_a_seq(start_service, tmp_path):
    """The spec's known weakness: a log restored with a higher seq than the cached
    one. Both restore styles: copied over the file, and renamed over it."""
    service, sid = session_on(start_service, tmp_path)
    path = service.data_dir / "sessions" / sid / "events.jsonl"
    note(service, sid, "first").raise_for_status()  # the process now caches seq 1

    def newer_copy(last):
        lines = [
            json.dumps(
                {"seq": n, "ts": "2026-01-01T00:00:00.000Z", "type": "note", "slide": 0, "text": f"restored {n}"}
            )
            + "\n"
            for n in range(1, last + 1)
        ]
        copy = tmp_path / "backup.jsonl"
        copy.write_text("".join(lines))
        return copy

    shutil.copyfile(newer_copy(6), path)  # same inode, new content
    assert note(service, sid, "after copy").json()["seq"] == 7
    os.replace(newer_copy(9), path)  # a new inode at the path
    assert note(service, sid, "after rename").json()["seq"] == 10
    events, _ = log_events(service, sid)
    assert [e["seq"] for e in events] == list(range(1, 11))


def test_restoring_an_older_copy_while_running_leaves_a_gap_not_a_reuse(start_service, tmp_path):
    service, sid = session_on(start_service, tmp_path)
    path = service.data_dir / "sessions" / sid / "events.jsonl"
    for n in range(3):
        note(service, sid, f"n{n}").raise_for_status()
    backup = read_log(service.data_dir, sid)
    for n in range(3, 6):
        note(service, sid, f"n{n}").raise_for_status()
    path.write_bytes(backup)  # roll back from seq 6 to seq 3
    assert note(service, sid, "after rollback").json()["seq"] == 7
    events, _ = log_events(service, sid)
    assert [e["seq"] for e in events] == [1, 2, 3, 7]


def test_worker_killed_during_appends_loses_nothing_acknowledged(start_service, tmp_path):
    service, sid = session_on(start_service, tmp_path)
    acknowledged, failures = [], []
    stop = threading.Event()

    def poster(n):
        with requests.Session() as http:
            count = 0
            while not stop.is_set() and count < 400:
                count += 1
                try:
                    response = http.post(
                        f"{service.base_url}/api/sessions/{sid}/events",
                        timeout=10,
                        json={"type": "note", "slide": 0, "text": f"p{n}-{count}"},
                    )
                except requests.RequestException as exc:
                    failures.append(exc)
                    continue
                if response.status_code == 201:
                    acknowledged.append(response.json())

    threads = [threading.Thread(target=poster, args=(n,)) for n in range(10)]
    for thread in threads:
        thread.start()
    while len(acknowledged) < 100:
        threading.Event().wait(0.01)  # waiting for progress, not for a race to settle
    (worker,) = service.worker_pids()
    os.kill(worker, signal.SIGKILL)
    # gunicorn boots a new worker; wait until appends succeed again, then stop.
    resumed_at = len(acknowledged)
    while len(acknowledged) < resumed_at + 100 and any(t.is_alive() for t in threads):
        threading.Event().wait(0.01)
    stop.set()
    for thread in threads:
        thread.join(30)
    assert service.worker_pids() and service.worker_pids() != [worker]

    events, others = log_events(service, sid)
    assert others <= 1  # at most the in-flight line was torn
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs)), "seqs must strictly increase"
    by_seq = {e["seq"]: e for e in events}
    for stored in acknowledged:
        assert by_seq[stored["seq"]] == stored
    assert len(events) - len(acknowledged) <= 10  # at most one in-flight batch per poster
