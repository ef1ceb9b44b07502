"""Scribble overlays: validated PNG data URLs, stored atomically, served back."""

import base64

import pytest
import requests

from tests.support.decks import data_url, png_bytes, tree


def post_scribble(service, sid, body, timeout=30):
    return requests.post(f"{service.base_url}/api/sessions/{sid}/scribble", json=body, timeout=timeout)


def _bad_crc(png):
    return png[:29] + bytes([png[29] ^ 0xFF]) + png[30:]


BAD_SCRIBBLES = [
    (
        {"image": "data:image/jpeg;base64," + base64.b64encode(png_bytes()).decode(), "slide": 0},
        400,
        "image: must be a data URL",
    ),
    ({"image": data_url(png_bytes())[:-3] + "!!!", "slide": 0}, 400, "image: is not valid base64"),
    ({"image": data_url(png_bytes()) + "=", "slide": 0}, 400, "image: is not valid base64"),
    (
        {"image": "data:image/png;base64," + base64.b64encode(b"GIF89a not a png").decode(), "slide": 0},
        400,
        "image: is not a PNG",
    ),
    ({"image": data_url(png_bytes()[:20]), "slide": 0}, 400, "image: is a truncated PNG"),
    ({"image": data_url(_bad_crc(png_bytes())), "slide": 0}, 400, "image: has no valid PNG header"),
    ({"image": data_url(png_bytes(0, 5)), "slide": 0}, 400, "image: must be between 1 and"),
    ({"image": data_url(png_bytes()), "slide": 9}, 400, "slide:"),
    ({"image": data_url(png_bytes())}, 400, "slide:"),
    ({"image": 42, "slide": 0}, 400, "image:"),
    ({"slide": 0}, 400, "image:"),
]


@pytest.mark.parametrize("body,status,message", BAD_SCRIBBLES)
def test_bad_scribbles_are_rejected_and_change_nothing(shared_decks_server, body, status, message):
    before = tree(shared_decks_server.data_dir)
    response = post_scribble(shared_decks_server, shared_decks_server.session["id"], body)
    assert response.status_code == status, response.text
    assert response.json()["error"].startswith(message), response.json()
    assert tree(shared_decks_server.data_dir) == before


def test_oversized_scribbles(shared_decks_server):
    """Past the decoded bound: 413 from the app; past the body limit: 413 too."""
    sid = shared_decks_server.session["id"]
    before = tree(shared_decks_server.data_dir)
    big = "data:image/png;base64," + "A" * (56 * 1024 * 1024)  # decodes to 42 MiB > 40 MiB
    response = post_scribble(shared_decks_server, sid, {"image": big, "slide": 0}, timeout=120)
    assert response.status_code == 413 and response.json()["error"].startswith("image: decodes to more than")
    over_limit = "data:image/png;base64," + "A" * (65 * 1024 * 1024)
    response = post_scribble(shared_decks_server, sid, {"image": over_limit, "slide": 0}, timeout=120)
    assert response.status_code == 413
    assert tree(shared_decks_server.data_dir) == before


def test_scribble_names_cannot_traverse(shared_decks_server):
    url, sid = shared_decks_server.base_url, shared_decks_server.session["id"]
    for name in ["..%2Fsession.json", "%2e%2e", "../events.jsonl", "x.png", "A" * 32 + ".png", "0" * 32 + ".PNG"]:
        response = requests.get(f"{url}/api/sessions/{sid}/scribbles/{name}", timeout=10)
        assert response.status_code == 404, name
    assert requests.get(f"{url}/api/sessions/{sid}/scribbles/{'0' * 32}.png", timeout=10).status_code == 404


def test_scribble_for_a_missing_session_is_404(shared_decks_server):
    response = post_scribble(shared_decks_server, "nope", {"image": data_url(png_bytes()), "slide": 0})
    assert response.status_code == 404
