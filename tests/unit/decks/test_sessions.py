"""Sessions and typed events through the service in process. What needs a deck service
of the test's own under gunicorn is tests/decks/test_sessions.py."""

import pytest
import requests

from tests.support.decks import post_event, tree

BAD_EVENTS = [
    ({"slide": 0, "text": "no type"}, "type"),
    ({"type": "shout", "slide": 0, "text": "x"}, "type"),
    ({"type": "scribble", "slide": 0, "file": "x.png"}, "type"),  # only the scribble route makes those
    ({"type": "note", "text": "no slide"}, "slide"),
    ({"type": "note", "slide": "0", "text": "x"}, "slide"),
    ({"type": "note", "slide": True, "text": "x"}, "slide"),
    ({"type": "note", "slide": 1.5, "text": "x"}, "slide"),
    ({"type": "note", "slide": -1, "text": "x"}, "slide"),
    ({"type": "note", "slide": 4, "text": "x"}, "slide"),
    ({"type": "note", "slide": 0, "text": ""}, "text"),
    ({"type": "note", "slide": 0, "text": "x" * 5001}, "text"),
    ({"type": "note", "slide": 0, "text": 5}, "text"),
    ({"type": "note", "slide": 0, "text": "x", "seq": 99}, "seq"),
    ({"type": "note", "slide": 0, "text": "x", "author": "a" * 81}, "author"),
    ({"type": "task_done", "task_seq": 999}, "task_seq"),
    ({"type": "task_done", "task_seq": 0}, "task_seq"),
    ({"type": "verdict", "value": "maybe"}, "value"),
    ({"type": "transcript", "text": "x", "start": 5, "end": 1}, "end"),
    ({"type": "transcript", "text": "x", "start": -1}, "start"),
]


@pytest.mark.parametrize("event,field", BAD_EVENTS)
def test_bad_event_is_400_naming_the_field_and_changes_nothing(shared_decks_server, event, field):
    service, sid = shared_decks_server, shared_decks_server.session["id"]
    before = tree(service.data_dir)
    response = post_event(service.base_url, sid, event)
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(f"{field}:"), response.json()
    assert tree(service.data_dir) == before


def test_bad_session_requests(shared_decks_server):
    url = shared_decks_server.base_url
    before = tree(shared_decks_server.data_dir)
    for body, status in [
        ({"deck_id": "nope"}, 404),
        ({"deck_id": "../x"}, 400),
        ({}, 400),
        ({"deck_id": "welcome", "title": 5}, 400),
        ({"deck_id": "welcome", "title": "t" * 201}, 400),
    ]:
        response = requests.post(f"{url}/api/sessions", json=body, timeout=10)
        assert response.status_code == status, (body, response.text)
        assert "error" in response.json()
    for sid in ("nope", "..", "%2e%2e%2fdecks", "a" * 65):
        assert requests.get(f"{url}/api/sessions/{sid}", timeout=10).status_code == 404
        assert post_event(url, sid, {"type": "note", "slide": 0, "text": "x"}).status_code == 404
    events_url = f"{url}/api/sessions/{shared_decks_server.session['id']}/events"
    assert requests.post(events_url, data="text", timeout=10).status_code == 415
    assert (
        requests.post(
            events_url, data=b"\xff\xfe", headers={"Content-Type": "application/json"}, timeout=10
        ).status_code
        == 400
    )
    too_big = requests.post(
        events_url,
        data=b'{"text": "' + b"x" * (1024 * 1024) + b'"}',
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert too_big.status_code == 413 and too_big.json() == {"error": "the request body is too large"}
    assert tree(shared_decks_server.data_dir) == before


def test_chunked_body_over_the_limit_is_413_not_cut(shared_decks_server):
    """Without a declared length the body is still refused past the limit, rather
    than cut at it and parsed."""
    events_url = f"{shared_decks_server.base_url}/api/sessions/{shared_decks_server.session['id']}/events"
    body = b'{"type": "note", "slide": 0, "text": "' + b"x" * (1024 * 1024) + b'"}'
    response = requests.post(
        events_url, data=iter([body[:1000], body[1000:]]), headers={"Content-Type": "application/json"}, timeout=30
    )
    assert response.status_code == 413
