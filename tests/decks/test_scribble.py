"""A scribble stored, logged and served by a deck service of the test's own under gunicorn.
The overlays' validation in process is tests/unit/decks/test_scribble.py."""

import os

import requests

from tests.support.decks import data_url, png_bytes


def post_scribble(service, sid, body, timeout=30):
    return requests.post(f"{service.base_url}/api/sessions/{sid}/scribble", json=body, timeout=timeout)


def test_scribble_is_stored_logged_and_served(deck_session):
    service, session = deck_session
    png = png_bytes(5, 7)
    response = post_scribble(service, session["id"], {"image": data_url(png), "slide": 2, "author": "ana"})
    assert response.status_code == 201, response.text
    event = response.json()
    assert event["seq"] == 1 and event["type"] == "scribble" and event["slide"] == 2
    assert (event["width"], event["height"], event["bytes"], event["author"]) == (5, 7, len(png), "ana")
    stored = service.data_dir / "sessions" / session["id"] / "scribbles" / event["file"]
    assert stored.read_bytes() == png
    assert os.listdir(stored.parent) == [event["file"]]  # no temporary file left
    served = requests.get(f"{service.base_url}/api/sessions/{session['id']}/scribbles/{event['file']}", timeout=10)
    assert served.status_code == 200 and served.content == png
    assert served.headers["Content-Type"] == "image/png"
    assert served.headers["X-Content-Type-Options"] == "nosniff"
