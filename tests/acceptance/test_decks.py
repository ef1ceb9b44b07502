"""Deck review service, checked through its public address (nginx in front)."""

import threading
import time
import uuid

import pytest

from app.common.sse_client import iter_records
from tests.support.decks import data_url, png_bytes


@pytest.fixture(scope="module")
def session(decks):
    listed = decks.get("/api/decks")
    assert listed.status_code == 200, listed.text
    assert listed.json(), "the target has no deck: import one first (the playbook seeds the sample deck)"
    deck = listed.json()[0]
    created = decks.post("/api/sessions", json={"deck_id": deck["id"], "title": f"acceptance {uuid.uuid4().hex[:8]}"})
    assert created.status_code == 201, created.text
    return created.json()


def test_health_and_pages(decks, session):
    assert decks.get("/healthz").json() == {"status": "ok"}
    home = decks.get("/")
    assert home.status_code == 200 and home.headers["Content-Type"].startswith("text/html")
    review = decks.get(session["link"])
    assert review.status_code == 200 and session["id"] in review.text


def test_errors_have_the_service_body(decks):
    missing = decks.get("/api/sessions/does-not-exist")
    assert missing.status_code == 404 and "error" in missing.json()
    bad = decks.get("/api/sessions/does-not-exist/stream", params={"after": "x"})
    assert bad.status_code in (400, 404) and "error" in bad.json()


def test_event_reaches_a_stream_through_the_proxy_at_once(decks, session):
    sid = session["id"]
    received = []
    opened = threading.Event()

    def read():
        with decks.get(f"/api/sessions/{sid}/stream", stream=True, timeout=(10, 30)) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            opened.set()
            for record in iter_records(response):
                received.append((time.monotonic(), record.json()))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert opened.wait(15)
    sent = time.monotonic()
    posted = decks.post(f"/api/sessions/{sid}/events", json={"type": "note", "slide": 0, "text": "acceptance"})
    assert posted.status_code == 201, posted.text
    reader.join(15)
    assert received, "the event never arrived through the proxy"
    arrived, event = received[0]
    assert event["seq"] == posted.json()["seq"]
    assert arrived - sent < 2.0, "the proxy held the event back (buffering)"


def test_scribble_round_trip(decks, session):
    png = png_bytes(8, 8)
    posted = decks.post(f"/api/sessions/{session['id']}/scribble", json={"image": data_url(png), "slide": 0})
    assert posted.status_code == 201, posted.text
    served = decks.get(f"/api/sessions/{session['id']}/scribbles/{posted.json()['file']}")
    assert served.status_code == 200 and served.content == png


def test_body_over_64_mb_is_refused_by_the_proxy(decks, session):
    response = decks.post(
        f"/api/sessions/{session['id']}/scribble",
        data=b"x" * (65 * 1024 * 1024),
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert response.status_code == 413
