"""Deck import through a deck service of the test's own under gunicorn: the happy path,
the copies it makes and the inputs it refuses. The import's route logic in process is
tests/unit/decks/test_import.py."""

import json
import os

import requests

from tests.support.decks import tree


def post_import(url, body):
    return requests.post(f"{url}/api/decks/import", json=body, timeout=30)


def test_import_list_get_and_assets(decks_server):
    url, data = decks_server.base_url, decks_server.data_dir
    created = post_import(url, decks_server.import_body)
    assert created.status_code == 201, created.text
    summary = created.json()
    assert summary["slide_count"] == 4 and summary["title"] == "Welcome to deck review"
    assert summary["source"] == str(data / "sources/welcome/deck.md")
    assert summary["warnings"] == []

    listed = requests.get(f"{url}/api/decks", timeout=10).json()
    assert listed == [{k: summary[k] for k in ("id", "title", "slide_count", "source", "imported_at")}]

    deck = requests.get(f"{url}/api/decks/welcome", timeout=10).json()
    assert deck["source"] == summary["source"]
    assert [s["index"] for s in deck["slides"]] == [0, 1, 2, 3]
    assert deck["slides"][0]["notes"].startswith("Start a session")
    assert deck["slides"][1]["images"] == ["/api/decks/welcome/assets/images/chart.png"]

    asset = requests.get(url + deck["slides"][1]["images"][0], timeout=10)
    assert asset.status_code == 200
    assert asset.headers["Content-Type"] == "image/png"
    assert asset.content == (data / "sources/welcome/images/chart.png").read_bytes()
    svg = requests.get(f"{url}/api/decks/welcome/assets/images/loop.svg", timeout=10)
    assert svg.headers["Content-Type"].startswith("image/svg+xml")
    assert "sandbox" in svg.headers["Content-Security-Policy"]


def test_assets_are_full_copies_and_only_assets(decks_server):
    data = decks_server.data_dir
    source = data / "sources/welcome"
    (source / "secret.txt").write_text("not an asset")
    (source / ".hidden.png").write_bytes(b"x")
    os.symlink("/etc/hostname", source / "images/link.png")
    outside = data.parent / "outside"
    outside.mkdir()
    (outside / "leak.png").write_bytes(b"leak")
    os.symlink(outside, source / "linked-dir")
    assert post_import(decks_server.base_url, decks_server.import_body).status_code == 201

    assets = data / "decks/welcome/assets"
    copied = sorted(str(p.relative_to(assets)) for p in assets.rglob("*") if p.is_file())
    assert copied == ["images/chart.png", "images/loop.svg", "images/stamp.svg"]
    for rel in copied:
        copy, original = assets / rel, source / rel
        assert not copy.is_symlink()
        assert os.stat(copy).st_ino != os.stat(original).st_ino
        assert os.stat(copy).st_nlink == 1


def test_two_decks_never_share_asset_files(decks_server):
    url = decks_server.base_url
    assert post_import(url, decks_server.import_body).status_code == 201
    assert post_import(url, {**decks_server.import_body, "id": "second"}).status_code == 201
    first = decks_server.data_dir / "decks/welcome/assets/images/chart.png"
    second = decks_server.data_dir / "decks/second/assets/images/chart.png"
    assert os.stat(first).st_ino != os.stat(second).st_ino


def test_reimport_rebuilds_in_place_and_leaves_sessions_alone(decks_server):
    url, data = decks_server.base_url, decks_server.data_dir
    post_import(url, decks_server.import_body)
    session = requests.post(f"{url}/api/sessions", json={"deck_id": "welcome"}, timeout=10).json()
    requests.post(
        f"{url}/api/sessions/{session['id']}/events", json={"type": "note", "slide": 0, "text": "keep me"}, timeout=10
    ).raise_for_status()
    sessions_before = tree(data / "sessions")

    md = data / "sources/welcome/deck.md"
    md.write_text(md.read_text() + "\n---\n# Added slide\n")
    (data / "sources/welcome/images/stamp.svg").unlink()
    again = post_import(url, decks_server.import_body)
    assert again.status_code == 200
    assert again.json()["slide_count"] == 5
    assert again.json()["warnings"] == ["slide 4: image 'images/stamp.svg' is not among the copied assets"]
    assert not (data / "decks/welcome/assets/images/stamp.svg").exists()
    assert sorted(os.listdir(data / "decks")) == [".locks", "welcome"]  # no build left behind
    assert tree(data / "sessions") == sessions_before


def test_symlink_escaping_data_dir_and_bad_sources_are_rejected(decks_server):
    data = decks_server.data_dir
    outside = data.parent / "elsewhere"
    outside.mkdir()
    (outside / "deck.md").write_text("# outside")
    os.symlink(outside / "deck.md", data / "sources/link.md")
    (data / "sources/latin1.md").write_bytes("caf\xe9".encode("latin-1"))
    (data / "sources/bad-front.md").write_text("---\ntitle: [unclosed\n---\n# x")
    before = tree(data)
    base = {"id": "ok", "copy_from": "sources/welcome"}
    for md_path, message in [
        ("sources/link.md", "inside the service's data directory"),
        ("sources/latin1.md", "not valid UTF-8"),
        ("sources/bad-front.md", "front matter is not valid YAML"),
    ]:
        response = post_import(decks_server.base_url, {**base, "md_path": md_path})
        assert response.status_code == 400
        assert message in response.json()["error"]
    assert tree(data) == before


def test_non_json_and_wrong_bodies(decks_server):
    url = f"{decks_server.base_url}/api/decks/import"
    assert requests.post(url, data="id=x", timeout=10).status_code == 415
    bad = requests.post(url, data="{not json", headers={"Content-Type": "application/json"}, timeout=10)
    assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]
    listed = requests.post(url, json=["a"], timeout=10)
    assert listed.status_code == 400 and listed.json() == {"error": "the body must be a JSON object"}
    huge = requests.post(
        url, data=json.dumps({"id": "x" * (2 * 1024 * 1024)}), headers={"Content-Type": "application/json"}, timeout=30
    )
    assert huge.status_code == 413


def test_unknown_deck_and_asset_traversal_are_404(decks_server):
    url = decks_server.base_url
    post_import(url, decks_server.import_body)
    assert requests.get(f"{url}/api/decks/nope", timeout=10).status_code == 404
    for path in [
        "/api/decks/welcome/assets/..%2Fdeck.json",
        "/api/decks/welcome/assets/%2e%2e/deck.json",
        "/api/decks/..%2F..%2Fsessions/assets/x",
        "/api/decks/welcome/assets/images/nope.png",
    ]:
        response = requests.get(url + path, timeout=10)
        assert response.status_code == 404, path
        assert "error" in response.json()
