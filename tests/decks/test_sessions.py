"""Sessions and typed events through a deck service of the test's own under gunicorn: what
a write changes. The sessions' route logic in process is tests/unit/decks/test_sessions.py."""

import json
import os

import requests

from tests.support.decks import post_event


def test_create_list_and_get_session(deck_session):
    service, session = deck_session
    url = service.base_url
    assert set(session) == {"id", "deck_id", "title", "created_at", "link"}
    assert session["link"] == f"/review/{session['id']}" and session["title"] == "Welcome to deck review"
    assert post_event(url, session["id"], {"type": "note", "slide": 0, "text": "hi"}).status_code == 201
    titled = requests.post(f"{url}/api/sessions", json={"deck_id": "welcome", "title": "Second pass"}, timeout=10)
    assert titled.status_code == 201 and titled.json()["title"] == "Second pass"
    listed = {s["id"]: s for s in requests.get(f"{url}/api/sessions", timeout=10).json()}
    assert listed[session["id"]]["last_seq"] == 1 and listed[titled.json()["id"]]["last_seq"] == 0
    got = requests.get(f"{url}/api/sessions/{session['id']}", timeout=10).json()
    assert got == {**session, "last_seq": 1}


def test_missing_session_json_is_404_even_with_a_log(deck_session):
    service, session = deck_session
    url, sid = service.base_url, session["id"]
    post_event(url, sid, {"type": "note", "slide": 0, "text": "hi"})
    os.unlink(service.data_dir / "sessions" / sid / "session.json")
    for path in ("", "/events", "/stream"):
        response = requests.get(f"{url}/api/sessions/{sid}{path}", timeout=10)
        assert response.status_code == 404 and "does not exist" in response.json()["error"]
    assert post_event(url, sid, {"type": "note", "slide": 0, "text": "x"}).status_code == 404
    assert sid not in [s["id"] for s in requests.get(f"{url}/api/sessions", timeout=10).json()]


def test_every_event_type_is_stored_with_seq_and_timestamp(deck_session):
    service, session = deck_session
    url, sid = service.base_url, session["id"]
    events = [
        {"type": "note", "slide": 0, "text": "Typo in title", "author": "ana"},
        {"type": "task", "slide": 1, "text": "Redo the chart"},
        {"type": "task_done", "task_seq": 2},
        {"type": "verdict", "value": "changes_requested", "text": "almost"},
        {"type": "verdict", "slide": 3, "value": "approve"},
        {"type": "transcript", "text": "so this slide...", "speaker": "bo", "start": 1.5, "end": 3.0, "slide": 0},
    ]
    stored = []
    for n, event in enumerate(events, start=1):
        response = post_event(url, sid, event)
        assert response.status_code == 201, response.text
        body = response.json()
        assert body["seq"] == n and body["ts"].endswith("Z")
        assert {k: body[k] for k in event} == event
        stored.append(body)
    page = requests.get(f"{url}/api/sessions/{sid}/events", timeout=10).json()
    assert page == {"events": stored, "has_more": False, "next_after": 6}
    lines = (service.data_dir / "sessions" / sid / "events.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == stored


def test_paging_through_the_log(deck_session):
    service, session = deck_session
    url, sid = service.base_url, session["id"]
    for n in range(7):
        post_event(url, sid, {"type": "note", "slide": 0, "text": f"n{n}"}).raise_for_status()
    seen, after = [], 0
    while True:
        page = requests.get(f"{url}/api/sessions/{sid}/events", params={"after": after, "limit": 3}, timeout=10).json()
        seen += [e["seq"] for e in page["events"]]
        after = page["next_after"]
        if not page["has_more"]:
            break
    assert seen == list(range(1, 8))
    for params in ({"after": "x"}, {"after": "-1"}, {"limit": "0"}, {"limit": "1001"}, {"limit": "2.5"}):
        response = requests.get(f"{url}/api/sessions/{sid}/events", params=params, timeout=10)
        assert response.status_code == 400, params
        assert response.json()["error"].startswith(next(iter(params)))


def test_task_done_must_name_a_task(deck_session):
    service, session = deck_session
    url, sid = service.base_url, session["id"]
    post_event(url, sid, {"type": "note", "slide": 0, "text": "a note"}).raise_for_status()
    response = post_event(url, sid, {"type": "task_done", "task_seq": 1})
    assert response.status_code == 400 and "no task event has seq 1" in response.json()["error"]


def test_session_of_a_deleted_deck_refuses_slide_events(deck_session):
    import shutil

    service, session = deck_session
    shutil.rmtree(service.data_dir / "decks" / "welcome")
    response = post_event(service.base_url, session["id"], {"type": "note", "slide": 0, "text": "x"})
    assert response.status_code == 409 and "no longer exists" in response.json()["error"]
    assert post_event(service.base_url, session["id"], {"type": "verdict", "value": "reject"}).status_code == 201
