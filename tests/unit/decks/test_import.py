"""Deck import through the service in process: the happy path and every bad input. What
needs a deck service of the test's own under gunicorn is tests/decks/test_import.py."""

import pytest
import requests

from tests.support.decks import tree


def post_import(url, body):
    return requests.post(f"{url}/api/decks/import", json=body, timeout=30)


BAD_IMPORTS = [
    ({"md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome"}, "id"),
    ({"id": "../evil", "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome"}, "id"),
    ({"id": "a/b", "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome"}, "id"),
    ({"id": "x" * 65, "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome"}, "id"),
    ({"id": 5, "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome"}, "id"),
    ({"id": "ok", "copy_from": "sources/welcome"}, "md_path"),
    ({"id": "ok", "md_path": ["x.md"], "copy_from": "sources/welcome"}, "md_path"),
    ({"id": "ok", "md_path": "../../../../etc/passwd.md", "copy_from": "sources/welcome"}, "md_path"),
    ({"id": "ok", "md_path": "/etc/os-release.md", "copy_from": "sources/welcome"}, "md_path"),
    ({"id": "ok", "md_path": "sources/welcome/missing.md", "copy_from": "sources/welcome"}, "md_path"),
    ({"id": "ok", "md_path": "sources/welcome/images/chart.png", "copy_from": "sources/welcome"}, "md_path"),
    ({"id": "ok", "md_path": "sources/welcome", "copy_from": "sources/welcome"}, "md_path"),
    ({"id": "ok", "md_path": "sources/welcome/deck.md\u0000.md", "copy_from": "sources/welcome"}, "md_path"),
    ({"id": "ok", "md_path": "sources/welcome/deck.md"}, "copy_from"),
    ({"id": "ok", "md_path": "sources/welcome/deck.md", "copy_from": "/etc"}, "copy_from"),
    ({"id": "ok", "md_path": "sources/welcome/deck.md", "copy_from": "sources/../.."}, "copy_from"),
    ({"id": "ok", "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome/deck.md"}, "copy_from"),
    ({"id": "ok", "md_path": "sources/welcome/deck.md", "copy_from": "sessions"}, "copy_from"),
    ({"id": "ok", "md_path": "sources/welcome/deck.md", "copy_from": "."}, "copy_from"),
    ({"id": "ok", "md_path": "decks/welcome/deck.md", "copy_from": "sources/welcome"}, "md_path"),
    ({"id": "ok", "md_path": "sources/welcome/deck.md", "copy_from": "sources/welcome", "x": 1}, "x"),
]


@pytest.mark.parametrize("body,field", BAD_IMPORTS)
def test_bad_import_is_400_naming_the_field_and_changes_nothing(shared_decks_server, body, field):
    before = tree(shared_decks_server.data_dir)
    response = post_import(shared_decks_server.base_url, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(f"{field}:"), response.json()
    assert tree(shared_decks_server.data_dir) == before
