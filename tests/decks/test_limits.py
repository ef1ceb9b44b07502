"""Abuse limits of the deck service, through the running gunicorn worker: reading a page
of a 60 MB log costs the worker what the page holds (counted in bytes the worker read,
/proc/<pid>/io's rchar, never timed), and a session's log stops at its cap with a 507
that stores nothing."""

import json
import os

import pytest
import requests

from app import create_app
from app.common.config import ConfigError
from tests.support.decks import copy_sample_deck, data_url, png_bytes, post_event, tree

BIG_LOG_BYTES = 60 * 1024 * 1024
ONE_PAGE_BUDGET = 512 * 1024  # the page, one index step and the small files of a request


def worker_rchar(pid):
    """Bytes the process has read through read()/pread() so far (all its threads)."""
    with open(f"/proc/{pid}/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def started(start_service, tmp_path, env=None):
    data = tmp_path / "data"
    data.mkdir()
    body = copy_sample_deck(data)
    service = start_service("decks", data_dir=data, env=env)
    requests.post(f"{service.base_url}/api/decks/import", json=body, timeout=10).raise_for_status()
    return service


def new_session(service):
    response = requests.post(f"{service.base_url}/api/sessions", json={"deck_id": "welcome"}, timeout=10)
    response.raise_for_status()
    return response.json()["id"]


def test_a_page_costs_the_same_on_a_60_mb_log_as_on_a_small_one(start_service, tmp_path):
    service = started(start_service, tmp_path)
    url = service.base_url
    small, big = new_session(service), new_session(service)
    post_event(url, small, {"type": "note", "slide": 0, "text": "one"}).raise_for_status()

    def line(seq):
        event = {"seq": seq, "ts": "2026-01-01T00:00:00.000Z", "type": "note", "slide": 0, "text": "x" * 1000}
        return json.dumps(event).encode() + b"\n"

    count = BIG_LOG_BYTES // len(line(1))
    with open(service.data_dir / "sessions" / big / "events.jsonl", "wb") as f:  # as a long review leaves it
        f.writelines(line(seq) for seq in range(1, count + 1))
    (pid,) = service.worker_pids()

    def cost(path):
        before = worker_rchar(pid)
        response = requests.get(url + path, timeout=60)
        assert response.status_code == 200, response.text
        return response.json(), worker_rchar(pid) - before

    cost(f"/api/sessions/{big}/events?after=0&limit=1")  # the first read builds the index
    page, small_cost = cost(f"/api/sessions/{small}/events?after=0&limit=1")
    assert [e["seq"] for e in page["events"]] == [1]
    for after in (0, count // 2, count - 2):
        page, big_cost = cost(f"/api/sessions/{big}/events?after={after}&limit=1")
        assert [e["seq"] for e in page["events"]] == [after + 1] and page["has_more"]
        assert big_cost - small_cost < ONE_PAGE_BUDGET, f"after={after}: {big_cost} bytes read"

    # The stream's replay reads from the same place: a reconnect near the end is cheap.
    before = worker_rchar(pid)
    with requests.get(f"{url}/api/sessions/{big}/stream?after={count - 3}", stream=True, timeout=(5, 30)) as response:
        seqs = []
        for raw in response.iter_lines():
            if raw.startswith(b"data:"):
                seqs.append(json.loads(raw[5:])["seq"])
                if len(seqs) == 3:
                    break
    assert seqs == [count - 2, count - 1, count]
    assert worker_rchar(pid) - before < ONE_PAGE_BUDGET


def test_a_full_log_answers_507_and_stores_nothing(start_service, tmp_path):
    limit = 8192
    service = started(start_service, tmp_path, env={"DECKS_MAX_LOG_BYTES": str(limit)})
    url, sid = service.base_url, new_session(service)
    log_path = service.data_dir / "sessions" / sid / "events.jsonl"
    stored = 0
    while True:
        response = post_event(url, sid, {"type": "note", "slide": 0, "text": "n" * 1000})
        if response.status_code != 201:
            break
        stored += 1
        assert stored < 10, "the cap never refused"
    assert response.status_code == 507
    assert response.headers["Content-Type"] == "application/json"
    assert set(response.json()) == {"error"} and str(limit) in response.json()["error"]
    assert os.path.getsize(log_path) <= limit

    # What still fits is taken, with the next seq: a refusal takes none.
    small = post_event(url, sid, {"type": "note", "slide": 0, "text": "s"})
    assert small.status_code == 201 and small.json()["seq"] == stored + 1
    while small.status_code == 201:
        stored = small.json()["seq"]
        small = post_event(url, sid, {"type": "note", "slide": 0, "text": "s"})
    assert small.status_code == 507 and os.path.getsize(log_path) <= limit

    before = tree(service.data_dir)
    again = post_event(url, sid, {"type": "note", "slide": 0, "text": "s"})
    scribble = requests.post(
        f"{url}/api/sessions/{sid}/scribble", timeout=10, json={"slide": 0, "image": data_url(png_bytes())}
    )
    assert again.status_code == 507 and scribble.status_code == 507, scribble.text
    assert tree(service.data_dir) == before  # no event, no orphan image

    # Reading and other sessions go on.
    page = requests.get(f"{url}/api/sessions/{sid}/events?limit=1000", timeout=10).json()
    assert [e["seq"] for e in page["events"]] == list(range(1, stored + 1))
    other = new_session(service)
    assert post_event(url, other, {"type": "note", "slide": 0, "text": "fresh"}).status_code == 201


def test_a_bad_cap_setting_stops_the_start(monkeypatch, tmp_path):
    monkeypatch.setenv("DECKS_MAX_LOG_BYTES", "lots")
    with pytest.raises(ConfigError, match="DECKS_MAX_LOG_BYTES"):
        create_app("decks", {"DATA_DIR": str(tmp_path)})
    monkeypatch.setenv("DECKS_MAX_LOG_BYTES", "100")  # below one event's room
    with pytest.raises(ConfigError, match="DECKS_MAX_LOG_BYTES"):
        create_app("decks", {"DATA_DIR": str(tmp_path)})


def test_a_replay_longer_than_a_page_arrives_whole_then_live_events(start_service, tmp_path):
    """The stream's replay is read a page at a time (sessions.REPLAY_PAGE): every event
    past the cursor arrives once, in order, and then the live ones."""
    service = started(start_service, tmp_path)
    url, sid = service.base_url, new_session(service)
    count = 1234
    with open(service.data_dir / "sessions" / sid / "events.jsonl", "wb") as f:
        for seq in range(1, count + 1):
            f.write(
                json.dumps(
                    {"seq": seq, "ts": "2026-01-01T00:00:00.000Z", "type": "note", "slide": 0, "text": f"n{seq}"}
                ).encode()
                + b"\n"
            )
    seqs = []
    with requests.get(f"{url}/api/sessions/{sid}/stream?after=7", stream=True, timeout=(5, 30)) as response:
        for raw in response.iter_lines():
            if not raw.startswith(b"data:"):
                continue
            seqs.append(json.loads(raw[5:])["seq"])
            if seqs[-1] == count:
                posted = post_event(url, sid, {"type": "note", "slide": 0, "text": "live"})
                assert posted.status_code == 201
            if seqs[-1] == count + 1:
                break
    assert seqs == list(range(8, count + 2))
